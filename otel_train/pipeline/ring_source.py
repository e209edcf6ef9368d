"""The step ring read in the training process: the span worker's records, in order.

With ``step_ring="on"`` the hot path writes finished flat steps into the shared-memory ring
(``recording/step_ring.py``) and queues only what the ring cannot carry, a marker in the
ring holding each one's place. ``RingSource.refill`` reads the ring and puts its steps, and
for each marker the queue's next record, into ``pending``: the one ordered sequence the span
worker drains, exactly as it drains the recorder's queue without a ring.

Usage::

    source = RingSource(recorder, StepRing.create(ring_capacity_bytes(4096)))
    source.refill(); record = source.pending.popleft()
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from otel_train.recording.step_ring import QUEUED, StepRing, attach_ring, detach_ring
from otel_train.recording.step_ring_reader import StepRingReader

__all__ = ["RingSource"]


class RingSource:
    """The ring and the recorder's queue merged back into one ordered deque (``pending``)."""

    def __init__(self, recorder: Any, ring: StepRing) -> None:
        self._recorder = recorder
        self.ring = ring
        self._reader = StepRingReader(ring)
        self.pending: deque[Any] = deque()
        # One reader at a time (the ring has one consumer): the worker's looks, a drain on
        # the training thread (run.flush), the count at shutdown.
        self._lock = threading.Lock()
        attach_ring(recorder, ring)

    def refill(self) -> int:
        """Move what the ring holds now into ``pending``; the number of records moved."""
        with self._lock:
            return self._refill_locked()

    def _refill_locked(self) -> int:
        queue = self._recorder.queue
        pending = self.pending
        moved = 0
        for item in self._reader.read():
            if item is QUEUED:
                try:
                    item = queue.popleft()
                except IndexError:  # the queue was emptied under it (shutdown): skip
                    continue
            pending.append(item)
            moved += 1
        return moved

    def waiting_spans(self) -> int:
        """Spans still unread in the ring or pending here (counted when a run ends early)."""
        self.refill()
        return sum(r.span_count() for r in self.pending)

    def detach(self) -> None:
        """The recorder queues every record again (what the ring holds stays readable)."""
        detach_ring(self._recorder)
