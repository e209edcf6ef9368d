"""Monitoring between steps: one record per operation, queued when it ends, once."""

from __future__ import annotations

import pytest

from otel_train.common.drop_counter import DropCounter
from otel_train.recording.monitor_record import MonitorRecord
from otel_train.recording.recorder import Recorder


def test_a_monitor_record_times_its_block_and_is_queued_once_when_it_ends():
    rec = Recorder(10, DropCounter(), None)
    rec.next_index = 5  # five steps ran before it
    with MonitorRecord(rec, "final_eval") as op:
        assert rec.open_record is op
        op.set_attribute("eval.examples", 100)
    op.end()  # a second end is harmless
    assert list(rec.queue) == [op] and rec.open_record is None
    assert (op.name, op.after_step, op.attrs) == ("final_eval", 4, {"eval.examples": 100})
    assert 0 < op.start_ns <= op.end_ns and op.error is None and op.span_count() == 1


def test_a_monitor_record_takes_given_timestamps_and_keeps_the_error():
    rec = Recorder(10, DropCounter(), None)
    op = MonitorRecord(rec, "snapshot").start(start_ns=100)
    error = OSError("disk full")
    op.end(end_ns=250, error=error)
    assert (op.start_ns, op.end_ns, op.error) == (100, 250, error)


def test_a_full_queue_counts_the_record_as_dropped_and_a_bad_key_is_refused():
    drops = DropCounter()
    rec = Recorder(0, drops, None)
    op = MonitorRecord(rec, "snapshot")
    with pytest.raises(ValueError, match="non-empty string"):
        op.set_attribute("", 1)
    with op:
        pass
    assert list(rec.queue) == [] and drops.counts() == {"record_queue_full": 1}
