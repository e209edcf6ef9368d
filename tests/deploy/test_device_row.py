"""The dashboard row "Device: busy, idle and memory" against a real Prometheus scraping a real run
on the fake accelerator of the tests (device events and allocator peaks on every step, host
RSS). Every query of the row returns data; the bound and peak panels show what was planted.
(The CPU-only e2e, test_e2e.py, leaves this row's panels to this test.)"""

from __future__ import annotations

import math
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest
from deploy_support import REPO, RULE_FILES, Child, load_dashboard, prometheus_queries
from prometheus_server import PrometheusServer, require_binary

sys.path.insert(0, str(REPO / "deploy" / "grafana"))
from rows_device import PANEL_TITLES  # noqa: E402

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(90)]

CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    import otel_train
    from otel_train.recording import device, device_probes
    from fake_accelerator import FakeAccelerator, FakeAllocator

    stop_file, status_dir, profile = sys.argv[1], sys.argv[2], sys.argv[3]
    deadline = time.monotonic() + 60.0
    dev, mem = FakeAccelerator(), FakeAllocator(block_bytes=2**20)
    timing, probes = device.resolve_device_timing, device_probes.resolve_device_probes
    otel_train.pipeline.assembly.resolve_device_timing = (
        lambda m: timing(m, accelerator=dev, event_class=dev.Event))
    otel_train.pipeline.assembly.resolve_device_probes = (
        lambda *a, **k: probes(*a, memory=mem.peaks(), **k))

    def batches():
        i = 0
        while not os.path.exists(stop_file) and time.monotonic() < deadline:
            time.sleep(0.03)  # the loader: the device idles for it
            yield i
            i += 1

    with otel_train.start_run(prometheus_port=0, console=False, exporter="none",
                              status_dir=status_dir, device_sync="events",
                              device_events_every_steps=1) as run:
        print(json.dumps({"prometheus_url": run.prometheus_url}), flush=True)
        for step in run.steps(batches(), loader="train"):
            with step.phase("forward"):
                mem.allocate(256 * 2**20)
                dev.launch(0.005)
            with step.phase("backward"):
                dev.launch(0.005)
                mem.free(256 * 2**20)
            with step.phase("optimizer"):
                dev.item()
    """
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_binary("prometheus")
    workdir = tmp_path_factory.mktemp("device-row")
    (workdir / "child.py").write_text(CHILD)
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join((str(REPO), str(REPO / "tests")))
    env["OTEL_SDK_DISABLED"] = "false"
    children = {name: Child(name, workdir, env, [name]) for name in ("fake",)}
    try:
        for child in children.values():
            child.wait_url(timeout=60)
        with PrometheusServer([c.hostport for c in children.values()], rule_files=RULE_FILES,
                              scrape_interval="1s") as prom:
            prom.wait_for("count(increase(otel_train_steps_total[1m]) > 0) == 1", timeout=40,
                          interval=0.5)
            yield {"prom": prom}
    finally:
        for child in children.values():
            child.stop()


def test_every_query_of_the_device_row_returns_data(stack: dict[str, Any]) -> None:
    prom = stack["prom"]
    queries = {f"{title} [{ref}]": q for title, ref, q in prometheus_queries(load_dashboard())
               if title in PANEL_TITLES}
    assert len(queries) == 5
    pending = dict(queries)
    deadline = time.monotonic() + 30
    while pending and time.monotonic() < deadline:
        for key, promql in list(pending.items()):
            if any(math.isfinite(float(s["value"][1])) for s in prom.query(promql)):
                del pending[key]
        if pending:
            time.sleep(1)
    assert not pending, "device row queries without data:\n" + "\n".join(
        f"- {k}: {v}" for k, v in pending.items())


def test_the_fake_run_is_input_bound_and_its_forward_sets_the_memory_peak(
        stack: dict[str, Any]) -> None:
    prom = stack["prom"]
    bounds = {s["metric"]["bound"] for s in prom.query(
        'sum by (bound) (otel_train_steps_by_bound_total{rank="0"})')}
    assert "input" in bounds
    peaks = {s["metric"]["phase"]: float(s["value"][1]) for s in prom.query(
        'max by (phase) (otel_train_phase_memory_peak_bytes{pool="allocated"})')}
    assert peaks["forward"] == 256 * 2**20
