"""OverheadSpanProcessor on hand-built steps: exact recent, cumulative and per-operation ratios."""

from __future__ import annotations

import pytest
from span_trees import feed, monitor_span, step_spans, train_step

from otel_train.overhead import OverheadSpanProcessor
from otel_train.self_cost import SelfCostMeter

pytestmark = pytest.mark.timeout(30)


def test_overhead_ratio_counts_only_top_level_monitor_phases() -> None:
    ov = OverheadSpanProcessor()
    phases = [("forward", "train", 0, 60),
              ("eval", "monitor", 60, 100),
              ("val_loss", "monitor", 70, 90, 1)]  # nested: part of eval's 40 ms
    feed(ov, step_spans(0, phases, 100))
    snap = ov.snapshot()
    assert snap.cumulative_ratio == pytest.approx(0.40)
    assert set(snap.operations) == {"eval"}
    assert snap.operations["eval"].share == pytest.approx(0.40)


def test_cumulative_ratio_is_monitoring_time_over_the_sum_of_step_durations() -> None:
    ov = OverheadSpanProcessor(recent_window_steps=100)
    for i in range(10):
        feed(ov, train_step(i, step_ms=100, monitor_ms=10 if i % 2 == 0 else 0))
    snap = ov.snapshot()
    assert snap.steps == 10
    assert snap.wall_seconds == pytest.approx(1.0)
    assert snap.monitoring_seconds == pytest.approx(0.05)
    assert snap.cumulative_ratio == pytest.approx(0.05)
    assert snap.recent_ratio == pytest.approx(0.05)


def test_recent_window_covers_only_the_last_n_steps() -> None:
    ov = OverheadSpanProcessor(recent_window_steps=4)
    for i in range(4):
        feed(ov, train_step(i, step_ms=100, monitor_ms=50))  # 50% each
    for i in range(4, 8):
        feed(ov, train_step(i, step_ms=100))  # no monitoring
    snap = ov.snapshot()
    assert snap.recent_ratio == 0.0
    assert snap.recent_steps == 4
    assert snap.cumulative_ratio == pytest.approx(0.25)


def test_monitoring_between_steps_counts_as_monitoring_and_as_wall_time() -> None:
    ov = OverheadSpanProcessor(recent_window_steps=10)
    feed(ov, train_step(0, step_ms=100))
    ov.on_end(monitor_span("checkpoint", after_step=0, duration_ms=100))
    snap = ov.snapshot()
    assert snap.cumulative_ratio == pytest.approx(0.5)
    assert snap.recent_ratio == pytest.approx(0.5)  # pending, before the next step
    feed(ov, train_step(1, step_ms=100))
    snap = ov.snapshot()
    assert snap.cumulative_ratio == pytest.approx(100 / 300)
    assert snap.recent_ratio == pytest.approx(100 / 300)
    op = snap.operations["checkpoint"]
    assert (op.calls, op.first_step, op.last_step) == (1, 0, 0)
    assert op.share == pytest.approx(100 / 300)


def test_per_operation_costs_have_calls_total_mean_max_and_share() -> None:
    ov = OverheadSpanProcessor()
    feed(ov, train_step(0, step_ms=100, monitor_ms=20))
    feed(ov, train_step(5, step_ms=100, monitor_ms=40))
    for i in range(1, 5):
        feed(ov, train_step(i, step_ms=100))
    op = ov.snapshot().operations["inference"]
    assert op.calls == 2
    assert op.total_seconds == pytest.approx(0.06)
    assert op.mean_seconds == pytest.approx(0.03)
    assert op.max_seconds == pytest.approx(0.04)
    assert op.share == pytest.approx(0.06 / 0.6)
    assert (op.first_step, op.last_step) == (0, 5)


def test_instrumentation_overhead_is_self_cost_over_wall_time() -> None:
    meter = SelfCostMeter()
    ov = OverheadSpanProcessor(recent_window_steps=100, self_cost=meter)
    for i in range(10):
        meter.add_background_ns(1_000_000)  # 1 ms of library CPU per 100 ms step
        feed(ov, train_step(i, step_ms=100))
    assert ov.snapshot().instrumentation_ratio == pytest.approx(0.01)
    assert OverheadSpanProcessor().snapshot().instrumentation_ratio is None


def test_a_bad_window_is_refused() -> None:
    with pytest.raises(ValueError, match="recent_window_steps"):
        OverheadSpanProcessor(recent_window_steps=0)
