"""A step's collectives become its train.comm.* root attributes and one event per op."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from train_helpers import clean_env  # noqa: F401  (clean_env: autouse)

from otel_train.common import attributes as A
from otel_train.common.drop_counter import DropCounter
from otel_train.common.identity import RunIdentity
from otel_train.recording.collectives import (
    KIND_ASYNC,
    KIND_BLOCKING,
    KIND_OVERLAPPED,
    CollectiveLog,
)
from otel_train.recording.recorder import Recorder, Step
from otel_train.records.comm_summary import comm_summary
from otel_train.records.span_rows import rows_from_record
from otel_train.records.step_records import StepRecordBuilder

pytestmark = pytest.mark.timeout(30)
MS = 1_000_000


def _entry(op: str, nbytes: int, start_ms: float, end_ms: float, kind: int) -> list:
    return [op, nbytes, int(start_ms * MS), int(end_ms * MS), kind]


def test_overlapped_buckets_expose_the_wait_from_the_last_hand_over_to_the_thread_resuming(
        ) -> None:
    # Three DDP buckets handed over at 10, 20, 30 ms; the last completes at 45 ms and the
    # training thread ends backward at 47 ms: backward's compute ended at 30 ms (the last
    # bucket ready) and the step waited 17 ms more.
    entries = [_entry("all_reduce", 100, 10, 25, KIND_OVERLAPPED),
               _entry("all_reduce", 100, 20, 35, KIND_OVERLAPPED),
               _entry("all_reduce", 50, 30, 45, KIND_OVERLAPPED)]
    phases_ns = [0, 5 * MS, 5 * MS, 47 * MS, 47 * MS, 60 * MS]  # forward, backward, optimizer
    attrs, events = comm_summary(entries, 100 * MS, 0, phases_ns)
    assert attrs[A.COMM_COUNT] == 3 and attrs[A.COMM_BYTES] == 250
    assert attrs[A.COMM_SECONDS] == pytest.approx(0.045)  # 15 ms each, overlapped or not
    assert attrs[A.COMM_EXPOSED_SECONDS] == pytest.approx(0.017)
    # without a boundary after the completion, the wait runs to the step's end
    assert comm_summary(entries, 100 * MS, 0)[0][A.COMM_EXPOSED_SECONDS] == pytest.approx(0.070)
    assert events == ((A.COMM_EVENT, 10 * MS, {A.COMM_OP: "all_reduce", A.COMM_COUNT: 3,
                                               A.COMM_BYTES: 250,
                                               A.COMM_SECONDS: pytest.approx(0.045)}),)


def test_a_done_callback_that_stamps_after_backward_ended_is_cut_at_the_resumption() -> None:
    # torch wakes the thread waiting on a future before it runs the future's callbacks: the
    # stamp of the last bucket (52 ms) can come after backward ended (47 ms).
    entries = [_entry("all_reduce", 100, 10, 25, KIND_OVERLAPPED),
               _entry("all_reduce", 100, 30, 52, KIND_OVERLAPPED),
               _entry("broadcast", 8, 50, 51, KIND_BLOCKING)]  # in the next phase
    attrs, _ = comm_summary(entries, 100 * MS, 0, [0, 5 * MS, 5 * MS, 47 * MS, 49 * MS, 60 * MS])
    assert attrs[A.COMM_EXPOSED_SECONDS] == pytest.approx(0.017 + 0.001)
    assert attrs[A.COMM_SECONDS] == pytest.approx(0.015 + 0.017 + 0.001)


def test_blocking_calls_are_waited_in_full_and_async_ones_not_at_all() -> None:
    entries = [_entry("broadcast", 8, 0, 4, KIND_BLOCKING),
               _entry("all_gather_into_tensor", 16, 5, 9, KIND_ASYNC),
               _entry("all_gather_into_tensor", 16, 6, 0, KIND_ASYNC)]  # not done at the end
    attrs, events = comm_summary(entries, 10 * MS, 1000)
    assert attrs[A.COMM_EXPOSED_SECONDS] == pytest.approx(0.004)
    assert attrs[A.COMM_SECONDS] == pytest.approx(0.004 + 0.004 + 0.004)  # last: up to the end
    ops = {e[2][A.COMM_OP]: e for e in events}
    assert ops["all_gather_into_tensor"][2][A.COMM_COUNT] == 2
    assert ops["broadcast"][1] == 1000  # the offset turns stamps into epoch time


def test_the_builder_puts_the_step_s_collectives_on_its_root_only_when_there_are_some() -> None:
    builder = StepRecordBuilder(RunIdentity("run-c", 0, 2, 0, "option"),
                                Resource.create({}), InstrumentationScope("otel_train"), False,
                                "cpu", lambda tid: True, 0)
    rec = Recorder(10, DropCounter(), None)
    log = builder.collectives = CollectiveLog()
    step = Step(rec, 0, "train")
    with step.phase("backward"):
        log.end(log.begin("all_reduce", 4096, KIND_OVERLAPPED))
    step._finish(None)
    quiet = Step(rec, 1, "train")
    quiet._finish(None)
    rows = rows_from_record(builder.record(step))
    root = builder.factory.spans(rows)[-1]
    assert root.attributes[A.COMM_COUNT] == 1 and root.attributes[A.COMM_BYTES] == 4096
    assert [e.name for e in root.events] == [A.COMM_EVENT]
    assert root.events[0].attributes[A.COMM_OP] == "all_reduce"
    quiet_root = builder.factory.spans(rows_from_record(builder.record(quiet)))[-1]
    assert A.COMM_COUNT not in quiet_root.attributes and not quiet_root.events
    assert not log  # taken: the next step starts from an empty log
