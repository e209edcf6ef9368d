"""What the exporter process's export stage has settled of the step ring and of the frames.

The ring reader (``ring_feed.py``) hands the stage records in hand-overs: ring steps (and
``train.startup``), or a record from a frame of the training process with its user rows.
Each hand-over is marked with the stage's input count after it, the frames' spans after it
and the ring position after it. The stage is first in, first out, so once it has settled
(exported, dropped) as many spans as a mark's input count, the ring's room before the mark's
position can be freed.

The training process must be able to tell, from the last count report it read, which ring
spans the child has accounted for: should the child be killed before its final report, it
counts the rest itself (``shutdown_timeout``), each span once. So a report carries the ring
position it settled up to (``ring_position``) and the spans settled past it, in the hand-over
at the head of the marks (``ring_partial_spans``), and the room is freed only after the
report that says so was sent (``settle``, then the report, then ``release_settled``): the
training process's view of the ring (``tail``) is never ahead of the counts it read.

Usage::

    settlement = RingSettlement(reader)
    settlement.stage_in += handed; settlement.mark(position)   # each hand-over
    settlement.settle(exported + dropped, partial=True)        # before a count report
    report(settlement.counts()); settlement.release_settled()  # after it
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

from otel_train.common.rate_limited_log import RateLimitedLogger

__all__ = ["RingSettlement"]

_log = logging.getLogger("otel_train")


class RingSettlement:
    """The marks of the hand-overs to the export stage, and what of them is settled."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader
        self.stage_in = 0  # spans handed to the stage, or settled at once (counted dropped)
        self.frame_spans = 0  # of them, the frames' spans (from the training process)
        # Per hand-over: (stage input after it, frames' spans after it, ring position after).
        self._marks: deque[tuple[int, int, int]] = deque()
        self._lock = threading.Lock()
        self.frames_settled = 0  # the frames' spans the stage has settled
        self._settled_mark = (0, 0)  # (stage input, frames' spans) of the last mark settled
        self.position = reader.position  # the ring is settled up to here
        self.ring_partial_spans = 0  # ring spans settled past ``position``
        self._release_to: int | None = None
        self._warn = RateLimitedLogger(_log)

    def mark(self, position: int) -> None:
        """A hand-over ends here (the stage's input and the frames' spans as they are)."""
        with self._lock:
            self._marks.append((self.stage_in, self.frame_spans, position))

    def settle(self, stage_settled: int, partial: bool) -> None:
        """The stage has settled its first ``stage_settled`` spans: the ring is settled
        before the last hand-over wholly settled; the spans settled of the first hand-over
        not wholly settled are noted (``partial``: the stage's order is the hand-overs'
        order, there is no tail sampler) as the frames' (its spans are a frame's) or the
        ring's. The room is freed by ``release_settled``, after the report."""
        with self._lock:
            marks = self._marks
            while marks and marks[0][0] <= stage_settled:
                stage_in, frames, position = marks.popleft()
                self.position = self._release_to = position
                self.frames_settled = frames
                self._settled_mark = (stage_in, frames)
            before_in, before_frames = self._settled_mark
            self.ring_partial_spans = 0
            if partial and marks and stage_settled > before_in:
                stage_in, frames, _ = marks[0]
                settled = min(stage_in, stage_settled) - before_in
                if frames > before_frames:  # a frame's record and rows
                    self.frames_settled = before_frames + min(frames - before_frames, settled)
                else:  # ring steps (and the spans of ring steps counted dropped at once)
                    self.ring_partial_spans = settled

    def counts(self) -> dict[str, Any]:
        """What a count report carries of the settlement."""
        return {"frames_settled": self.frames_settled, "ring_position": self.position,
                "ring_partial_spans": self.ring_partial_spans}

    def release_settled(self) -> None:
        """Free the ring's room before the position settled (the report saying so is sent)."""
        with self._lock:
            release, self._release_to = self._release_to, None
        if release is None:
            return
        try:
            self._reader.release(release)
        except Exception as exc:
            self._warn.warning("ring", "otel-train: freeing the step ring: %r", exc)
