"""StallWatchdog against a real Recorder with a controlled clock (no sleeps, no timing)."""

from __future__ import annotations

import logging
import time

import pytest

from otel_train.common.drop_counter import DropCounter
from otel_train.recording.recorder import Recorder, Step
from otel_train.derived.watchdog import StallWatchdog

pytestmark = pytest.mark.timeout(30)
S = 1_000_000_000


class Clock:
    """A perf_counter_ns stand-in the test moves by hand."""

    def __init__(self) -> None:
        self.now = time.perf_counter_ns()

    def __call__(self) -> int:
        return self.now


def test_in_progress_seconds_grow_while_a_step_is_stuck_and_drop_to_zero_after() -> None:
    rec = Recorder(10, DropCounter(), None)
    clock = Clock()
    dog = StallWatchdog(rec, clock_ns=clock)
    assert dog.progress() == (0.0, 0.0)
    step = Step(rec, 0, None)
    rec.current = step
    clock.now = step.start_ns + 42 * S
    in_progress, last = dog.progress()
    assert in_progress == pytest.approx(42.0)
    assert last == 0.0
    step._finish(None)
    in_progress, last = dog.progress()
    assert in_progress == 0.0
    assert last == pytest.approx(time.time(), abs=60)


def test_a_stall_warning_names_the_running_phase_and_for_how_long(
        caplog: pytest.LogCaptureFixture) -> None:
    rec = Recorder(10, DropCounter(), None)
    clock = Clock()
    dog = StallWatchdog(rec, stall_seconds=60.0, clock_ns=clock,
                        typical_step_seconds=lambda: 3.5)
    step = Step(rec, 7, None)
    rec.current = step
    step.monitor("inference").__enter__()
    progress = rec.in_progress()
    assert progress is not None
    phase_start = progress[3]
    clock.now = step.start_ns + 30 * S
    assert dog.check() is None
    clock.now = phase_start + 600 * S
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        text = dog.check()
        again = dog.check()  # same stall, not doubled: no second warning
    assert text is not None and again is None
    assert "step 7 looks stalled" in text
    assert "in phase 'inference' for 600.0 s" in text
    assert "a step usually takes 3.5 s" in text
    assert caplog.text.count("looks stalled") == 1


def test_a_monitoring_operation_past_its_limit_is_named_while_it_still_runs(
        caplog: pytest.LogCaptureFixture) -> None:
    rec = Recorder(10, DropCounter(), None)
    clock = Clock()
    dog = StallWatchdog(rec, clock_ns=clock, slow_operation_seconds=30.0)
    step = Step(rec, 12, None)
    step.monitor("val_loss").__enter__()
    data = step.phase("data")  # a validation fetch nested inside the operation
    data.__enter__()
    op = rec.open_monitoring()
    assert op is not None and op[:2] == (12, "val_loss")
    clock.now = op[2] + 29 * S
    assert dog.check_operation() is None
    clock.now = op[2] + 31 * S
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        text = dog.check_operation()
        again = dog.check_operation()  # the same call: said once
    assert text is not None and again is None
    assert "'val_loss' at step 12 has been running for 31.0 s" in text
    assert caplog.text.count("has been running") == 1
    data.__exit__(None, None, None)
    step.monitor("val_loss").__exit__(None, None, None)
    assert rec.open_monitoring() is None


def test_monitoring_between_steps_is_watched_too() -> None:
    from otel_train.recording.recorder import MonitorRecord

    rec = Recorder(10, DropCounter(), None)
    clock = Clock()
    dog = StallWatchdog(rec, clock_ns=clock, slow_operation_seconds=30.0)
    record = MonitorRecord(rec, "evolution_snapshot").start()
    clock.now = record.start_ns + 120 * S
    text = dog.check_operation()
    assert text is not None and "'evolution_snapshot'" in text
    record.end()
    assert rec.open_monitoring() is None


def test_the_default_threshold_follows_the_typical_step_with_a_floor() -> None:
    rec = Recorder(10, DropCounter(), None)
    typical = [None]
    dog = StallWatchdog(rec, stall_min_seconds=300.0, typical_step_seconds=lambda: typical[0])
    assert dog.threshold_seconds() == 900.0  # before any step: compile and warm-up
    Step(rec, 0, None)._finish(None)
    typical[0] = 3.5
    assert dog.threshold_seconds() == 300.0
    typical[0] = 100.0
    assert dog.threshold_seconds() == 1000.0


def test_the_thread_starts_and_stops_within_its_bound() -> None:
    rec = Recorder(10, DropCounter(), None)
    dog = StallWatchdog(rec, interval_seconds=0.01)
    dog.start()
    t0 = time.monotonic()
    dog.stop(2.0)
    assert time.monotonic() - t0 < 2.0
    assert dog._thread is None


def test_the_running_phase_and_its_seconds_are_read_for_the_stall_metric() -> None:
    rec = Recorder(10, DropCounter(), None)
    clock = Clock()
    dog = StallWatchdog(rec, clock_ns=clock)
    assert dog.phase_progress() == ("", 0.0)
    step = Step(rec, 0, None)
    step.phase("allreduce").__enter__()
    progress = rec.in_progress()
    assert progress is not None
    clock.now = progress[3] + 5 * S
    assert dog.phase_progress() == ("allreduce", pytest.approx(5.0))
