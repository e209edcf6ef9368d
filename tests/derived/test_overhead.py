"""OverheadSpanProcessor on hand-built steps: monitoring / training time (monitoring excluded),
recent, cumulative, steady state and per operation, exactly."""

from __future__ import annotations

import pytest
from span_trees import feed, monitor_span, step_spans, train_step

from otel_train.derived.overhead import OverheadSpanProcessor
from otel_train.common.self_cost import SelfCostMeter

pytestmark = pytest.mark.timeout(30)


def test_overhead_ratio_counts_only_top_level_monitor_phases() -> None:
    ov = OverheadSpanProcessor()
    phases = [("forward", "train", 0, 60),
              ("eval", "monitor", 60, 100),
              ("val_loss", "monitor", 70, 90, 1)]  # nested: part of eval's 40 ms
    feed(ov, step_spans(0, phases, 100))
    snap = ov.snapshot()
    assert snap.cumulative_ratio == pytest.approx(40 / 60)  # 40 ms over 60 ms of training
    assert snap.wall_share == pytest.approx(0.40)  # monitoring / wall, under its own name
    assert set(snap.operations) == {"eval"}
    assert snap.operations["eval"].share == pytest.approx(40 / 60)


def test_cumulative_ratio_is_monitoring_time_over_training_time_without_monitoring() -> None:
    ov = OverheadSpanProcessor(recent_window_steps=100)
    for i in range(10):
        feed(ov, train_step(i, step_ms=100, monitor_ms=10 if i % 2 == 0 else 0))
    snap = ov.snapshot()
    assert snap.steps == 10
    assert snap.wall_seconds == pytest.approx(1.0)
    assert snap.training_seconds == pytest.approx(0.95)
    assert snap.monitoring_seconds == pytest.approx(0.05)
    assert snap.cumulative_ratio == pytest.approx(0.05 / 0.95)
    assert snap.recent_ratio == pytest.approx(0.05 / 0.95)
    assert snap.wall_share == snap.recent_wall_share == pytest.approx(0.05)


def test_recent_window_covers_only_the_last_n_steps() -> None:
    ov = OverheadSpanProcessor(recent_window_steps=4)
    for i in range(4):
        feed(ov, train_step(i, step_ms=100, monitor_ms=50))  # 50% each
    for i in range(4, 8):
        feed(ov, train_step(i, step_ms=100))  # no monitoring
    snap = ov.snapshot()
    assert snap.recent_ratio == 0.0
    assert snap.recent_steps == 4
    assert snap.cumulative_ratio == pytest.approx(200 / 600)


def test_monitoring_between_steps_counts_as_monitoring_not_as_training() -> None:
    ov = OverheadSpanProcessor(recent_window_steps=10)
    feed(ov, train_step(0, step_ms=100))
    ov.on_end(monitor_span("checkpoint", after_step=0, duration_ms=100))
    snap = ov.snapshot()
    assert snap.cumulative_ratio == pytest.approx(1.0)  # 100 ms over 100 ms of training
    assert snap.recent_ratio == pytest.approx(1.0)  # pending, before the next step
    assert snap.wall_share == pytest.approx(0.5)
    feed(ov, train_step(1, step_ms=100))
    snap = ov.snapshot()
    assert snap.training_seconds == pytest.approx(0.2)
    assert snap.cumulative_ratio == pytest.approx(100 / 200)
    assert snap.recent_ratio == pytest.approx(100 / 200)
    op = snap.operations["checkpoint"]
    assert (op.calls, op.first_step, op.last_step) == (1, 0, 0)
    assert op.share == pytest.approx(100 / 200)


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
    assert op.share == pytest.approx(0.06 / 0.54)
    assert (op.first_step, op.last_step) == (0, 5)
    assert op.first_seconds == pytest.approx(0.02)
    assert op.steady_mean_seconds == pytest.approx(0.04)  # the calls after the first


def test_warm_up_steps_are_reported_apart_and_left_out_of_the_steady_training_time() -> None:
    ov = OverheadSpanProcessor(warmup_steps=3)
    for i in range(3):
        feed(ov, train_step(i, step_ms=1000))  # compilation, caches: 1 s each
    for i in range(3, 13):
        feed(ov, train_step(i, step_ms=100, monitor_ms=10 if i % 5 == 0 else 0))
    snap = ov.snapshot()
    assert snap.warmup_steps == 3
    assert snap.warmup_training_seconds == pytest.approx(3.0)
    assert snap.steady_train_seconds_per_step == pytest.approx((1.0 - 0.02) / 10)
    assert snap.training_seconds == pytest.approx(4.0 - 0.02)  # warm-up included
    # cumulative counts everything; steady state puts steady steps in place of warm-up ones
    assert snap.cumulative_ratio == pytest.approx(0.02 / 3.98)
    # inference every 5 steps at 10 ms, over 98 ms of steady training per step
    assert snap.steady_ratio == pytest.approx(0.01 / (5 * 0.098))


def test_steady_ratio_weighs_a_first_call_like_the_later_ones() -> None:
    ov = OverheadSpanProcessor(warmup_steps=0)
    feed(ov, train_step(0, step_ms=100 + 96, monitor_ms=96, monitor="val_loss"))
    assert ov.steady_ratio() == pytest.approx(96 / 100)  # one call: nothing better known
    for i in range(1, 21):
        feed(ov, train_step(i, step_ms=100 + (4 if i % 10 == 0 else 0),
                            monitor_ms=4 if i % 10 == 0 else 0, monitor="val_loss"))
    snap = ov.snapshot()
    assert snap.operations["val_loss"].first_seconds == pytest.approx(0.096)
    assert snap.cumulative_ratio == pytest.approx(0.104 / 2.1)
    assert snap.steady_ratio == pytest.approx(0.004 / (10 * 0.1))  # 4 ms every 10 steps


def test_instrumentation_overhead_is_the_meters_share_of_the_loops_time() -> None:
    meter = SelfCostMeter(hot_path_ns_per_span=100_000.0, window_steps=100)
    ov = OverheadSpanProcessor(recent_window_steps=100, self_cost=meter)
    meter.add_background_ns(50_000_000)  # background CPU beside training is not a loss
    meter.add_hot_path_spans(10 * 10)  # 10 spans of 0.1 ms: 1 ms per 100 ms step
    meter.note_steps(10, 0, 10 * 100_000_000)
    assert ov.snapshot().instrumentation_ratio == pytest.approx(0.01)
    assert OverheadSpanProcessor().snapshot().instrumentation_ratio is None


def test_a_bad_window_or_warm_up_is_refused() -> None:
    with pytest.raises(ValueError, match="recent_window_steps"):
        OverheadSpanProcessor(recent_window_steps=0)
    with pytest.raises(ValueError, match="warmup_steps"):
        OverheadSpanProcessor(warmup_steps=-1)
