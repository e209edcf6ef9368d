"""ConsoleReportSpanProcessor: the fast log, the full breakdown on material monitoring only,
warm-up marks, red flags, rank names."""

from __future__ import annotations

import io

import pytest
from span_trees import feed, monitor_span, step_spans, train_step

from otel_train.derived.budget import BudgetSpanProcessor
from otel_train.derived.console import ConsoleReportSpanProcessor
from otel_train.derived.overhead import OverheadSpanProcessor
from otel_train.derived.slow_steps import SlowStepSpanProcessor
from otel_train.records.steps_view import SharedStepSpanProcessor

pytestmark = pytest.mark.timeout(30)


def pipeline(log_every: int = 10, warmup_steps: int = 0,
             **kw: object) -> tuple[SharedStepSpanProcessor, io.StringIO]:
    out = io.StringIO()
    ov = OverheadSpanProcessor(warmup_steps=warmup_steps)
    budget = BudgetSpanProcessor(ov)
    console = ConsoleReportSpanProcessor(log_every, ov, budget, stream=out,
                                         warmup_steps=warmup_steps, **kw)  # type: ignore[arg-type]
    return SharedStepSpanProcessor([SlowStepSpanProcessor(warmup_steps=warmup_steps), ov,
                                    budget, console]), out


def test_fast_log_every_log_every_steps_one_line_each() -> None:
    shared, out = pipeline(log_every=10)
    for i in range(25):
        feed(shared, train_step(i, step_ms=100))
    lines = out.getvalue().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["⏱️  step 0", "⏱️  step 10", "⏱️  step 20"]
    assert "0.100s (data[train] 0.010s, forward 0.040s, backward 0.050s, other 0.000s)" in lines[1]
    assert "monitoring 0.0% recent, 0.0% total (0.0% steady) [ok]" in lines[1]


def fast_loop_step(index: int, step_ms: float = 1.0) -> list:
    """A step of a ~1 ms loop: steps follow each other 1 ms apart."""
    return step_spans(index, [("forward", "train", 0, step_ms * 0.4),
                              ("backward", "train", step_ms * 0.4, step_ms)],
                      step_ms, start_ms=index * 1.0)


def test_a_fast_loop_gets_one_routine_line_per_interval_not_every_log_every_steps() -> None:
    shared, out = pipeline(log_every=10, min_interval_seconds=1.0)
    for i in range(3000):  # 3 s of 1 ms steps: log_every alone would print 300 lines
        feed(shared, fast_loop_step(i))
    lines = out.getvalue().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["⏱️  step 0", "⏱️  step 1000", "⏱️  step 2000"]
    shared, out = pipeline(log_every=10, min_interval_seconds=0)
    for i in range(100):
        feed(shared, fast_loop_step(i))
    assert len(out.getvalue().splitlines()) == 10  # 0: every log_every steps, as before


def test_slow_steps_and_breakdowns_are_never_held_back_by_the_interval() -> None:
    shared, out = pipeline(log_every=10, min_interval_seconds=60.0)
    for i in range(300):
        feed(shared, fast_loop_step(i, step_ms=40.0 if i == 150 else 1.0))
    phases = [("forward", "train", 0, 1), ("val_loss", "monitor", 1, 30)]
    feed(shared, step_spans(300, phases, 30, start_ms=300.0))
    text = out.getvalue()
    lines = [ln.split(":")[0] for ln in text.splitlines() if ln.startswith("⏱️  step")]
    assert lines == ["⏱️  step 0", "⏱️  step 150"]  # the routine ones wait a minute
    assert "🚩 slow step" in text.splitlines()[1]
    assert "TIMING BREAKDOWN (Step 300)" in text


def test_warm_up_steps_are_marked_on_their_lines() -> None:
    shared, out = pipeline(log_every=2, warmup_steps=3)
    for i in range(6):
        feed(shared, train_step(i, step_ms=100))
    lines = out.getvalue().splitlines()
    assert [ln.split(":")[0] for ln in lines] == [
        "⏱️  step 0 [warm-up]", "⏱️  step 2 [warm-up]", "⏱️  step 4"]


