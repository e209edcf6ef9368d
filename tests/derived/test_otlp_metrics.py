"""Metrics over OTLP: the same names, units, labels and values as the Prometheus endpoint of
the same run, pushed through the OTel metrics SDK to a real OTLP metrics receiver; and a real
Prometheus running the recording rules on metrics that took that path."""

from __future__ import annotations

import os
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from deploy_support import (
    RULE_FILES,
    alert_rules,
    load_dashboard,
    prometheus_queries,
    recording_rules,
)
from otlp_metrics_receivers import (
    CUMULATIVE,
    DELTA,
    ExpositionServer,
    GrpcOtlpMetricsReceiver,
    HttpOtlpMetricsReceiver,
    exposition,
    prometheus_name,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_server import PrometheusServer
from train_helpers import clean_env, start_test_run  # noqa: F401  (autouse fixture)

from otel_train.common import attributes as A
from otel_train.common.options import RunOptions
from otel_train.derived.otlp_metrics import OTEL_NAMES, otel_name_for
from otel_train.pipeline.plan import plan_metrics

pytestmark = pytest.mark.timeout(90)

_HISTOGRAMS = {A.METRIC_STEP_DURATION, A.METRIC_PHASE_DURATION}
# Read at scrape/export time from clocks: equal in kind and labels, values move.
_MOVING = {A.METRIC_INSTRUMENTATION_OVERHEAD}


def _kind(prom: str) -> tuple[str, bool]:
    if prom in _HISTOGRAMS:
        return "histogram", False
    if prom.endswith("_total"):
        return "sum", True
    return "gauge", False


def test_every_otel_name_translates_to_the_contracts_prometheus_name():
    for prom, (otel, unit) in OTEL_NAMES.items():
        kind, monotonic = _kind(prom)
        assert prometheus_name(otel, unit, kind, monotonic) == prom, (otel, unit)
    # A gauge added to the endpoint later is mapped by its suffixes.
    for prom in ("otel_train_monitoring_wall_share_ratio", "otel_train_slow_operation_seconds",
                 "otel_train_run_info", "otel_train_slow_step_factor"):
        otel, unit = otel_name_for(prom, counter=False)
        assert prometheus_name(otel, unit, "gauge", False) == prom
    otel, unit = otel_name_for("otel_train_spans_sampled_out_total", counter=True)
    assert prometheus_name(otel, unit, "sum", True) == "otel_train_spans_sampled_out_total"


def _train(run: Any, steps: int = 30, slow_at: int = 20) -> None:
    for step in run.steps(range(steps)):
        with step.phase("forward"):
            time.sleep(0.08 if step.index == slow_at else 0.002)
        with step.phase("backward"):
            pass
        if step.index % 10 == 5:
            with step.monitor("inference"):
                time.sleep(0.01)
    with run.monitor("checkpoint"):
        time.sleep(0.005)


def _scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return _samples(text)


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            labels = frozenset((k, v) for k, v in s.labels.items()
                               if v != "" and k != "run_id")
            le = dict(labels).get("le")
            if le is not None:  # "1.0" vs "1": compare bounds as numbers
                labels = frozenset((k, v if k != "le" else repr(float(v))) for k, v in labels)
            out[(s.name, labels)] = s.value
    return out


def _pushed_samples(rx: Any) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return _samples(exposition(rx.latest()))


# metrics_rank_label="gauges": the histograms lose rank on both paths alike.
@pytest.mark.parametrize("rank_label", ["all", "gauges"])
def test_a_run_pushes_over_grpc_the_same_metrics_as_its_prometheus_endpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rank_label: str):
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "60000")  # only our explicit flush
    with GrpcOtlpMetricsReceiver() as rx:
        run = start_test_run(tmp_path, prometheus_port=0, metrics_exporter="otlp",
                             otlp_endpoint=rx.endpoint, otlp_protocol="grpc",
                             run_id="push-run", service_name="pusher",
                             metrics_rank_label=rank_label, tokens_per_step=64,
                             flops_per_step=1e6, peak_flops_per_second=1e9)
        try:
            _train(run)
            assert run.flush()
            pulled = _scrape(run.prometheus_url)
            assert run._telemetry.derived.otlp_metrics.force_flush(5000)
            pushed = _pushed_samples(rx)
            latest = rx.latest()
        finally:
            run.shutdown()
    pulled_names = {name for name, _ in pulled}
    assert {A.METRIC_STEPS + "", A.METRIC_STEP_DURATION + "_bucket"} <= pulled_names
    # Every series of the endpoint arrived with the same name and labels ...
    missing = set(pulled) - set(pushed)
    assert not missing, sorted(missing)[:10]
    # ... and the same value (the ratios read from a clock are only as equal as time allows).
    for key, value in pulled.items():
        if key[0] in _MOVING:
            continue
        assert pushed[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key
    assert pulled[(A.METRIC_STEPS, frozenset({("rank", "0")}))] == 30
    assert pulled[(A.METRIC_SLOW_STEPS, frozenset({("rank", "0")}))] >= 1
    # Units and kinds as the contract's names say; rank and run are attributes.
    steps = latest["otel_train.step.duration"]
    assert (steps.kind, steps.unit, steps.temporality) == ("histogram", "s", CUMULATIVE)
    assert steps.points[0].attributes == ({"rank": "0", "run_id": "push-run"}
                                          if rank_label == "all" else {"run_id": "push-run"})
    phases = latest["otel_train.phase.duration"].points
    assert all(("rank" in p.attributes) is (rank_label == "all") for p in phases)
    assert steps.points[0].exemplar_trace_ids  # the step's trace, as on the endpoint
    assert latest["otel_train.steps"].monotonic
    assert latest["otel_train.monitoring.overhead"].unit == "1"
    # Throughput and MFU too (derived/throughput.py), under their fields' names.
    assert pulled[(A.METRIC_TOKENS, frozenset({("rank", "0")}))] == 30 * 64
    assert latest["otel_train.tokens_per_second"].unit == "{token}/s"
    assert {p.attributes["basis"] for p in latest["otel_train.mfu"].points} == {
        "step", "exclude_data"}
    res = steps.resource_attributes
    assert res["service.name"] == "pusher"
    assert res["service.instance.id"] == "push-run/rank0"
    assert res["train.run.id"] == "push-run"
    assert "host.name" in res


def test_http_push_honours_the_standard_metrics_variables(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with HttpOtlpMetricsReceiver() as rx:
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", rx.metrics_endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-tenant=fleet-a")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")
        monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
        run = start_test_run(tmp_path, run_id="delta-run")
        try:
            assert run.prometheus_url is None  # OTLP only: no port per rank to discover
            _train(run, steps=12, slow_at=-1)
            assert run.flush()
            # The periodic reader pushes by itself, every 200 ms.
            rx.wait_for(lambda ms: len({id(m) for m in ms if m.name == "otel_train.steps"}) >= 1)
            before = len(rx.requests())
            time.sleep(1.0)
            assert len(rx.requests()) >= before + 2
        finally:
            run.shutdown()
    assert all(h.get("x-tenant") == "fleet-a" for h in rx.request_headers())
    steps_points = [p.value for m in rx.metrics("otel_train.steps") for p in m.points]
    hist = [m for m in rx.metrics("otel_train.step.duration")]
    assert {m.temporality for m in hist} == {DELTA}
    assert sum(steps_points) == 12  # delta: the pushes add up to every step


def test_the_prometheus_endpoint_stays_the_default(tmp_path: Path):
    plan = plan_metrics(RunOptions.resolve(environ={}), env={})
    assert (plan.prometheus, plan.otlp) == (True, False)
    both = plan_metrics(RunOptions.resolve(environ={}, metrics_exporter="prometheus,otlp",
                                           otlp_endpoint="http://c:4318"), env={})
    assert (both.prometheus, both.otlp, both.endpoint) == (True, True, "http://c:4318/v1/metrics")
    off = plan_metrics(RunOptions.resolve(environ={}, metrics_exporter="otlp"),
                       env={"OTEL_SDK_DISABLED": "true"})
    assert not off.otlp
    with pytest.raises(ValueError, match="metrics_exporter"):
        RunOptions.resolve(environ={}, metrics_exporter="statsd")


@pytest.mark.prometheus
def test_recording_rules_alerts_and_dashboard_names_work_on_metrics_that_took_the_otlp_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # Prometheus scrapes a collector-shaped endpoint (the received OTLP metrics as Prometheus
    # text) every second while the run pushes every 300 ms, so rates and increases exist.
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "300")
    with GrpcOtlpMetricsReceiver() as rx, ExpositionServer(rx) as collector, \
            PrometheusServer([collector.target], rule_files=RULE_FILES) as prom:
        run = start_test_run(tmp_path, prometheus_port=0, metrics_exporter="prometheus,otlp",
                             otlp_endpoint=rx.endpoint, otlp_protocol="grpc", run_id="e2e")
        try:
            # Train until Prometheus has scraped the step counter rising (bounded: on a loaded
            # machine its first scrape can come late), and for at least 3 s.
            start = time.monotonic()
            for step in run.steps(range(100_000)):
                with step.phase("forward"):
                    time.sleep(0.08 if step.index == 15 else 0.01)
                if step.index % 10 == 5:
                    with step.monitor("inference"):
                        time.sleep(0.01)  # ~10% of training time: over the 5% budget
                if step.index % 50 == 49 and time.monotonic() - start > 3.0 and (
                        prom.query("changes(otel_train_steps_total[5m]) > 1")
                        or time.monotonic() - start > 60):
                    break
            run.flush()
            pulled = {n for n, _ in _scrape(run.prometheus_url)}
            run._telemetry.derived.otlp_metrics.force_flush(5000)
            prom.wait_for("otel_train_steps_total", timeout=30)
            names = {r["metric"]["__name__"] for r in prom.query(
                'group by (__name__) ({__name__=~"otel_train_.+"})')}
            # Every series name the endpoint has, Prometheus has from the OTLP path.
            assert pulled <= names, sorted(pulled - names)
            # Every metric the rules and dashboards read that the endpoint had, too.
            used = set()
            for rule in recording_rules().values():
                used |= set(re.findall(r"otel_train_[a-z_]+", rule["expr"]))
            for _, _, expr in prometheus_queries(load_dashboard()):
                used |= set(re.findall(r"otel_train_[a-z_]+", expr))
            assert (used & pulled) <= names
            # Recording rules evaluated by Prometheus on pushed data give the run's figures.
            mean = prom.wait_for("otel_train:step_duration_seconds:mean_run", timeout=30)
            assert mean[0]["metric"]["rank"] == "0"
            assert 0.01 < float(mean[0]["value"][1]) < 0.1
            rate = prom.wait_for("otel_train:steps:rate5m",
                                 lambda r: r and float(r[0]["value"][1]) > 0, timeout=30)
            assert rate[0]["metric"]["rank"] == "0"
            # An alert's condition holds on pushed data as on pulled data (over budget).
            over = alert_rules()["OtelTrainMonitoringOverBudget"]["expr"]
            assert prom.wait_for(over, timeout=30)[0]["metric"]["rank"] == "0"
        finally:
            run.shutdown()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_never_pushes_the_parents_metrics(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch):
    # The SDK's periodic reader restarts its thread in every forked child (a DataLoader
    # worker): without care, every worker would push the parent's metrics every interval.
    # A long interval keeps the parent quiet (and no export in flight at the fork); the child
    # then does what its restarted thread would do on its next tick.
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "60000")
    with HttpOtlpMetricsReceiver() as rx:
        run = start_test_run(tmp_path, metrics_exporter="otlp", run_id="forked",
                             otlp_endpoint=rx.endpoint, otlp_protocol="http/protobuf")
        try:
            _train(run, steps=5, slow_at=-1)
            run.flush()
            otlp = run._telemetry.derived.otlp_metrics
            assert otlp.force_flush(5000)
            before = len(rx.requests())
            assert before >= 1
            pid = os.fork()
            if pid == 0:  # the child: one tick of the restarted reader, then leave
                code = 0
                try:
                    otlp.reader.collect(timeout_millis=2000)
                    code = 0 if otlp.reader._shutdown_event.is_set() else 3
                except BaseException:
                    code = 2
                os._exit(code)
            deadline = time.monotonic() + 20
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    pytest.fail("the forked child hung")
                time.sleep(0.05)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
            time.sleep(0.3)  # a request from the child would have arrived by now
            assert len(rx.requests()) == before  # nothing came from the child
        finally:
            run.shutdown()


def test_a_stage_with_metrics_over_otlp_and_no_resource_is_refused_naming_it(tmp_path: Path):
    from otel_train.common.drop_counter import DropCounter
    from otel_train.common.identity import RunIdentity
    from otel_train.common.self_cost import SelfCostMeter
    from otel_train.derived.stage import DerivedMetricsStage
    from otel_train.pipeline.plan import PipelineEnvironment, plan_pipeline
    from otel_train.pipeline.settings import derived_settings
    from otel_train.recording.recorder import Recorder

    opts = RunOptions.resolve(environ={}, metrics_exporter="otlp",
                              otlp_endpoint="http://c:4318", status_dir=str(tmp_path))
    ident = RunIdentity("no-resource", 0, 1, 0, "option")
    settings = derived_settings(opts, ident, plan_pipeline(opts, PipelineEnvironment(env={})))
    assert settings.metrics.otlp
    drops = DropCounter()
    with pytest.raises(ValueError, match="metrics_resource"):
        DerivedMetricsStage(settings, ident, tmp_path, Recorder(1, drops, None), drops,
                            SelfCostMeter())
