"""PrometheusMetricsSpanProcessor: the contract's names and labels, exemplars, and its own server."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import (
    generate_latest as generate_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families
from span_trees import feed, monitor_span, step_spans, train_step

from otel_train.common.drop_counter import DropCounter
from otel_train.derived.gpu import GpuSample
from otel_train.derived.overhead import OverheadSpanProcessor
from otel_train.derived.prometheus_metrics import PrometheusMetricsSpanProcessor
from otel_train.derived.slow_steps import SlowStepSpanProcessor
from otel_train.records.steps_view import SharedStepSpanProcessor

pytestmark = pytest.mark.timeout(30)


def samples(metrics: PrometheusMetricsSpanProcessor) -> dict[tuple[str, tuple], float]:
    text = generate_latest(metrics.registry).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def fed() -> tuple[PrometheusMetricsSpanProcessor, list]:
    drops = DropCounter()
    drops.add("export_failed", 3)
    ov = OverheadSpanProcessor()
    metrics = PrometheusMetricsSpanProcessor(rank=0, budget=0.05, overhead=ov,
                                progress=lambda: (12.5, 1_700_000_000.0), drops=drops)
    shared = SharedStepSpanProcessor([SlowStepSpanProcessor(), ov, metrics])
    roots = []
    for i in range(10):
        spans = train_step(i, step_ms=100, monitor_ms=10)
        feed(shared, spans)
        roots.append(spans[-1])
    feed(shared, step_spans(10, [("forward", "train", 0, 900),
                                 ("data", "monitor", 900, 950, None, "val")], 1000))
    shared.on_end(monitor_span("checkpoint", after_step=10, duration_ms=40))
    return metrics, roots


def test_contract_metrics_have_their_names_labels_and_values() -> None:
    metrics, _ = fed()
    s = samples(metrics)
    r = (("rank", "0"),)
    assert s[("otel_train_steps_total", r)] == 11
    assert s[("otel_train_slow_steps_total", r)] == 1
    assert s[("otel_train_step_duration_seconds_count", r)] == 11
    assert s[("otel_train_step_duration_seconds_sum", r)] == pytest.approx(2.0)
    assert s[("otel_train_step_duration_seconds_bucket", (("le", "0.1"), ("rank", "0")))] == 10
    fwd = (("kind", "train"), ("loader", "train"), ("phase", "forward"), ("rank", "0"))
    assert s[("otel_train_phase_duration_seconds_count", fwd)] == 11
    val = (("kind", "monitor"), ("loader", "val"), ("phase", "data"), ("rank", "0"))
    assert s[("otel_train_phase_duration_seconds_count", val)] == 1
    ckpt = (("kind", "monitor"), ("loader", ""), ("phase", "checkpoint"), ("rank", "0"))
    assert s[("otel_train_phase_duration_seconds_sum", ckpt)] == pytest.approx(0.04)
    cum = (("rank", "0"), ("window", "cumulative"))
    # monitoring 10 x 10 ms + 50 ms + 40 ms over training 2.04 s of wall time minus those
    assert s[("otel_train_monitoring_overhead_ratio", cum)] == pytest.approx(0.19 / 1.85)
    assert s[("otel_train_monitoring_wall_share_ratio", cum)] == pytest.approx(0.19 / 2.04)
    assert ("otel_train_monitoring_overhead_ratio", (("rank", "0"), ("window", "steady"))) in s
    op = (("operation", "inference"), ("rank", "0"))
    assert s[("otel_train_operation_overhead_ratio", op)] == pytest.approx(0.1 / 1.85)
    assert s[("otel_train_monitoring_budget_ratio", ())] == 0.05
    assert s[("otel_train_step_in_progress_seconds", r)] == 12.5
    assert s[("otel_train_last_step_timestamp_seconds", r)] >= 1_700_000_000.0
    assert s[("otel_train_spans_dropped_total", (("reason", "export_failed"),))] == 3


def test_step_duration_buckets_carry_the_trace_id_as_an_openmetrics_exemplar() -> None:
    metrics, roots = fed()
    text = generate_openmetrics(metrics.registry).decode()
    line = next(ln for ln in text.splitlines()
                if ln.startswith('otel_train_step_duration_seconds_bucket{le="0.1"'))
    trace_hex = format(roots[-1].context.trace_id, "032x")
    assert f'# {{trace_id="{trace_hex}"}} 0.1' in line


def test_gpu_gauges_by_gpu_and_no_utilization_series_when_unsupported() -> None:
    metrics = PrometheusMetricsSpanProcessor()
    metrics.set_gpu_samples([GpuSample(0, 0.75, 2048, 8192, 1), GpuSample(1, None, 10, 80, 1)])
    s = samples(metrics)
    assert s[("otel_train_gpu_utilization_ratio", (("gpu", "0"),))] == 0.75
    assert ("otel_train_gpu_utilization_ratio", (("gpu", "1"),)) not in s
    assert s[("otel_train_gpu_memory_used_bytes", (("gpu", "1"),))] == 10


def test_the_server_binds_a_free_port_on_localhost_and_serves_metrics() -> None:
    metrics, _ = fed()
    url = metrics.start_server("127.0.0.1", 0)
    try:
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
            assert b"otel_train_steps_total" in resp.read()
    finally:
        metrics.stop_server(2.0)
    metrics.stop_server(1.0)  # idempotent


def test_a_port_in_use_raises_oserror() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            PrometheusMetricsSpanProcessor().start_server("127.0.0.1", port)


def test_the_runs_thresholds_and_identity_are_gauges_next_to_the_budget() -> None:
    metrics = PrometheusMetricsSpanProcessor(
        rank=3, budget=0.02, overhead=OverheadSpanProcessor(), critical=0.04,
        slow_step_factor=2.5, slow_operation_seconds=45.0, run_id="run-7", world_size=8)
    s = samples(metrics)
    assert s[("otel_train_monitoring_budget_ratio", ())] == 0.02
    assert s[("otel_train_monitoring_critical_ratio", ())] == 0.04
    assert s[("otel_train_slow_step_factor", ())] == 2.5
    assert s[("otel_train_slow_operation_seconds", ())] == 45.0
    info = (("rank", "3"), ("run_id", "run-7"), ("world_size", "8"))
    assert s[("otel_train_run_info", info)] == 1.0


def test_a_custom_operation_limit_becomes_a_bucket_bound_so_the_alert_can_read_it() -> None:
    ov = OverheadSpanProcessor()
    metrics = PrometheusMetricsSpanProcessor(rank=0, overhead=ov, slow_operation_seconds=45.0)
    shared = SharedStepSpanProcessor([ov, metrics])
    shared.on_end(monitor_span("val_loss", after_step=0, duration_ms=50_000))
    s = samples(metrics)
    bucket = (("kind", "monitor"), ("le", "45.0"), ("loader", ""), ("phase", "val_loss"),
              ("rank", "0"))
    assert s[("otel_train_phase_duration_seconds_bucket", bucket)] == 0  # 50 s > 45 s
    assert s[("otel_train_phase_duration_seconds_bucket", bucket[:1] + (("le", "60.0"),)
              + bucket[2:])] == 1
    # without the options nothing new is exported (an older deploy keeps its fallbacks)
    plain = samples(PrometheusMetricsSpanProcessor(rank=0))
    assert not {k for k in plain if k[0] in {"otel_train_monitoring_critical_ratio",
                                             "otel_train_run_info"}}


def test_a_frame_of_steps_in_one_call_counts_what_the_steps_one_by_one_count() -> None:
    """on_steps (a frame of steps from the chain) against on_step per view, on views of
    several ranks taking turns, slow and not, new phase keys mid-frame, durations on the
    buckets' edges: the same state and the same exposition, byte for byte; a view it
    cannot read is handed over and the others still count."""
    import random

    from otel_train.common import attributes as A
    from otel_train.records.span_rows import view_from_record

    rng = random.Random(11)
    edges = [0, 1_000_000, 2_500_000, 30_000_000_000, 10**13]

    def views():
        out = []
        for i in range(300):
            phases = [(name, kind, loader, rng.choice(edges + [rng.randrange(10**10)]),
                       k + 1, 7, 100, 200, None, (), None, None)
                      for k, (name, kind, loader) in enumerate(
                          [("data", "train", "train"), ("forward", "train", None),
                           (f"eval{i % 7}", "monitor", None)][:1 + i % 3])]
            dur = rng.choice(edges + [rng.randrange(10**10)])
            rec = ("train.step", i + 1, 7, 1, 10**18, 10**18 + dur, {A.STEP: i}, None, (),
                   phases, None)
            view = view_from_record(rec, rng.choice([0, 1, "2", 0]))
            view.slow = i % 5 == 0
            out.append(view)
        return out

    by_step, by_frame = PrometheusMetricsSpanProcessor(rank=0), PrometheusMetricsSpanProcessor(
        rank=0)
    rng.seed(11)
    for view in views():
        by_step.on_step(view)
    rng.seed(11)
    frame = views()
    failed = []
    by_frame.on_steps(frame[:150], lambda proc, view, exc: failed.append(view))
    by_frame.on_steps(frame[150:], lambda proc, view, exc: failed.append(view))
    assert not failed
    assert by_frame.export_state() == by_step.export_state()
    assert generate_latest(by_frame.registry) == generate_latest(by_step.registry)
    assert len(by_frame.export_state()["steps"]) == 3

    class Unreadable:
        rank = 0
        duration_ns = "x"  # not a number

    one = PrometheusMetricsSpanProcessor(rank=0)
    one.on_steps([frame[0], Unreadable(), frame[1]], lambda p, v, e: failed.append(v))
    assert len(failed) == 1 and one.export_state()["steps_total"] == {"0": 2}
