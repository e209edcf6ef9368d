"""Helpers for the tests of the step ring read in the exporter process (tests/export/
process/test_ring_feed.py, test_ring_settle.py): what the feed calls of the child and of the
client, a builder and a feed over a ring, and steps trained into a ring."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_train.common.drop_counter import DropCounter
from otel_train.common.identity import RunIdentity
from otel_train.export.process.ring_feed import ChildRingFeed
from otel_train.pipeline.ring_source import ring_settings
from otel_train.recording.recorder import Recorder
from otel_train.recording.step_ring import StepRing
from otel_train.records.span_rows import C_ATTRS, C_NAME, record_span_count
from otel_train.records.step_records import StepRecordBuilder

IDENT = RunIdentity("feed", 0, 1, 0, "option")
RESOURCE = Resource({"service.name": "feed"})
SCOPE = InstrumentationScope("otel-train", "1")
OFFSET = 10**18


class FeedChild:
    """What the feed calls of the exporter process's child: its spans path and drops."""

    def __init__(self) -> None:
        self.drops = DropCounter()
        self.handed: list[tuple[list[Any], list[Any]]] = []

    def spans(self, recs: list[Any], rows: list[Any], parent_cost_ns: int,
              fed: bool = False, count: bool = False) -> int:
        self.handed.append((list(recs), list(rows)))
        return sum(map(record_span_count, recs)) + len(rows)

    def names(self) -> list[str]:
        return [f"{r[C_NAME]}:{r[C_ATTRS].get('train.step')}" for recs, _ in self.handed
                for r in recs]


class RingExporter:
    """What the training process's RingSource calls of the client while the child reads."""

    taken_over = False

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    def send_control(self, msg: tuple[Any, ...]) -> None:
        self.sent.append(msg)

    def notice_exit(self) -> None:
        """A drain asks whether the child died: it never does here."""

    def settled_ring_position(self) -> int | None:
        """The position the child's last report settled: none here."""
        return None


def ring_builder() -> StepRecordBuilder:
    return StepRecordBuilder(IDENT, RESOURCE, SCOPE, False, "cpu", lambda t: True, OFFSET)


def make_feed(ring: StepRing, child: FeedChild, startup: Any = None) -> ChildRingFeed:
    settings = ring_settings(ring_builder(), IDENT, False, "cpu", "host", startup)
    feed = ChildRingFeed(child, ring.fd, settings, (dict(RESOURCE.attributes), None),
                         ("otel-train", "1"))
    feed.set_ready(None)
    return feed


def train_into(rec: Recorder, steps: range, queued_at: tuple[int, ...]) -> None:
    for step in rec.steps(steps, "train"):
        with step.phase("forward"):
            pass
        if step.index in queued_at:
            step.set_attribute("weights", [1.0, 2.0])  # a sequence: the queue's
