"""What the exporter process settled of the step ring (ring_settle.py), and what the training
process counts of it at the end (ring_link.py ``unsettled_ring_spans``): the ring's room is
freed only after the count report saying so was written, so the training process, reading
its last report, counts each span the child never reported on once, and none twice."""

from __future__ import annotations

import marshal
import time
from pathlib import Path
from typing import Any

import pytest
from ring_helpers import FeedChild, RingExporter, make_feed, train_into
from train_helpers import clean_env  # noqa: F401  (autouse fixture)

from otel_train.common.drop_counter import DropCounter
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.common.sdk_config import ExportPlan
from otel_train.export.process import child as child_module
from otel_train.export.process.derived_link import DerivedMetricsLink
from otel_train.export.process.lifecycle import ClientLifecycle
from otel_train.export.process.reports import ChildReports
from otel_train.export.process.ring_link import RingClientPart
from otel_train.pipeline.ring_source import RingSource
from otel_train.recording.recorder import Recorder
from otel_train.recording.step_ring import StepRing
from otel_train.recording.step_ring_reader import unread_step_spans

pytestmark = pytest.mark.timeout(60)


def _ring_with_steps(steps: int, capacity_bytes: int = 1 << 16) -> tuple[StepRing, Recorder]:
    rec = Recorder(100, DropCounter(), None)
    ring = StepRing.create(capacity_bytes)
    RingSource(rec, ring, exporter=RingExporter())
    train_into(rec, range(steps), queued_at=())
    return ring, rec


class _Client(RingClientPart):
    """The client's part that counts the ring at the end, with the reports it read."""

    def __init__(self, ring: StepRing, reports: ChildReports, taken_over: bool) -> None:
        self._ring = ring
        self._reports = reports
        self._lifecycle = ClientLifecycle()
        if taken_over:
            self._lifecycle.take_over()
        self._lifecycle.close()
        self.resent_spans = 0


def _reports() -> ChildReports:
    import logging

    warn = RateLimitedLogger(logging.getLogger("otel_train"))
    return ChildReports(ClientLifecycle(), DropCounter(), DerivedMetricsLink(warn), warn,
                        ring=True)


def test_the_end_counts_the_ring_past_the_position_last_reported_less_its_settled_spans():
    ring, rec = _ring_with_steps(5)  # 3 spans a step (root, data, forward)
    feed = make_feed(ring, FeedChild())
    feed.catch_up(time.monotonic() + 5)  # a hand-over of five steps
    train_into(rec, range(5, 10), queued_at=())
    feed.catch_up(time.monotonic() + 5)  # and one of five more
    settlement = feed.settlement
    settlement.settle(3 * 5 + 2, partial=True)  # the first, and two spans of the second
    reported = feed.counts()
    assert reported["ring_partial_spans"] == 2
    assert unread_step_spans(ring, reported["ring_position"]) == 5 * 3
    settlement.release_settled()
    # The child settles further (the tail moves) and is killed before that report is read:
    # the training process counts from what it read, not from the tail.
    settlement.settle(3 * 10, partial=True)
    settlement.release_settled()
    assert ring.counters()["tail"] == ring.counters()["head"] > reported["ring_position"]
    reports = _reports()
    reports.take([marshal.dumps(("stats", 17, 0, {}, 0, reported))])
    client = _Client(ring, reports, False)
    assert client.unsettled_ring_spans() == 30 - 17  # each span the counts read miss, once
    # No report read with a position, or the ring read here after a take-over (closed since): from tail.
    assert _Client(ring, _reports(), False).unsettled_ring_spans() == 0
    assert _Client(ring, reports, True).unsettled_ring_spans() == 0


def test_a_position_the_producer_has_lapped_is_not_walked_and_the_tail_is_counted_from():
    ring, rec = _ring_with_steps(20, capacity_bytes=4096)
    feed = make_feed(ring, FeedChild())
    feed.catch_up(time.monotonic() + 5)
    feed.settlement.settle(0, partial=True)
    reported = feed.counts()  # nothing settled: the ring's start
    feed.settlement.settle(10**6, partial=True)  # then all, in a report never read
    feed.settlement.release_settled()
    train_into(rec, range(20, 60), queued_at=())  # the producer laps the reported position
    counters = ring.counters()
    assert counters["head"] - reported["ring_position"] > ring.capacity
    assert counters["dropped_steps"] == 0
    reports = _reports()
    reports.take([marshal.dumps(("stats", 0, 0, {}, 0, reported))])
    client = _Client(ring, reports, False)
    assert client.unsettled_ring_spans() == unread_step_spans(ring) == 40 * 3


class _Writer:
    """The child's report pipe: ``full`` while it takes nothing."""

    def __init__(self) -> None:
        self.full = True
        self.sent: list[tuple[Any, ...]] = []

    def send(self, msg: tuple[Any, ...], block: bool = False) -> bool:
        if self.full:
            return False
        self.sent.append(msg)
        return True


def test_a_count_report_not_written_frees_no_room_and_the_next_one_does(tmp_path: Path):
    ring, _ = _ring_with_steps(5)
    writer = _Writer()
    plan = ExportPlan(kind="jsonl", path=tmp_path / "spans.jsonl")
    config = {"plan": plan, "resource": ({"service.name": "settle"}, None),
              "scope": ("otel-train", "1", None), "run_constants": {}, "max_queue": 1000,
              "batch": 512, "interval": 60.0, "parent_pid": 1, "ring_fd": ring.fd}
    child = child_module._Child(writer, config)  # type: ignore[arg-type]
    try:
        feed = make_feed(ring, FeedChild())
        child.ring_feed = feed
        feed.catch_up(time.monotonic() + 5)
        child.drops.add("shutdown_timeout", 15)  # every span of the five steps, settled
        child.stats()
        assert writer.sent == [] and ring.counters()["tail"] == 0  # the report is not out
        writer.full = False
        child.stats()
        (report,) = writer.sent
        assert report[3] == {"shutdown_timeout": 15}
        assert ring.counters()["tail"] == report[5]["ring_position"] == ring.counters()["head"]
    finally:
        child.export.shutdown(1.0)
