"""The span worker drains the recorder's queue: a span record per step, the drain's views to
the derived metrics, then the records and the user spans' rows to the route's sink."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from train_helpers import clean_env, nested_step  # noqa: F401  (clean_env: autouse)

from otel_train.common.drop_counter import DropCounter
from otel_train.common.identity import RunIdentity
from otel_train.common.self_cost import COLD_STEP_NS_PER_SPAN, SelfCostMeter
from otel_train.pipeline.record_sinks import SinkExport
from otel_train.pipeline.span_worker import RowRoute, SpanBuildWorker
from otel_train.pipeline.user_spans import UserSpanRows
from otel_train.recording.recorder import Recorder
from otel_train.records.span_rows import record_span_count
from otel_train.records.step_records import StepRecordBuilder, epoch_offset_ns
from otel_train.records.steps_view import set_span_attribute

pytestmark = pytest.mark.timeout(30)

IDENT = RunIdentity("run-w", rank=0, world_size=1, local_rank=0, run_id_source="option")


def _builder() -> StepRecordBuilder:
    return StepRecordBuilder(IDENT, Resource.create({"service.name": "worker-test"}),
                             InstrumentationScope("otel_train", "0.1.0"), False, "cpu",
                             lambda tid: True, epoch_offset_ns())


class Sink:
    """Collects what the worker hands on."""

    def __init__(self) -> None:
        self.records: list[tuple] = []
        self.rows: list[tuple] = []
        self.closed = False

    def on_records(self, records, rows=()) -> None:
        self.records += records
        self.rows += rows

    def close(self) -> None:
        self.closed = True

    @property
    def spans(self) -> int:
        return sum(map(record_span_count, self.records)) + len(self.rows)


class Views:
    """Stands in for the derived metrics: the views of each drain, in order."""

    def __init__(self) -> None:
        self.drains: list[list] = []

    def on_views(self, views) -> None:
        self.drains.append(views)
        for view in views:
            set_span_attribute(view.span, "train.slow", True)  # as the slow-step processor


def _worker(rec: Recorder, sink, drops: DropCounter, metrics=None, user_rows=None
            ) -> SpanBuildWorker:
    route = RowRoute(metrics, SinkExport([sink]), IDENT.rank, user_rows)
    return SpanBuildWorker(rec, _builder(), route, drops, SelfCostMeter(), 0.01)


def test_a_drain_feeds_the_metrics_its_views_then_hands_the_marked_records_to_the_sink():
    drops = DropCounter()
    rec = Recorder(10, drops, None)
    for i in range(3):
        nested_step(rec, index=i)
    sink, views = Sink(), Views()
    worker = _worker(rec, sink, drops, metrics=views)
    assert worker.drain() == 3
    assert [len(d) for d in views.drains] == [3]  # one call for the whole drain
    assert [r[6]["train.step"] for r in sink.records] == [0, 1, 2]
    assert all(r[6]["train.slow"] for r in sink.records)  # marked before export
    assert worker.spans_built == sink.spans == 12


def test_a_step_long_enough_to_evict_the_caches_is_charged_cold_and_an_empty_one_warm():
    drops = DropCounter()
    rec = Recorder(10, drops, None)
    meter = SelfCostMeter(1_000.0, cold_ns_per_span=100_000.0)
    worker = SpanBuildWorker(rec, _builder(), RowRoute(None, SinkExport([Sink()]), IDENT.rank), drops,
                             meter, 0.01)
    empty = rec.begin_step(None, 0)
    with empty.phase("forward"):
        pass
    rec.finish_step(empty, None)
    long = rec.begin_step(None, 1)
    with long.phase("forward"):
        time.sleep(2 * COLD_STEP_NS_PER_SPAN / 1e9)  # the step's own work: 2 spans' worth
    rec.finish_step(long, None)
    assert worker.drain() == 2
    # 2 spans each: the empty step at 1 us a span, the long one at 100 us.
    assert meter.figures()["hot_path_us_per_step"] == (2 * 1.0 + 2 * 100.0) / 2


def test_user_spans_that_ended_go_as_rows_with_the_drain():
    drops = DropCounter()
    rec = Recorder(10, drops, None)
    user_rows = UserSpanRows(drops, max_rows=100)
    provider = TracerProvider()
    provider.add_span_processor(user_rows)
    with provider.get_tracer("user.code").start_as_current_span("attention-kernel"):
        pass
    nested_step(rec)
    sink = Sink()
    worker = _worker(rec, sink, drops, user_rows=user_rows)
    worker.drain()
    assert [r[0] for r in sink.rows] == ["attention-kernel"]
    assert sink.rows[0][12][0] == "user.code"  # the row keeps its scope
    assert user_rows.waiting == 0


def test_user_spans_past_the_bound_drop_the_oldest_and_after_stop_are_counted():
    drops = DropCounter()
    user_rows = UserSpanRows(drops, max_rows=2)
    provider = TracerProvider()
    provider.add_span_processor(user_rows)
    tracer = provider.get_tracer("user.code")
    for name in ("a", "b", "c"):
        with tracer.start_as_current_span(name):
            pass
    assert [r[0] for r in user_rows.take()] == ["b", "c"]
    assert drops.counts() == {"export_queue_full": 1}
    user_rows.close()
    with tracer.start_as_current_span("late"):
        pass
    assert user_rows.take() == []
    assert drops.counts() == {"export_queue_full": 1, "shutdown_timeout": 1}


def test_a_failing_sink_is_counted_and_warned_never_raised(caplog):
    drops = DropCounter()
    rec = Recorder(10, drops, None)

    class Boom(Sink):
        def on_records(self, records, rows=()) -> None:
            raise RuntimeError("sink bug")

    for i in range(3):
        nested_step(rec, index=i)
    worker = _worker(rec, Boom(), drops)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        worker.drain()
    assert drops.counts() == {"export_failed": 12}
    assert len([r for r in caplog.records if "sink bug" in r.getMessage()]) == 1


def test_a_record_that_cannot_be_built_is_counted_not_raised(caplog):
    drops = DropCounter()
    rec = Recorder(10, drops, None)
    nested_step(rec, index=0)
    bad = nested_step(rec, index=1)
    sink = Sink()
    worker = _worker(rec, sink, drops)
    bad.span_ids = "not a dict"  # makes building fail
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        worker.drain()
    assert drops.counts().get("build_error", 0) >= 1
    assert [r[6]["train.step"] for r in sink.records] == [0]


def test_the_background_thread_drains_the_queue():
    drops = DropCounter()
    rec = Recorder(10, drops, None)
    sink = Sink()
    worker = _worker(rec, sink, drops)
    worker.start()
    try:
        nested_step(rec)
        tick = threading.Event()
        for _ in range(200):
            if sink.spans == 4:
                break
            tick.wait(0.01)
        assert sink.spans == 4
    finally:
        worker.stop(1.0)
    assert sink.closed


def test_stop_counts_what_could_not_be_built_in_time():
    drops = DropCounter()
    rec = Recorder(10, drops, None)
    for i in range(3):
        nested_step(rec, index=i)
    worker = _worker(rec, Sink(), drops)  # never started: stop drains inline
    worker.stop(0.0)
    assert drops.counts() == {"shutdown_timeout": 12}
    assert not rec.queue


def test_stop_builds_what_is_queued_when_there_is_time():
    drops = DropCounter()
    rec = Recorder(10, drops, None)
    sink = Sink()
    worker = _worker(rec, sink, drops)
    worker.start()
    worker.paused = True
    for i in range(3):
        nested_step(rec, index=i)
    worker.stop(2.0)
    assert sink.spans == 12
    assert drops.total == 0


class _RacyQueue(deque):
    """A deque on which another thread pops the last record right after a `while q` check."""

    armed = False

    def __len__(self) -> int:
        n = deque.__len__(self)
        if self.armed and n:
            self.armed = False
            while deque.__len__(self):
                self.popleft()  # what a concurrent drain() on another thread does
        return n


def test_drain_survives_a_concurrent_drain_emptying_the_queue():
    drops = DropCounter()
    rec = Recorder(10, drops, None)
    nested_step(rec)
    racy = _RacyQueue(rec.queue)
    racy.armed = True
    rec.queue = racy
    worker = _worker(rec, Sink(), drops)
    worker.drain()  # must not raise


def test_the_console_drain_clock_opens_for_the_console_s_next_fast_line_only() -> None:
    """Early drains for the steps the console prints a fast line for: the next multiple of
    log_every, no sooner than the console's interval after the last (by step end times)."""
    from collections import deque
    from types import SimpleNamespace

    from otel_train.pipeline.drain_schedule import ConsoleDrainClock

    clock = ConsoleDrainClock(10, 1.0)
    queue: deque = deque()

    def step(index: int, end_s: float) -> SimpleNamespace:
        return SimpleNamespace(index=index, end_ns=int(end_s * 1e9))

    assert not clock.due(queue)  # nothing queued
    queue.append(step(0, 0.01))
    assert clock.due(queue)  # step 0: the first line
    queue.append(step(3, 0.04))
    assert not clock.due(queue)  # not a line's step yet
    queue.append(step(10, 0.11))
    assert not clock.due(queue)  # step 10 ends within half the interval: not yet
    queue.append(step(60, 0.52))
    assert clock.due(queue)  # half the interval on: the console may print here
    queue.append(step(70, 0.62))
    assert not clock.due(queue)
    queue.append(step(110, 1.03))
    assert clock.due(queue)  # the console's next line (1 s after step 0's) is queued
    assert not clock.due(queue)  # said once
    queue.append(SimpleNamespace(after_step=100, end_ns=0))  # a monitoring record
    assert not clock.due(queue)
    every = ConsoleDrainClock(5, 0.0)  # an explicit log_every: no interval
    assert every.due(deque([step(0, 0.0005)])) and every.due(deque([step(5, 0.001)]))
    assert not every.due(deque([step(7, 0.002)])) and every.due(deque([step(11, 0.003)]))
