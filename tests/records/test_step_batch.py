"""What step_records reads once a batch (step_batch.py): a run's trace ids from its copied
hash, which step classes can hold the rare fields."""

from __future__ import annotations

from otel_train.common.identity import step_trace_id
from otel_train.records.step_batch import may_carry_rare_fields


def test_a_run_s_trace_ids_from_its_copied_hash_equal_step_trace_id():
    from otel_train.records.step_batch import step_trace_ids

    for run_id in ("run-s", "é-run", ""):
        trace_id_of = step_trace_ids(run_id)
        for step in (0, 1, 9, 10, 12345, -3, 2**70, True):
            assert trace_id_of(step) == step_trace_id(run_id, step), (run_id, step)


def test_a_ring_step_cannot_carry_the_rare_fields_a_recorded_step_or_a_subclass_can():
    from otel_train.recording.recorder import Step
    from otel_train.recording.step_ring_reader import RingStep

    class Subclass(RingStep):  # takes new attributes
        pass

    assert not may_carry_rare_fields(RingStep)
    assert may_carry_rare_fields(Step) and may_carry_rare_fields(Subclass)
