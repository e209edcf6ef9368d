"""End to end: the real Prometheus scrapes real otel-train runs; dashboards and alerts work on it.

Two instrumented training loops run in subprocesses (each with its own metrics endpoint,
``prometheus_port=0``):

- ``heavy``: monitoring (``step.monitor("inference")``) costs ~20% of each step, and every 10th
  step is slow (a 0.5 s forward instead of 0.04 s);
- ``light``: monitoring costs ~1% (a 5 ms call every 10th step of ~50 ms).

A real ``prometheus`` (tests/prometheus_server.py) scrapes both every second, with the repository's
recording and alert rules loaded. Through the Prometheus HTTP API the test checks that every
Prometheus query of every dashboard panel (and every template variable) returns data, and that
the alert conditions hold: over-budget and slow-step true for ``heavy``, over-budget false for
``light``.

How an alert "condition" is checked: the alert's ``expr`` is read from
deploy/prometheus/rules/*.yml and evaluated directly as an instant query (that is the condition
without its ``for``: the alerts wait 10 minutes before firing, far longer than a test). As a second
witness, the same rule loaded into the server must be ``pending`` in ``ALERTS`` for that instance.

GPU metrics: there is no GPU here, so the child processes get a fake ``pynvml`` module (one GPU at
55% utilisation, 3 GiB used) first on ``PYTHONPATH``; otel-train's NVML sampler reads it as it
would read a real driver, which feeds the GPU panels.

Runs in CI (``CI=true``) and never skips there: a missing ``prometheus`` binary fails the test.
"""

from __future__ import annotations

import math
import os
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest
from deploy_support import (
    PROVISIONING,
    REPO,
    RULE_FILES,
    Child,
    child_env,
    alert_rules,
    load_dashboard,
    load_generator,
    load_yaml,
    prometheus_queries,
    recording_rules,
    variable_queries,
)
from prometheus_server import PrometheusServer, require_binary

sys.path.insert(0, str(REPO / "deploy" / "grafana"))
from rows_comm import PANEL_TITLES as COMM_PANEL_TITLES  # noqa: E402
from rows_device import PANEL_TITLES as DEVICE_PANEL_TITLES  # noqa: E402

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(120)]

