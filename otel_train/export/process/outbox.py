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
    left, cut = outbox.take_unsent()     # on take-over: (recs, rows, fed) never written
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

# An entry: [bytes left to write, spans in the frame, partly written?]
_LEFT, _SPANS, _STARTED = 0, 1, 2


class Outbox:
    """Frames not yet wholly in the pipe, bounded in spans; counts the spans sent."""

    def __init__(self, max_queued_spans: int, drops: DropCounter,
                 warn: RateLimitedLogger) -> None:
        self.frames: deque[list[Any]] = deque()
        self.spans = 0  # spans in the frames waiting here
        self.sent_spans = 0  # spans whose frame went wholly into the pipe
        self._max_queued_spans = max_queued_spans
        self._drops = drops
        self._warn = warn

    def queue(self, payload: bytes, spans: int) -> None:
        """Queue one frame of ``spans`` spans; drop the oldest frames past the bound."""
        self.frames.append([memoryview(frame(payload)), spans, False])
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
        return True

    def take_unsent(self) -> tuple[list[tuple[list[Any], list[Any], bool]], int]:
        """Empty the outbox: the (records, rows, fed here) of frames never started, and the
        spans of a frame cut half-way into the pipe."""
        left = [_frame_spans(f[_LEFT]) for f in self.frames if not f[_STARTED]]
        cut = sum(f[_SPANS] for f in self.frames if f[_STARTED])
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
