"""Frames waiting in the training process for the exporter process's pipe: bounded, counted.

The pipe is written without blocking; what it does not take waits here, up to
``max_queued_spans`` spans. Beyond, the oldest whole frames of spans are dropped and counted
(``export_queue_full``): the newest spans are the most useful, and the newest frame (one
drain's spans) always stays. A frame partly in the pipe must finish, or the stream would
break; a control frame (no spans) evicts nothing.

Usage::

    outbox = Outbox(max_queued_spans, drops, warn)
    outbox.queue(marshal.dumps(("spans", recs, rows, cost, fed)), spans)
    empty = outbox.write_to(fd)          # what the pipe takes now
    left, cut = outbox.take_unsent()     # on take-over: (recs, rows, fed) not wholly written

Frames written wholly stay at hand (``Unconfirmed``) until the exporter process reports their
spans settled (delivered, dropped or sampled out), so that what it never confirmed can be
exported again from the training process should it die.
"""

from __future__ import annotations

import errno
import marshal
import os
from collections import deque
from typing import Any

from otel_train.common.drop_counter import DropCounter
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.export.process.pipe import HEADER, frame

# An entry: [bytes left to write, spans in the frame, partly written?, the whole frame]
_LEFT, _SPANS, _STARTED, _PAYLOAD = 0, 1, 2, 3


class Unconfirmed:
    """Frames of spans written wholly to the exporter process and not yet settled there.

    The exporter process settles spans in the order it got them (its queue is first in,
    first out: a batch delivered, failed or dropped is always its oldest spans), so the spans
    it has not reported on are the *last* ones sent: the newest frames here, the oldest of
    them perhaps in part. Bounded at ``max_spans`` (past it the oldest frame is let go: its
    spans, if never confirmed, are counted lost instead of sent again).
    """

    def __init__(self, max_spans: int) -> None:
        self.frames: deque[tuple[bytes, int]] = deque()  # (frame, spans), oldest first
        self.spans = 0
        self.enabled = True
        self._max_spans = max_spans

    def add(self, data: bytes, spans: int) -> None:
        """A frame (header and payload) of ``spans`` spans went wholly into the pipe."""
        if not self.enabled or not spans:
            return
        self.frames.append((data, spans))
        self.spans += spans
        while self.spans > self._max_spans and len(self.frames) > 1:
            self.spans -= self.frames.popleft()[1]

    def settled(self, unaccounted: int) -> None:
        """The exporter process has reported on all but the last ``unaccounted`` spans sent:
        let go of the frames wholly before them."""
        frames = self.frames
        while frames and self.spans - frames[0][1] >= unaccounted:
            self.spans -= frames.popleft()[1]

    def take(self, unaccounted: int) -> tuple[list[tuple[list[Any], list[Any], bool]], int,
                                              int]:
        """Empty it: the (records, rows, fed) of the frames holding the last ``unaccounted``
        spans sent, how many spans at the head of the first of them were settled already
        (to skip), and how many unaccounted spans are no longer here (let go at the bound)."""
        self.settled(unaccounted)
        missing = max(0, unaccounted - self.spans)
        skip = max(0, self.spans - unaccounted)
        frames = [_frame_spans(memoryview(data)) for data, _ in self.frames]
        self.frames.clear()
        self.spans = 0
        return frames, skip, missing

    def forget(self) -> None:
        """Track nothing from now on (a sampled run, a fork, no stage to send again to)."""
        self.enabled = False
        self.frames = deque()
        self.spans = 0


class Outbox:
    """Frames not yet wholly in the pipe, bounded in spans; counts the spans sent."""

    def __init__(self, max_queued_spans: int, drops: DropCounter,
                 warn: RateLimitedLogger) -> None:
        # Frames in the child's hands: its queue holds up to max_queued_spans, the pipe more.
        self.unconfirmed = Unconfirmed(2 * max_queued_spans)
        self.frames: deque[list[Any]] = deque()
        self.spans = 0  # spans in the frames waiting here
        self.sent_spans = 0  # spans whose frame went wholly into the pipe
        self._max_queued_spans = max_queued_spans
        self._drops = drops
        self._warn = warn

    def queue(self, payload: bytes, spans: int) -> None:
        """Queue one frame of ``spans`` spans; drop the oldest frames past the bound."""
        data = frame(payload)
        self.frames.append([memoryview(data), spans, False, data])
        self.spans += spans
        while spans and self.spans > self._max_queued_spans:
            victim = next((f for f in self.frames if f[_SPANS] and not f[_STARTED]), None)
            if victim is None or victim is self.frames[-1]:  # the newest frame stays
                break
            self.frames.remove(victim)
            self.spans -= victim[_SPANS]
            self._drops.add("export_queue_full", victim[_SPANS])
            self._warn.warning(
                "queue", "otel-train: the exporter process is not keeping up (%d spans "
                "waiting); dropping the oldest spans (counted in "
                "otel_train_spans_dropped_total)", self._max_queued_spans)

    def write_to(self, fd: int) -> bool:
        """Write what the pipe takes without blocking; True when nothing is left here."""
        frames = self.frames
        while frames:
            head = frames[0]
            try:
                n = os.write(fd, head[_LEFT])
            except BlockingIOError:
                return False
            except OSError as exc:  # the child is gone (EPIPE)
                if exc.errno != errno.EPIPE:
                    self._warn.warning("pipe", "otel-train: exporter pipe: %r", exc)
                return False
            head[_LEFT] = head[_LEFT][n:]
            head[_STARTED] = True
            if not head[_LEFT]:
                frames.popleft()
                self.spans -= head[_SPANS]
                self.sent_spans += head[_SPANS]
                self.unconfirmed.add(head[_PAYLOAD], head[_SPANS])
        return True

    def take_unsent(self) -> tuple[list[tuple[list[Any], list[Any], bool]], int]:
        """Empty the outbox: the (records, rows, fed here) of every frame not wholly in the
        pipe, oldest first, and the spans of those that could not be read back (none, but
        for a frame that is not ours). A frame cut half-way into the pipe is among them:
        the exporter process reads whole frames only, so it never had it."""
        left = []
        cut = 0
        for f in self.frames:
            spans = _frame_spans(memoryview(f[_PAYLOAD]))
            if f[_SPANS] and not spans[0] and not spans[1]:
                cut += f[_SPANS]
            left.append(spans)
        self.frames.clear()
        self.spans = 0
        return left, cut

    def clear(self) -> int:
        """Empty the outbox; the spans that were waiting."""
        unsent = self.spans
        self.frames.clear()
        self.spans = 0
        return unsent

    def forget(self) -> None:
        """In a forked training process: let go of the parent's frames, touching nothing."""
        self.frames = deque()
        self.spans = 0
        self.unconfirmed.forget()


def _frame_spans(view: memoryview) -> tuple[list[Any], list[Any], bool]:
    """(span records, user span rows, whether this process fed the records to its
    derived metrics when it queued them) of a frame not yet written (its header intact)."""
    try:
        data = bytes(view)
        (size,) = HEADER.unpack_from(data, 0)
        msg = marshal.loads(data[HEADER.size:HEADER.size + size])
        if msg[0] != "spans":
            return [], [], False
        return list(msg[1]), list(msg[2]), (len(msg) > 4 and bool(msg[4]))
    except Exception:
        return [], [], False