def test_full_breakdown_with_percentages_on_steps_that_ran_monitoring() -> None:
    shared, out = pipeline(log_every=1000)
    for i in range(1, 5):
        feed(shared, train_step(i, step_ms=100))
    phases = [("forward", "train", 0, 345), ("inference", "monitor", 345, 6468),
              ("val_loss", "monitor", 6468, 7924), ("data", "monitor", 6500, 6600, 2, "val")]
    feed(shared, step_spans(2600, phases, 8234))  # the first calls (marked: see below)
    feed(shared, step_spans(2800, phases, 8234))
    text = out.getvalue().split("⏱️  TIMING BREAKDOWN")[-1]
    assert "(Step 2,800):" in text
    assert "8.234s" in text
    assert "inference:      6.123s (74.4%)  [monitor]" in text
    assert "val_loss:       1.456s (17.7%)  [monitor]" in text
    assert "forward:        0.345s (4.2%)" in text
    assert "other:          0.310s (3.8%)" in text
    assert "(data[val] inside monitoring: 0.100s)" in text
    # the hand-timed summary: inference / val loss above, then training and other/overhead
    assert "monitoring: 92.0% of this step (training 4.2%, other/overhead 3.8%)" in text


def test_a_first_call_is_marked_and_said_to_be_left_out_of_the_steady_state() -> None:
    shared, out = pipeline(log_every=1000)
    for i in (0, 10):
        feed(shared, train_step(i, step_ms=200, monitor_ms=100))
    first, second = out.getvalue().split("⏱️  TIMING BREAKDOWN")[1:]
    assert "[monitor, first call: warm-up]" in first
    assert "first call of inference: in the total, left out of the steady state" in first
    assert "first call" not in second and "[monitor]" in second


def test_small_monitoring_gets_the_fast_line_only_and_an_eval_operation_the_breakdown() -> None:
    shared, out = pipeline(log_every=10)
    for i in range(1, 101):  # a 0.3 ms collector every 5 steps of 100 ms: not material
        feed(shared, train_step(i, step_ms=100.3 if i % 5 == 0 else 100,
                                monitor_ms=0.3 if i % 5 == 0 else 0, monitor="collector"))
    text = out.getvalue()
    assert "TIMING BREAKDOWN" not in text
    assert len(text.splitlines()) == 10  # steps 10, 20, ..., 100
    assert "collector 0.000s" in text  # still shown on the fast line
    shared, out = pipeline(log_every=10, eval_operations=["val_loss"])
    feed(shared, train_step(3, step_ms=100.3, monitor_ms=0.3, monitor="val_loss"))
    assert "TIMING BREAKDOWN (Step 3)" in out.getvalue()
    shared, out = pipeline(log_every=10, breakdown_min_share=0.001)
    feed(shared, train_step(3, step_ms=100.3, monitor_ms=0.3, monitor="collector"))
    assert "TIMING BREAKDOWN (Step 3)" in out.getvalue()


def test_with_several_ranks_every_line_names_its_rank() -> None:
    shared, out = pipeline(log_every=1, world_size=8)
    feed(shared, step_spans(0, [("forward", "train", 0, 10)], 10, rank=5))
    feed(shared, step_spans(1, [("forward", "train", 0, 10),
                                ("inference", "monitor", 10, 20)], 20, rank=5))
    lines = out.getvalue().splitlines()
    assert len(lines) > 3 and all(ln.startswith("[rank 5] ") for ln in lines)
    shared, out = pipeline(log_every=1)
    feed(shared, step_spans(0, [("forward", "train", 0, 10)], 10))
    assert out.getvalue().startswith("⏱️  step 0")


def test_red_flags_are_named_when_a_share_crosses_its_threshold() -> None:
    shared, out = pipeline(log_every=1000)
    feed(shared, step_spans(1, [("forward", "train", 0, 20), ("inference", "monitor", 20, 960)],
                            1000))
    text = out.getvalue()
    assert "🚩 inference 94.0% of the step (> 90%)" in text
    assert "🚩 monitoring budget critical" in text
    shared, out = pipeline(log_every=1000)
    feed(shared, step_spans(1, [("forward", "train", 0, 20), ("val_loss", "monitor", 20, 60)],
                            100))
    text = out.getvalue()
    assert "🚩 val_loss 40.0%" not in text
    assert "🚩 other 40.0% of the step (> 20%)" in text


def test_monitoring_between_steps_prints_one_line() -> None:
    shared, out = pipeline()
    shared.on_end(monitor_span("checkpoint", after_step=41, duration_ms=1234))
    assert out.getvalue().startswith(
        "⏱️  monitor 'checkpoint' after step 41: 1.234s (first call)")


def test_log_every_must_be_positive() -> None:
    with pytest.raises(ValueError, match="log_every"):
        ConsoleReportSpanProcessor(0)
    with pytest.raises(ValueError, match="console_min_interval_seconds"):
        ConsoleReportSpanProcessor(10, min_interval_seconds=-1.0)
