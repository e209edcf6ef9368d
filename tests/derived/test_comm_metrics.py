"""Collective counters per op and rank, exposed wait and own work, from real step records."""

from __future__ import annotations

import marshal
import time

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client import CollectorRegistry, generate_latest
from train_helpers import clean_env  # noqa: F401  (clean_env: autouse)

from otel_train.common import attributes as A
from otel_train.common.drop_counter import DropCounter
from otel_train.common.identity import RunIdentity
from otel_train.derived.comm_metrics import CommMetricsSpanProcessor
from otel_train.recording.collectives import (
    E_END,
    E_START,
    KIND_BLOCKING,
    KIND_OVERLAPPED,
    CollectiveLog,
)
from otel_train.recording.recorder import Recorder, Step
from otel_train.records.span_rows import view_from_record
from otel_train.records.step_records import StepRecordBuilder
from otel_train.records.steps_view import SharedStepSpanProcessor

pytestmark = pytest.mark.timeout(30)
MS = 1_000_000


def _builder() -> StepRecordBuilder:
    builder = StepRecordBuilder(RunIdentity("run-m", 1, 2, 1, "option"), Resource.create({}),
                                InstrumentationScope("otel_train"), False, "cpu",
                                lambda tid: True, 0)
    builder.collectives = CollectiveLog()
    return builder


def _step_with_wait(builder: StepRecordBuilder, rec: Recorder, index: int,
                    wait_ms: float, monitor_ms: float = 0.0) -> tuple:
    """A step whose backward hands over one bucket and waits ``wait_ms`` for it, plus one
    blocking 1 ms broadcast; ``monitor_ms`` of monitoring."""
    log = builder.collectives
    step = Step(rec, index, "train")
    with step.phase("forward"):
        time.sleep(0.004)
    with step.phase("backward"):
        bucket = log.begin("all_reduce", 4096, KIND_OVERLAPPED)
        time.sleep(wait_ms / 1000)
        log.end(bucket)
        cast = log.begin("broadcast", 8, KIND_BLOCKING)
        cast[E_END] = cast[E_START] + 1 * MS
    if monitor_ms:
        with step.monitor("inference"):
            time.sleep(monitor_ms / 1000)
    step._finish(None)
    return builder.record(step)


def test_counters_per_op_and_own_work_are_training_time_minus_the_wait() -> None:
    builder, rec = _builder(), Recorder(10, DropCounter(), None)
    records = [_step_with_wait(builder, rec, 0, 20, monitor_ms=10),
               _step_with_wait(builder, rec, 1, 5)]
    comm = CommMetricsSpanProcessor()
    registry = CollectorRegistry()
    comm.register_on(registry)
    views = [view_from_record(r, 1) for r in records]
    SharedStepSpanProcessor([comm]).on_views(views)
    for rec_, view in zip(records, views):
        attrs = rec_[6]
        training = (view.duration_ns - view.monitor_ns) / 1e9
        # own work = training time (monitoring excluded) - the time waited in collectives
        assert attrs[A.OWN_WORK_SECONDS] == pytest.approx(
            training - attrs[A.COMM_EXPOSED_SECONDS])
        assert attrs[A.COMM_EXPOSED_SECONDS] >= attrs[A.COMM_SECONDS] - 0.0015
    text = generate_latest(registry).decode()
    print(text)
    assert 'otel_train_collectives_total{op="all_reduce",rank="1"} 2.0' in text
    assert 'otel_train_collectives_total{op="broadcast",rank="1"} 2.0' in text
    assert 'otel_train_collective_bytes_total{op="all_reduce",rank="1"} 8192.0' in text
    waited = sum(r[6][A.COMM_EXPOSED_SECONDS] for r in records)
    assert comm.exposed_seconds["1"] == pytest.approx(waited)
    assert waited >= 0.025 + 0.002  # both buckets' waits and both broadcasts
    assert comm.own_work_seconds["1"] == pytest.approx(
        sum(r[6][A.OWN_WORK_SECONDS] for r in records))


def test_a_step_without_collectives_counts_its_training_time_as_own_work() -> None:
    builder, rec = _builder(), Recorder(10, DropCounter(), None)
    step = Step(rec, 0, "train")
    with step.phase("forward"):
        time.sleep(0.002)
    step._finish(None)
    record = builder.record(step)
    comm = CommMetricsSpanProcessor()
    view = view_from_record(record, 0)
    SharedStepSpanProcessor([comm]).on_views([view])
    assert comm.own_work_seconds["0"] == pytest.approx(view.duration_ns / 1e9)
    assert A.OWN_WORK_SECONDS not in record[6] and not comm.by_op and not comm.exposed_seconds


def test_a_copy_loaded_from_the_state_serves_the_same_counters() -> None:
    builder, rec = _builder(), Recorder(10, DropCounter(), None)
    comm = CommMetricsSpanProcessor()
    SharedStepSpanProcessor([comm]).on_views(
        [view_from_record(_step_with_wait(builder, rec, 0, 2), 0)])
    copy = CommMetricsSpanProcessor()
    copy.load_state(marshal.loads(marshal.dumps(comm.export_state())))
    assert [m.samples for m in copy.collect()] == [m.samples for m in comm.collect()]
