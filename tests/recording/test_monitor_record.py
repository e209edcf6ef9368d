"""Monitoring between steps: one record per operation, queued when it ends, once.
Checkpoints (``CheckpointRecord``): run.checkpoint() and run.monitor("checkpoint") make the same
train.checkpoint span; inside a step, a monitoring phase."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_helpers import clean_env, one, run_spans, start_test_run  # noqa: F401

from otel_train.common import attributes as A
from otel_train.common.drop_counter import DropCounter
from otel_train.recording.monitor_record import CheckpointRecord, MonitorRecord
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


def test_run_checkpoint_and_run_monitor_checkpoint_make_the_same_span(tmp_path: Path) -> None:
    with start_test_run(tmp_path) as run:
        for step in run.steps(range(2)):
            with step.phase("forward"):
                pass
            if step.index == 0:
                with run.checkpoint() as phase:  # inside a step: a monitoring phase
                    assert not isinstance(phase, CheckpointRecord)
        with run.checkpoint("load") as op:
            assert isinstance(op, CheckpointRecord)
        with run.monitor("checkpoint") as op:
            assert isinstance(op, CheckpointRecord)
    spans = run_spans(run)
    ops = [s for s in spans if s.name == A.CHECKPOINT_SPAN_NAME]
    assert [s.attributes[A.CHECKPOINT_ACTION] for s in ops] == ["load", "save"]
    assert all(s.is_root and s.attributes[A.PHASE] == A.CHECKPOINT_OPERATION for s in ops)
    inside = one(spans, A.CHECKPOINT_OPERATION, **{A.STEP: 0})
    assert inside.attributes[A.PHASE_KIND] == A.KIND_MONITOR and not inside.is_root
    # The costs list them as the operation "checkpoint", as before.
    assert "checkpoint" in run.costs()["operations"]


def test_an_unknown_action_is_refused_naming_the_rule(tmp_path: Path) -> None:
    with start_test_run(tmp_path) as run:
        with pytest.raises(ValueError, match=r"action must be one of save, load"):
            run.checkpoint("backup")