# The instrumented loop, run as `python child.py <stop_file> <status_dir> <profile>`. It prints
# one JSON line with the metrics URL, then steps until the stop file appears (at most 90 s).
CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    import otel_train

    stop_file, status_dir, profile = sys.argv[1], sys.argv[2], sys.argv[3]
    deadline = time.monotonic() + 90.0

    def batches():
        i = 0
        while not os.path.exists(stop_file) and time.monotonic() < deadline:
            yield i
            i += 1

    with otel_train.start_run(
        service_name="deploy-e2e-" + profile,
        prometheus_port=0,
        console=False,
        exporter="none",
        status_dir=status_dir,
        slow_step_seconds=0.3,
    ) as run:
        print(json.dumps({"prometheus_url": run.prometheus_url}), flush=True)
        for step in run.steps(batches(), loader="train"):
            if profile == "heavy":
                # 9 of 10 steps: 40 ms forward; every 10th: 500 ms (slow). Monitoring 21.5 ms
                # per step: 215 ms of ~1.08 s per 10 steps = ~20%.
                with step.phase("forward"):
                    time.sleep(0.5 if step.index % 10 == 9 else 0.04)
                with step.monitor("inference"):
                    time.sleep(0.0215)
            else:
                # 50 ms forward; a 5 ms monitoring call every 10th step: ~1%.
                with step.phase("forward"):
                    time.sleep(0.05)
                if step.index % 10 == 0:
                    with step.monitor("inference"):
                        time.sleep(0.005)
    """
)

FAKE_PYNVML = textwrap.dedent(
    '''
    """Fake NVML (test only): one GPU at 55% utilisation with 3 GiB of 16 GiB used."""

    NVML_SUCCESS = 0
    NVML_TEMPERATURE_GPU = 0


    class NVMLError(Exception):
        pass


    class _Handle:
        def __init__(self, index):
            self.index = index


    class _Utilization:
        gpu = 55
        memory = 30


    class _Memory:
        total = 16 * 2**30
        used = 3 * 2**30
        free = 13 * 2**30


    def nvmlInit(): pass
    def nvmlInitWithFlags(flags): pass
    def nvmlShutdown(): pass
    def nvmlDeviceGetCount(): return 1
    def nvmlDeviceGetHandleByIndex(index): return _Handle(index)
    def nvmlDeviceGetIndex(handle): return handle.index
    def nvmlDeviceGetUtilizationRates(handle): return _Utilization()
    def nvmlDeviceGetMemoryInfo(handle, version=None): return _Memory()
    def nvmlDeviceGetName(handle): return "Fake GPU"
    def nvmlDeviceGetUUID(handle): return "GPU-00000000-fake"
    def nvmlDeviceGetTemperature(handle, sensor): return 50
    def nvmlDeviceGetPowerUsage(handle): return 100000
    def nvmlSystemGetDriverVersion(): return "550.00"
    '''
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_binary("prometheus")
    workdir = tmp_path_factory.mktemp("deploy-e2e")
    (workdir / "child.py").write_text(CHILD)
    fake = workdir / "fake_nvml"
    fake.mkdir()
    (fake / "pynvml.py").write_text(FAKE_PYNVML)
    env = child_env(str(fake))
    env["OTEL_TRAIN_GPU_SAMPLE_INTERVAL_SECONDS"] = "0.5"

    children = {name: Child(name, workdir, env, [name]) for name in ("heavy", "light")}
    try:
        for child in children.values():
            child.wait_url(timeout=60)
        with PrometheusServer(
            [c.hostport for c in children.values()], rule_files=RULE_FILES, scrape_interval="1s"
        ) as prom:
            # both targets up and stepping, with enough samples for rate() over the windows
            prom.wait_for(
                "count(increase(otel_train_steps_total[1m]) > 0) == 2", timeout=40, interval=0.5
            )
            yield {"prom": prom, "heavy": children["heavy"], "light": children["light"]}
    finally:
        for child in children.values():
            child.stop()


def _finite(result: list[Any]) -> bool:
    return any(math.isfinite(float(s["value"][1])) for s in result)


def _by_instance(result: list[Any]) -> dict[str, float]:
    return {s["metric"].get("instance", ""): float(s["value"][1]) for s in result}


def test_targets_are_up(stack: dict[str, Any]) -> None:
    prom = stack["prom"]
    targets = {t["labels"]["instance"]: t for t in prom.targets()}
    for name in ("heavy", "light"):
        target = targets[stack[name].hostport]
        assert target["health"] == "up", target.get("lastError")
        assert target["labels"]["job"] == "otel-train"


def test_every_dashboard_query_returns_data(stack: dict[str, Any]) -> None:
    """Each Prometheus query of each panel and each template variable returns a finite value."""
    prom = stack["prom"]
    dashboard = load_dashboard()
    # The device row needs an accelerator's metrics: test_device_row.py runs it on a fake one.
    # Throughput, MFU and FLOP/s need runs that count tokens or FLOPs: these plain loops do
    # not (tests/deploy/test_efficiency_row.py runs those panels against a fake exporter).
    # Communication needs torch.distributed: tests/deploy/test_ddp_stragglers.py runs it.
    skipped = (set(load_generator().rows_efficiency.THROUGHPUT_PANELS)
               | set(DEVICE_PANEL_TITLES) | set(COMM_PANEL_TITLES))
    queries = {f"{title} [{ref}]": q for title, ref, q in prometheus_queries(dashboard)
               if title not in skipped}
    queries.update({f"variable ${name}": q for name, q in variable_queries(dashboard)})
    assert len(queries) >= 20
    pending = dict(queries)
    deadline = time.monotonic() + 45
    while pending and time.monotonic() < deadline:
        for key, promql in list(pending.items()):
            if _finite(prom.query(promql)):
                del pending[key]
        if pending:
            time.sleep(1)
    assert not pending, "dashboard queries without data:\n" + "\n".join(
        f"- {k}: {v}" for k, v in pending.items()
    )


def _condition(prom: PrometheusServer, alert: str, want: dict[str, bool], timeout: float = 40) -> None:
    """Evaluate the alert's expr (its condition without `for`) until it matches `want`."""
    expr = alert_rules()[alert]["expr"]
    last: dict[str, float] = {}

    def ok(result: list[Any]) -> bool:
        nonlocal last
        last = _by_instance(result)
        return all((inst in last) == expected for inst, expected in want.items())

    try:
        prom.wait_for(expr, ok, timeout=timeout, interval=1)
    except TimeoutError:
        pytest.fail(f"{alert}: condition per instance {last}, expected {want}\n{expr}")


