"""CollectiveLog: entries appended where collectives happen, taken per step in order."""

from __future__ import annotations

import pytest

from otel_train.recording.collectives import (
    E_END,
    E_START,
    KIND_BLOCKING,
    KIND_OVERLAPPED,
    CollectiveLog,
)

pytestmark = pytest.mark.timeout(30)


def _at(log: CollectiveLog, start_ns: int, end_ns: int, op: str = "all_reduce") -> list:
    entry = log.begin(op, 8, KIND_OVERLAPPED)
    entry[E_START], entry[E_END] = start_ns, end_ns
    return entry


def test_begin_and_end_stamp_the_entry_in_place() -> None:
    log = CollectiveLog()
    entry = log.begin("broadcast", 64, KIND_BLOCKING)
    assert entry[E_END] == 0 and entry[E_START] > 0
    log.end(entry)
    assert entry[E_END] >= entry[E_START]


def test_a_step_takes_what_began_inside_it_and_leaves_later_entries_for_the_next() -> None:
    log = CollectiveLog()
    before = _at(log, 50, 60)  # between steps: belongs to no step
    first = _at(log, 110, 150)
    second = _at(log, 210, 260)
    assert log.take(100, 200) == [first]
    assert log.take(200, 300) == [second]
    assert not log and before not in log.take(0, 10**9)


def test_a_log_nobody_reads_keeps_only_the_newest_entries_and_counts_the_rest() -> None:
    log = CollectiveLog(max_entries=3)
    for i in range(5):
        _at(log, i, i + 1)
    assert log.dropped == 2
    assert [e[E_START] for e in log.take(0, 10)] == [2, 3, 4]


def test_waiting_for_running_collectives_ends_when_their_callbacks_have_run_or_at_the_bound():
    import threading
    import time

    from otel_train.recording.collectives import E_END, CollectiveLog

    log = CollectiveLog()
    assert log.wait_running(0.0)  # none runs
    entry = ["all_reduce", 16, time.perf_counter_ns(), 0, "allreduce"]
    log._entries.append(entry)
    assert not log.wait_running(0.01)  # still running at the bound

    def done() -> None:  # the process group's thread ends it a little later
        time.sleep(0.02)
        entry[E_END] = time.perf_counter_ns()

    threading.Thread(target=done).start()
    assert log.wait_running(2.0) and entry[E_END]
