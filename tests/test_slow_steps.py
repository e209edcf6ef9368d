"""SlowStepSpanProcessor: rolling median, absolute limit, train.slow marking, breakdown."""

from __future__ import annotations

import logging

import pytest
from span_trees import feed, step_spans, train_step

from otel_train import attributes as A
from otel_train.slow_steps import SlowStepSpanProcessor

pytestmark = pytest.mark.timeout(30)


def test_a_step_over_factor_times_the_rolling_median_is_counted_and_marked() -> None:
    slow = SlowStepSpanProcessor(factor=3.0, window_steps=50)
    for i in range(20):
        feed(slow, train_step(i, step_ms=100))
    planted = train_step(20, step_ms=400, monitor_ms=300)
    feed(slow, planted)
    feed(slow, train_step(21, step_ms=299))  # just under 3x: not slow
    assert slow.slow_steps == 1
    assert planted[-1].attributes[A.SLOW] is True
    assert slow.median_seconds() == pytest.approx(0.1)


def test_no_step_is_slow_by_ratio_before_min_history() -> None:
    slow = SlowStepSpanProcessor(min_history=5)
    feed(slow, train_step(0, step_ms=100))
    feed(slow, train_step(1, step_ms=10_000))  # compile / warm-up
    assert slow.slow_steps == 0
    assert slow.median_seconds() is None


def test_an_absolute_limit_flags_steps_regardless_of_the_median() -> None:
    slow = SlowStepSpanProcessor(absolute_seconds=0.15)
    spans = train_step(0, step_ms=200)
    feed(slow, spans)
    assert slow.slow_steps == 1 and spans[-1].attributes[A.SLOW] is True


def test_the_slow_step_warning_shows_the_phase_breakdown(
        caplog: pytest.LogCaptureFixture) -> None:
    slow = SlowStepSpanProcessor()
    for i in range(10):
        feed(slow, train_step(i, step_ms=100))
    phases = [("generation", "train", 0, 452), ("test_gen", "train", 452, 573),
              ("inference", "monitor", 573, 640)]
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        feed(slow, step_spans(10, phases, 653))
    text = caplog.text
    assert "slow step 10: 0.653 s (6.5x the median 0.100 s)" in text
    assert "generation" in text and "69.2%" in text
    assert "inference" in text and "[monitor]" in text
    assert "other" in text and "(not in any phase)" in text
    lines = slow.last_slow.splitlines() if slow.last_slow else []
    assert [ln.split()[0] for ln in lines[1:]] == ["generation", "test_gen", "inference", "other"]


def test_slow_step_warnings_are_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    slow = SlowStepSpanProcessor(absolute_seconds=0.05)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for i in range(20):
            feed(slow, train_step(i, step_ms=100))
    assert slow.slow_steps == 20
    assert caplog.text.count("slow step") == 1


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="slow_step_factor"):
        SlowStepSpanProcessor(factor=1.0)
    with pytest.raises(ValueError, match="slow_step_seconds"):
        SlowStepSpanProcessor(absolute_seconds=0)
