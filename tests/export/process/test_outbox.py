"""Frames waiting for the exporter process's pipe: bounded in spans, written without blocking,
handed back whole at a take-over. Real pipes."""

from __future__ import annotations

import logging
import marshal
import os
from collections.abc import Iterator

import pytest

from otel_train.common.drop_counter import DropCounter
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.export.process.outbox import Outbox
from otel_train.export.process.pipe import FrameReader


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    yield r, w
    os.close(r)
    os.close(w)


def _outbox(max_queued_spans: int, drops: DropCounter) -> Outbox:
    return Outbox(max_queued_spans, drops, RateLimitedLogger(logging.getLogger("test")))


def _spans(i: int) -> bytes:
    return marshal.dumps(("spans", [("rec", i)], [], 0))


def test_past_the_bound_the_oldest_whole_frames_are_dropped_and_the_newest_stays() -> None:
    drops = DropCounter()
    outbox = _outbox(10, drops)
    for i in range(4):
        outbox.queue(_spans(i), 4)
    outbox.queue(marshal.dumps(("flush", 1, 1.0)), 0)  # a control frame evicts nothing
    outbox.queue(_spans(9), 30)  # alone over the bound: it stays all the same
    assert drops.counts() == {"export_queue_full": 16}
    left, cut = outbox.take_unsent()
    assert [recs for recs, _, _ in left] == [[], [("rec", 9)]] and cut == 0
    assert outbox.spans == 0 and not outbox.frames


def test_frames_go_whole_into_the_pipe_and_count_as_sent(pipe: tuple[int, int]) -> None:
    r, w = pipe
    outbox = _outbox(100, DropCounter())
    outbox.queue(_spans(1), 3)
    outbox.queue(_spans(2), 5)
    assert outbox.write_to(w) is True
    assert outbox.sent_spans == 8 and outbox.spans == 0
    frames = FrameReader(r).read_available()
    assert [marshal.loads(f)[1] for f in frames] == [[("rec", 1)], [("rec", 2)]]


def test_a_full_pipe_keeps_the_rest_and_a_frame_cut_half_way_is_never_dropped_nor_lost(
        pipe: tuple[int, int]) -> None:
    r, w = pipe
    drops = DropCounter()
    outbox = _outbox(10, drops)
    big = marshal.dumps(("spans", [("rec", "x" * 200_000)], [], 0))  # more than a pipe holds
    outbox.queue(big, 6)
    assert outbox.write_to(w) is False  # part of it went in
    outbox.queue(_spans(2), 6)
    outbox.queue(_spans(3), 6)  # over the bound: the half-written frame is not the victim
    assert drops.counts() == {"export_queue_full": 6}
    left, cut = outbox.take_unsent()
    # The half-written frame never reached the exporter process whole: it is handed back
    # to be exported from here at a take-over, before the frames after it.
    assert cut == 0
    assert [recs for recs, _, _ in left] == [[("rec", "x" * 200_000)], [("rec", 3)]]


def test_an_unsent_frame_says_whether_its_records_were_fed_here_when_it_was_queued() -> None:
    outbox = _outbox(100, DropCounter())
    outbox.queue(marshal.dumps(("spans", [("rec", 1)], [], 0, True)), 1)
    outbox.queue(marshal.dumps(("spans", [("rec", 2)], [], 0, False)), 1)
    left, _ = outbox.take_unsent()
    assert [(recs, fed) for recs, _, fed in left] == [([("rec", 1)], True), ([("rec", 2)], False)]


def test_frames_the_child_has_not_settled_are_handed_back_and_settled_ones_let_go(
        pipe: tuple[int, int]) -> None:
    _, w = pipe
    outbox = _outbox(100, DropCounter())
    for i, spans in enumerate((3, 5, 4)):
        outbox.queue(_spans(i), spans)
    assert outbox.write_to(w) is True and outbox.sent_spans == 12
    outbox.unconfirmed.settled(9)  # the first 3 spans settled: the first frame goes
    assert outbox.unconfirmed.spans == 9
    # The child settles in order: of the last 6 spans unaccounted for, the second frame's
    # first 3 were settled too (skip them), the third frame is wholly unsettled.
    frames, skip, missing = outbox.unconfirmed.take(6)
    assert [recs for recs, _, _ in frames] == [[("rec", 1)], [("rec", 2)]]
    assert (skip, missing) == (3, 0) and outbox.unconfirmed.spans == 0


def test_past_its_bound_the_oldest_unconfirmed_frame_is_let_go_and_counted_missing(
        pipe: tuple[int, int]) -> None:
    _, w = pipe
    outbox = _outbox(5, DropCounter())  # unconfirmed frames kept up to 10 spans
    for i in range(3):
        outbox.queue(_spans(i), 4)
        assert outbox.write_to(w) is True
    frames, skip, missing = outbox.unconfirmed.take(12)
    assert [recs for recs, _, _ in frames] == [[("rec", 1)], [("rec", 2)]]
    assert (skip, missing) == (0, 4)
    outbox.unconfirmed.forget()  # a sampled run: nothing is kept from now on
    outbox.queue(_spans(9), 4)
    assert outbox.write_to(w) is True and outbox.unconfirmed.take(4) == ([], 0, 4)
