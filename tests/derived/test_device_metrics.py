"""Device busy/idle, steps by bound and peak memory as Prometheus metrics on a real /metrics
scrape (through the exporter process's chain and the copy this process serves), and the
console's bound and out-of-memory lines."""

from __future__ import annotations

import io
import time
import urllib.request

import pytest
import torch
from fake_accelerator import FakeAccelerator, FakeAllocator
from prometheus_client.parser import text_string_to_metric_families
from train_helpers import clean_env  # noqa: F401  (autouse)

import otel_train
from otel_train.common import attributes as A
from otel_train.derived.console import ConsoleReportSpanProcessor
from otel_train.derived.device_metrics import DeviceMetricsSpanProcessor
from otel_train.derived.overhead import OverheadSpanProcessor
from otel_train.derived.budget import BudgetSpanProcessor
from otel_train.recording import device as device_mod
from otel_train.recording import device_probes

pytestmark = pytest.mark.timeout(60)
MIB = 1024 ** 2


def _fake_run(monkeypatch, tmp_path, dev: FakeAccelerator, mem: FakeAllocator, **options):
    real_timing, real_probes = device_mod.resolve_device_timing, device_probes.resolve_device_probes
    monkeypatch.setattr("otel_train.pipeline.assembly.resolve_device_timing",
                        lambda m: real_timing(m, accelerator=dev, event_class=dev.Event))
    monkeypatch.setattr("otel_train.pipeline.assembly.resolve_device_probes",
                        lambda *a, **k: real_probes(*a, memory=mem.peaks(), **k))
    return otel_train.start_run(device_sync="events", prometheus_port=0,
                                status_dir=str(tmp_path), exporter="jsonl", **options)


def _scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_device_metrics_are_served_on_a_real_scrape(monkeypatch, tmp_path):
    dev, mem = FakeAccelerator(), FakeAllocator(block_bytes=MIB)
    with _fake_run(monkeypatch, tmp_path, dev, mem, device_events_every_steps=1,
                   console=False) as run:
        for step in run.steps(range(4)):
            with step.phase("forward"):
                mem.allocate(64 * MIB)
                dev.launch(0.03)
            with step.phase("optimizer"):
                dev.item()
                mem.free(64 * MIB)
        run.flush()
        time.sleep(0.5)  # the exporter process's chain state comes back every 0.25 s
        got = _scrape(run.prometheus_url)
    busy = {s[0]["phase"]: s[1] for s in got["otel_train_phase_device_busy_seconds_total"]}
    assert busy["forward"] == pytest.approx(4 * 0.03, abs=0.04)
    assert "data" not in busy  # the data phase's device time is idle time
    assert got["otel_train_device_idle_seconds_total"][0][0] == {"rank": "0"}
    bounds = {s[0]["bound"]: s[1] for s in got["otel_train_steps_by_bound_total"]}
    assert bounds == {"compute": 4.0}
    peaks = {(s[0]["phase"], s[0]["pool"]): s[1]
             for s in got["otel_train_phase_memory_peak_bytes"]}
    assert peaks[("forward", "allocated")] == 64 * MIB
    assert peaks[("forward", "reserved")] == 64 * MIB
    assert dev.synchronize_calls == 0


def test_on_cpu_host_rss_is_a_gauge_and_every_step_has_a_bound(tmp_path):
    with otel_train.start_run(prometheus_port=0, status_dir=str(tmp_path), exporter="jsonl",
                              console=False, device_events_every_steps=2) as run:
        for step in run.steps(range(4)):
            with step.phase("forward"):
                pass
        run.flush()
        time.sleep(0.5)
        got = _scrape(run.prometheus_url)
    assert got["otel_train_host_rss_bytes"][0][1] > 10 * MIB
    assert sum(v for _, v in got["otel_train_steps_by_bound_total"]) == 4


def test_the_device_figures_cross_to_another_chain_copy_unchanged():
    from otel_train.records.steps_view import StepView

    proc = DeviceMetricsSpanProcessor(rank=1)
    root = {A.STEP_BOUND: "input", A.DEVICE_IDLE: 0.2, A.DEVICE_BUSY: 0.1}

    class Root:
        _attributes = root

    phase = ("forward", "train", None, 10, 1, 7, 0, 10, None, (), {A.DEVICE_BUSY: 0.1,
             A.MEMORY_PEAK_ALLOCATED: 5, A.MEMORY_PEAK_RESERVED: 8}, 0.1)
    view = StepView(True, "train.step", Root(), (1, 7), root, 0, 10, [phase])  # type: ignore
    view.rank = 1
    proc.on_step(view)
    import marshal

    copy = DeviceMetricsSpanProcessor(rank=1)
    copy.load_state(marshal.loads(marshal.dumps(proc.export_state())))
    assert [(m.name, [(s.labels, s.value) for s in m.samples]) for m in copy.families()] == [
        (m.name, [(s.labels, s.value) for s in m.samples]) for m in proc.families()]


def test_the_console_names_the_phase_that_ran_out_of_memory_with_its_peak(monkeypatch,
                                                                          tmp_path, capfd):
    dev = FakeAccelerator()
    mem = FakeAllocator(capacity_bytes=int(72 * 1024 ** 3), block_bytes=MIB)
    with pytest.raises(torch.OutOfMemoryError):
        with _fake_run(monkeypatch, tmp_path, dev, mem, device_events_every_steps=1,
                       memory_peaks="on") as run:
            for step in run.steps(range(3)):
                with step.phase("forward"):
                    mem.allocate(int(40 * 1024 ** 3))
                with step.phase("backward"):
                    mem.allocate(int(31.2 * 1024 ** 3))
                    mem.allocate(int(4 * 1024 ** 3))  # past 72 GiB
    err = capfd.readouterr().err
    assert "out of memory in backward (step 0): peak 71.2 GiB allocated" in err


def test_the_breakdown_shows_the_bound_and_device_busy_and_idle():
    from span_trees import feed, step_spans

    out = io.StringIO()
    ov = OverheadSpanProcessor()
    console = ConsoleReportSpanProcessor(10, ov, BudgetSpanProcessor(ov), stream=out)
    from otel_train.records.steps_view import SharedStepSpanProcessor

    shared = SharedStepSpanProcessor([ov, console])
    spans = step_spans(3, [("data", "train", 0, 60), ("forward", "train", 60, 70),
                           ("inference", "monitor", 70, 100)], 100,
                       attrs={A.STEP_BOUND: "input", A.DEVICE_BUSY: 0.04, A.DEVICE_IDLE: 0.06})
    feed(shared, spans)
    assert "   bound: input (device busy 0.040s, idle 0.060s)" in out.getvalue()
