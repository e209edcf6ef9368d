"""The steps at the head of the ring reader's items taken in one go (ring_runs.py), and the
feed's pass with it against the same pass taking one step at a time: the same records, in
the same hand-overs, counts and positions, with markers (queued records, one never sent),
the run's first step and train.startup."""

from __future__ import annotations

import random
import time
from collections import deque
from typing import Any

import pytest
from train_helpers import clean_env  # noqa: F401  (autouse fixture)

from ring_helpers import FeedChild, RingExporter, make_feed, ring_builder, train_into

from otel_train.common.drop_counter import DropCounter
from otel_train.export.process import ring_feed
from otel_train.export.process.ring_runs import take_steps
from otel_train.pipeline.ring_source import RingSource
from otel_train.recording.recorder import Recorder
from otel_train.recording.step_ring import QUEUED, StepRing

pytestmark = pytest.mark.timeout(60)


def test_take_steps_pops_the_steps_before_the_first_marker_and_returns_the_last_end():
    items = deque([("a", 8, -1), ("b", 16, -1), (QUEUED, 24, 0), ("c", 32, -1)])
    run: list[Any] = ["z"]
    assert take_steps(items, run) == 16
    assert run == ["z", "a", "b"] and list(items) == [(QUEUED, 24, 0), ("c", 32, -1)]
    items.popleft()
    assert take_steps(items, run) == 32 and run[-1] == "c" and not items


def _one_step(items: deque[tuple[Any, int, int]], run: list[Any]) -> int:
    """The general path: one step taken, as the pass's loop takes it."""
    item, end, _ = items.popleft()
    run.append(item)
    return end


class _Startup:
    """A train.startup maker (``run.py``'s): one record before the first step's."""

    done = False
    first_step_attributes = {"train.resumed": True}

    def record(self, first_start_ns: int, ready_ns: int | None) -> tuple[Any, ...]:
        return ("train.startup", 5, 6, 1, first_start_ns, first_start_ns + 1, {}, None, (),
                None, None)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_pass_taking_runs_at_once_hands_on_what_it_hands_on_a_step_at_a_time(
        monkeypatch, seed):
    rng = random.Random(seed)
    queued_at = tuple(sorted(rng.sample(range(60), 6)))

    monkeypatch.setattr(ring_feed, "MARKER_WAIT_SECONDS", 0.0)
    rec = Recorder(200, DropCounter(), None)
    ring = StepRing.create(1 << 16)
    RingSource(rec, ring, exporter=RingExporter())
    train_into(rec, range(60), queued_at=queued_at)
    builder = ring_builder()
    queued = []
    while rec.queue:
        queued.append(builder.record(rec.queue.popleft()))

    def feed_once(take: Any) -> tuple[Any, ...]:
        monkeypatch.setattr(ring_feed, "take_steps", take)
        child = FeedChild()
        feed = make_feed(ring, child, startup=_Startup())  # from tail: the tail stays put
        # the queued records but the third come in one frame; the third never does
        ordinals = [i for i in range(len(queued)) if i != 2]
        feed.add_frame([queued[i] for i in ordinals], [], 0, ordinals)
        random.seed(seed)
        feed.catch_up(time.monotonic() + 10)
        # each hand-over's mark: the stage's input then and the ring position it ends at
        return child.handed, feed.counts(), list(feed.settlement._marks)

    fast = feed_once(take_steps)
    general = feed_once(_one_step)
    assert fast[0] == general[0]  # the same records in the same hand-overs
    assert fast[1:] == general[1:]
    names = [r[0] for recs, _ in fast[0] for r in recs]
    assert names[0] == "train.startup" and names.count("train.step") == 59
    assert fast[1]["markers_unmatched"] == 1
