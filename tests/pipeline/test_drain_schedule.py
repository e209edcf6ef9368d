"""The span worker's drain rule and its sleep between looks (pipeline/drain_schedule.py)."""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import pytest
from train_helpers import clean_env, start_test_run  # noqa: F401  (clean_env: autouse)

from otel_train.pipeline.drain_schedule import ConsoleDrainClock, DrainSchedule

MS = 1_000_000
T0_MS = 1000.0  # the clock's reading when these runs started (perf_counter_ns, never 0)


def _step(index: int, end_ms: float) -> SimpleNamespace:
    return SimpleNamespace(index=index, end_ns=int((T0_MS + end_ms) * MS))


def _at(ms: float) -> int:
    return int((T0_MS + ms) * MS)


def _queue_of(first: int, last: int, period_ms: float) -> deque:
    return deque(_step(i, i * period_ms) for i in range(first, last + 1))


def test_an_empty_queue_sleeps_the_age_limit_since_nothing_queued_later_is_due_sooner() -> None:
    schedule = DrainSchedule(0.05, 256, 0.5)
    assert schedule.wait_seconds(deque(), _at(0), active=False) == pytest.approx(0.5)
    assert schedule.wait_seconds(deque(), _at(0), active=True) == pytest.approx(0.5)


def test_a_drain_is_due_by_count_by_the_oldest_records_age_or_for_the_console() -> None:
    schedule = DrainSchedule(0.05, 10, 0.5)
    queue = _queue_of(0, 3, 2.0)
    assert not schedule.drain_due(queue, now_ns=_at(100))
    assert schedule.drain_due(queue, now_ns=_at(500))  # step 0 ended 0.5 s ago
    assert schedule.drain_due(_queue_of(0, 9, 2.0), now_ns=_at(20))  # 10 records wait
    console = DrainSchedule(0.05, 256, 0.35, ConsoleDrainClock(10, 0.0))
    assert console.drain_due(_queue_of(0, 0, 2.0), now_ns=_at(3))  # step 0's line
    assert not console.drain_due(_queue_of(1, 5, 2.0), now_ns=_at(11))
    assert console.drain_due(_queue_of(6, 10, 2.0), now_ns=_at(21))  # step 10's line


def test_a_training_loop_is_looked_at_when_the_batch_fills_or_the_oldest_ages() -> None:
    schedule = DrainSchedule(0.05, 256, 0.5)
    queue = _queue_of(0, 0, 1.0)
    schedule.observe(queue)
    queue.extend(_queue_of(1, 99, 1.0))
    schedule.observe(queue)
    assert schedule.period_ns == pytest.approx(1 * MS)
    # 100 queued at 1 ms a step: the batch fills in 156 ms, before step 0 is 0.5 s old.
    assert schedule.wait_seconds(queue, _at(100), active=True) == pytest.approx(0.156)
    slow = DrainSchedule(0.05, 256, 0.5)
    queue = _queue_of(0, 0, 10.0)
    slow.observe(queue)
    queue.extend(_queue_of(1, 9, 10.0))
    slow.observe(queue)
    # At 10 ms a step the age limit comes first: step 0 ended at 0, looked at 0.1 s later.
    assert slow.wait_seconds(queue, _at(100), active=True) == pytest.approx(0.4)


def test_the_console_s_next_line_step_is_looked_at_when_it_is_predicted_to_end() -> None:
    schedule = DrainSchedule(0.05, 256, 0.35, ConsoleDrainClock(100, 0.0))
    queue = _queue_of(0, 0, 2.0)
    assert schedule.wait_seconds(queue, _at(0), active=True, stepped=False) == pytest.approx(0.05)
    assert schedule.drain_due(queue, _at(1))  # step 0's line
    queue.clear()
    queue.extend(_queue_of(1, 5, 2.0))
    schedule.observe(queue)
    queue.clear()
    queue.extend(_queue_of(6, 20, 2.0))
    schedule.observe(queue)
    # Step 100 is the next line's: 80 steps of 2 ms after step 20 ended at 40 ms.
    assert schedule.wait_seconds(queue, _at(40), active=True) == pytest.approx(0.16)
    # Never sooner than the poll interval, never later than the age limit.
    assert schedule.wait_seconds(queue, _at(190), active=True) == pytest.approx(0.05)


def test_a_slow_step_does_not_push_the_next_console_line_late() -> None:
    schedule = DrainSchedule(0.05, 256, 0.35, ConsoleDrainClock(10, 0.0))
    schedule.drain_due(_queue_of(0, 0, 20.0), _at(1))  # step 0's line
    end = 0.0
    for index in range(1, 46):
        end += 400.0 if index == 45 else 20.0  # step 45 takes 0.4 s
        schedule.observe(deque([_step(index, end)]))
    assert schedule.period_ns == pytest.approx(20 * MS)
    # Step 50's line: 5 steps of 20 ms after step 45, not 5 x the slow step.
    assert schedule.console.due(deque([_step(40, end - 500)]))  # step 40's line printed
    assert schedule.wait_seconds(deque(), _at(end), active=True) == pytest.approx(0.1)


def test_a_stale_prediction_gives_way_to_the_age_limit_when_the_loop_pauses() -> None:
    schedule = DrainSchedule(0.05, 256, 0.35, ConsoleDrainClock(10, 0.0))
    schedule.drain_due(_queue_of(0, 0, 2.0), _at(1))
    schedule.observe(_queue_of(1, 1, 2.0))
    schedule.observe(_queue_of(2, 5, 2.0))
    # Step 10's line was due at 20 ms; at 2 s the loop sits in a long step.
    assert schedule.wait_seconds(deque(), _at(2000), active=True) == pytest.approx(0.35)
    assert schedule.wait_seconds(deque(), _at(30), active=True) == pytest.approx(0.05)


def _voluntary_switches(tid: int) -> int:
    for line in Path(f"/proc/self/task/{tid}/sched").read_text().splitlines():
        if line.startswith("nr_voluntary_switches"):
            return int(line.split(":")[1])
    raise AssertionError("no nr_voluntary_switches")


@pytest.mark.skipif(not Path("/proc/self/sched").exists(), reason="needs /proc/<pid>/sched")
@pytest.mark.parametrize("console", [True, False], ids=["console", "quiet"])
def test_an_idle_run_s_span_worker_wakes_a_few_times_a_second_not_every_poll(
        tmp_path: Path, console: bool) -> None:
    """Between steps (a long evaluation, a checkpoint, the end of an epoch) the worker sleeps
    until a drain could be due: at most ~3 looks a second, where every 50 ms poll was 20."""
    run = start_test_run(tmp_path, console=console)
    try:
        for step in run.steps(range(3)):
            with step.phase("forward"):
                pass
        run.flush(timeout_seconds=10)
        time.sleep(1.0)  # the last step's age limit passes
        worker = next(t for t in threading.enumerate() if t.name == "otel-train-spans")
        tid = worker.native_id
        before, t0 = _voluntary_switches(tid), time.monotonic()
        time.sleep(2.0)
        wakes = (_voluntary_switches(tid) - before) / (time.monotonic() - t0)
    finally:
        run.shutdown(timeout=10)
    print(f"span worker wake-ups a second while the run is idle: {wakes:.1f}")
    assert wakes <= 8, wakes
