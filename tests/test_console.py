"""ConsoleReportSpanProcessor: the fast log, the full breakdown, red flags."""

from __future__ import annotations

import io

import pytest
from span_trees import feed, monitor_span, step_spans, train_step

from otel_train.budget import BudgetSpanProcessor
from otel_train.console import ConsoleReportSpanProcessor
from otel_train.overhead import OverheadSpanProcessor
from otel_train.slow_steps import SlowStepSpanProcessor
from otel_train.steps_view import SharedStepSpanProcessor

pytestmark = pytest.mark.timeout(30)


def pipeline(log_every: int = 10) -> tuple[SharedStepSpanProcessor, io.StringIO]:
    out = io.StringIO()
    ov = OverheadSpanProcessor()
    budget = BudgetSpanProcessor(ov)
    console = ConsoleReportSpanProcessor(log_every, ov, budget, stream=out)
    return SharedStepSpanProcessor([SlowStepSpanProcessor(), ov, budget, console]), out


def test_fast_log_every_log_every_steps_one_line_each() -> None:
    shared, out = pipeline(log_every=10)
    for i in range(25):
        feed(shared, train_step(i, step_ms=100))
    lines = out.getvalue().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["⏱️  step 0", "⏱️  step 10", "⏱️  step 20"]
    assert "0.100s (data[train] 0.010s, forward 0.040s, backward 0.050s, other 0.000s)" in lines[1]
    assert "monitoring 0.0% recent, 0.0% total [ok]" in lines[1]


def test_full_breakdown_with_percentages_on_steps_that_ran_monitoring() -> None:
    shared, out = pipeline(log_every=1000)
    for i in range(1, 5):
        feed(shared, train_step(i, step_ms=100))
    phases = [("forward", "train", 0, 345), ("inference", "monitor", 345, 6468),
              ("val_loss", "monitor", 6468, 7924), ("data", "monitor", 6500, 6600, 2, "val")]
    feed(shared, step_spans(2800, phases, 8234))
    text = out.getvalue()
    assert "TIMING BREAKDOWN (Step 2,800):" in text
    assert "8.234s" in text
    assert "inference:      6.123s (74.4%)  [monitor]" in text
    assert "val_loss:       1.456s (17.7%)  [monitor]" in text
    assert "forward:        0.345s (4.2%)" in text
    assert "other:          0.310s (3.8%)" in text
    assert "(data[val] inside monitoring: 0.100s)" in text
    assert "monitoring: 92.0% of this step" in text


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
    assert out.getvalue().startswith("⏱️  monitor 'checkpoint' after step 41: 1.234s")


def test_log_every_must_be_positive() -> None:
    with pytest.raises(ValueError, match="log_every"):
        ConsoleReportSpanProcessor(0)