def _pending(prom: PrometheusServer, alert: str, instance: str) -> None:
    prom.wait_for(
        f'ALERTS{{alertname="{alert}", alertstate="pending", instance="{instance}"}}',
        timeout=20,
        interval=1,
    )


def test_overhead_alert_condition_true_at_20_percent_false_at_1_percent(stack: dict[str, Any]) -> None:
    prom, heavy, light = stack["prom"], stack["heavy"].hostport, stack["light"].hostport
    ratios = _by_instance(
        prom.query('otel_train_monitoring_overhead_ratio{window="cumulative"}')
    )
    assert 0.12 < ratios[heavy] < 0.35, ratios
    assert ratios[light] < 0.04, ratios
    _condition(prom, "OtelTrainMonitoringOverBudget", {heavy: True, light: False})
    _condition(prom, "OtelTrainMonitoringOverCritical", {heavy: True, light: False})
    _pending(prom, "OtelTrainMonitoringOverBudget", heavy)
    assert not prom.query(
        f'ALERTS{{alertname="OtelTrainMonitoringOverBudget", instance="{light}"}}'
    )


def test_slow_step_alert_condition_true(stack: dict[str, Any]) -> None:
    prom, heavy = stack["prom"], stack["heavy"].hostport
    _condition(prom, "OtelTrainSlowSteps", {heavy: True})
    _pending(prom, "OtelTrainSlowSteps", heavy)


def test_no_stall_or_down_alert_on_healthy_runs(stack: dict[str, Any]) -> None:
    prom = stack["prom"]
    for alert in ("OtelTrainStepStalled", "OtelTrainNoStepCompleted", "OtelTrainTargetDown"):
        assert not prom.query(alert_rules()[alert]["expr"]), alert


def test_grafana_alert_queries_agree(stack: dict[str, Any]) -> None:
    """The provisioned Grafana rules' queries fire (return a series) for the same targets as the
    Prometheus alerts' conditions, on the same data."""
    prom, heavy, light = stack["prom"], stack["heavy"].hostport, stack["light"].hostport
    config = load_yaml(PROVISIONING / "alerting" / "otel-train-alerts.yaml")
    grafana = {r["uid"]: r for g in config["groups"] for r in g["rules"]}

    def firing(uid: str, at: float | None = None) -> set[str]:
        (query,) = [d for d in grafana[uid]["data"] if d["refId"] == "A"]
        return set(_by_instance(prom.query(query["model"]["expr"], time=at)))

    deadline = time.monotonic() + 30
    while True:
        got = {uid: firing(uid) for uid in grafana}
        expected_ok = (
            heavy in got["otel-train-budget-warning"]
            and light not in got["otel-train-budget-warning"]
            and heavy in got["otel-train-budget-critical"]
            and heavy in got["otel-train-slow-steps"]
            and not got["otel-train-stalled"]
            and not got["otel-train-straggler"]  # two runs of one rank each
        )
        if expected_ok or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert expected_ok, got
    at = time.time()  # and the Prometheus conditions say the same, at the same instant
    for name, rule in alert_rules().items():
        uid = next(u for u, r in grafana.items() if r["annotations"]["runbook_url"].endswith(
            "#" + name.lower()))
        assert set(_by_instance(prom.query(rule["expr"], time=at))) == firing(uid, at), name


def test_recording_rules_produce_series(stack: dict[str, Any]) -> None:
    prom = stack["prom"]
    missing = []
    for name in recording_rules():
        try:
            prom.wait_for(name, _finite, timeout=15, interval=1)
        except TimeoutError:
            missing.append(name)
    assert not missing, f"recording rules without data: {missing}"


def test_step_duration_exemplars_carry_trace_ids(stack: dict[str, Any]) -> None:
    """Exemplars reach Prometheus (OpenMetrics scrape) with the `trace_id` Grafana links on."""
    prom = stack["prom"]
    deadline = time.monotonic() + 20
    exemplars: list[Any] = []
    while time.monotonic() < deadline:
        now = time.time()
        exemplars = prom.query_exemplars("otel_train_step_duration_seconds_bucket", now - 300, now)
        if any(e.get("exemplars") for e in exemplars):
            break
        time.sleep(1)
    trace_ids = [
        x["labels"].get("trace_id") for series in exemplars for x in series.get("exemplars", [])
    ]
    assert trace_ids and all(t and len(t) == 32 for t in trace_ids), exemplars[:2]
