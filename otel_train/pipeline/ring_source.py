"""The step ring's records for the span worker, in order: read here, or by the exporter process.

With ``step_ring="on"`` the hot path writes finished flat steps into the shared-memory ring
(``recording/step_ring.py``) and queues only what the ring cannot carry, a marker in the
ring holding each one's place. Two ways to read it:

- here (``exporter=None``): ``RingSource.refill`` reads the ring and puts its steps, and for
  each marker the queue's next record, into ``pending``: the one ordered sequence the span
  worker drains, exactly as it drains the recorder's queue without a ring;
- in the exporter process (``exporter``: its client, when the plan puts the derived metrics
  there): the child reads the ring (``export/process/ring_feed.py``) and the span worker
  drains the recorder's queue only, each record taken with its ordinal (``take_ordinal``:
  the n-th record queued since the ring was attached, held in the ring by the n-th marker).
  Nothing here runs per ring step. Should the child be given up, the next drain reads the
  ring here from the position the child's last report read here settled (``tail`` lags
  it by at most one report; the child moves it only past what it settled): the records of the
  markers already drained went in frames (sent again or exported by the client), so only
  the later markers take the queue's records, and the steps the child had read ahead are
  counted as sent again (``count_resent``).

Usage::

    source = RingSource(recorder, StepRing.create(ring_capacity_bytes(4096)))
    source.refill(); record = source.pending.popleft()
"""

from __future__ import annotations

import os
import pickle
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from otel_train.recording.step_ring import (
    OFF_COLLECTIVES,
    OFF_READ,
    QUEUED,
    U64,
    StepRing,
    StepRingWriter,
    attach_ring,
    detach_ring,
)
from otel_train.recording.step_ring_reader import StepRingReader

__all__ = ["RingCostCounts", "RingSource", "ring_settings"]


class RingSource:
    """The ring and the recorder's queue merged back into one ordered deque (``pending``),
    or, while the exporter process reads the ring, the recorder's queue alone."""

    def __init__(self, recorder: Any, ring: StepRing, exporter: Any = None,
                 settings: dict[str, Any] | None = None,
                 on_counts: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._recorder = recorder
        self.ring = ring
        self._writer = StepRingWriter(ring, recorder)
        self._reader = StepRingReader(ring)
        self.pending: deque[Any] = deque()
        # The exporter process's client while the child reads the ring; None: read here.
        self.exporter = exporter
        self.popped = 0  # queued records taken by the span worker (the next one's ordinal)
        self._drained_markers = 0  # markers below this were drained from the queue already
        self._ready_sent = False
        # One reader at a time (the ring has one consumer): the worker's looks, a drain on
        # the training thread (run.flush), the count at shutdown.
        self._lock = threading.Lock()
        attach_ring(recorder, ring, self._writer)
        if exporter is not None:  # the child reads the ring with these (ring_feed.py)
            if on_counts is not None:
                exporter.watch_ring_counts(on_counts)
            exporter.send_control(("ring", pickle.dumps(settings)))

    @property
    def in_child(self) -> bool:
        """The exporter process reads the ring (not given up)."""
        return self.exporter is not None

    @property
    def records(self) -> deque[Any]:
        """What the span worker drains: the queue while the child reads the ring, else the
        merged sequence."""
        return self._recorder.queue if self.exporter is not None else self.pending

    def take_ordinal(self) -> int:
        """The ordinal of the queued record the worker just took (child reading)."""
        ordinal = self.popped
        self.popped += 1
        return ordinal

    def look(self, ready_ns: int | None) -> None:
        """A look of the worker while the child reads: tell it once when ``start_run``
        returned (its train.startup record's cut)."""
        if self.exporter is not None and not self._ready_sent and ready_ns is not None:
            self._ready_sent = True
            self.exporter.send_control(("ring_ready", ready_ns))

    def note_collectives(self) -> None:
        """The run times collectives from now on (on the training thread, before the steps
        that issue them): said in the ring's header, so a reader in the exporter process
        waits for their entries from the first step written after it."""
        U64.pack_into(self.ring.buffer, OFF_COLLECTIVES, 1)

    def skip(self, ordinals: list[int]) -> None:
        """Queued records that will not reach the child (their build failed, counted): its
        reader passes their markers at once."""
        if self.exporter is not None:
            self.exporter.send_control(("ring_skip", ordinals))

    def send_collectives(self, log: Any) -> None:
        """While the child reads the ring: the collectives' entries completed since the
        last call, and the time up to which it has them all (its steps wait for it), at the
        worker's pace, not per step. None: nothing times collectives."""
        if self.exporter is None or log is None:
            return
        entries, complete_ns = log.take_completed()
        self.exporter.send_control(("collectives", entries, complete_ns))

    def refill(self, may_take_over: bool = True) -> int:
        """Move what the ring holds now into ``pending``; the number of records moved.
        While the child reads the ring, nothing, unless it was given up (``may_take_over``:
        the caller holds the drain, so no record is being taken meanwhile)."""
        with self._lock:
            if self.exporter is not None:
                if not may_take_over:
                    return 0
                if not self.exporter.taken_over:
                    # A drain (run.costs(), run.flush() too): a child that died since the
                    # worker's last look is noticed now, so the steps the ring holds count.
                    self.exporter.notice_exit()
                    if not self.exporter.taken_over:
                        return 0
                self._take_over()
            return self._refill_locked()

    def _take_over(self) -> None:
        """Read the ring here from where the child's counts leave off, as it left it."""
        reader = StepRingReader(self.ring)
        reader.know(self._writer.string_ids, self._writer.phase_ids)
        read_ahead = U64.unpack_from(self.ring.buffer, OFF_READ)[0]
        self._reader = reader
        self._drained_markers = self.popped
        self.exporter, exporter = None, self.exporter
        # The child's last report read there settled the ring up to ``settled`` (its room
        # is freed only after the report is sent, so tail may lag it): those steps are in
        # its counts, exported or dropped, and are not read again.
        settled = exporter.settled_ring_position()
        # The steps between that and where the child had read: handed on there, perhaps
        # exported in part; read again here (the batch in flight may arrive twice).
        resent = 0
        position = reader.position
        for item, end, ordinal in reader.read_items():
            if settled is not None and end <= settled:
                position = end
                continue
            if item is not QUEUED and position < read_ahead:
                resent += item.span_count()
            position = end
            self._put(item, ordinal)
        if resent:
            exporter.count_resent(resent)

    def _put(self, item: Any, ordinal: int) -> bool:
        if item is QUEUED:
            if 0 <= ordinal < self._drained_markers:
                return False  # drained already: its record went to the exporter process
            try:
                item = self._recorder.queue.popleft()
            except IndexError:  # the queue was emptied under it (shutdown): skip
                return False
        self.pending.append(item)
        return True

    def _refill_locked(self) -> int:
        moved = 0
        for item, _, ordinal in self._reader.read_items():
            moved += self._put(item, ordinal)
        return moved

    def before_last_drain(self, timeout_seconds: float) -> None:
        """The run ends: a child not up by now is given up (within ``timeout_seconds``), so
        the last drain reads the ring here if no child will."""
        if self.exporter is not None:
            self.exporter.settle_start(timeout_seconds)

    def waiting_spans(self) -> int:
        """Spans still unread in the ring or pending here (counted when a run ends early);
        0 for the ring while the child reads it (the client counts what it left)."""
        self.refill()
        return sum(r.span_count() for r in self.pending)

    def detach(self) -> None:
        """The recorder queues every record again (what the ring holds stays readable)."""
        detach_ring(self._recorder)


def ring_settings(builder: Any, identity: Any, device_synced: bool, device_type: str,
                  span_timing: str | None, startup: Any) -> dict[str, Any]:
    """What the exporter process needs to build the ring's steps as the training process
    would (pickled into the ``ring`` frame, read by ``export/process/ring_feed.py``): the
    builder's settings, the ``train.startup`` maker, and the training process's pid (host
    RSS is its memory, not the child's)."""
    return {"identity": identity, "device_synced": device_synced, "device_type": device_type,
            "span_timing": span_timing, "offset_ns": builder.offset_ns,
            "host_rss_every_steps": builder.host_rss_every_steps, "startup": startup,
            "pid": os.getpid()}


class RingCostCounts:
    """The exporter process's ring reader's cumulative counts (``ring_feed.counts``), into
    this process's own-cost meter as differences: the ring's steps and their spans count as
    the queue's did (hot-path cost warm or cold, steps, the first start and the last end),
    and train.startup made there is not made here again after a take-over."""

    def __init__(self, self_cost: Any, startup: Any) -> None:
        self._self_cost = self_cost
        self._startup = startup
        self._seen = {"steps": 0, "warm_spans": 0, "cold_spans": 0}

    def __call__(self, counts: dict[str, Any]) -> None:
        seen = self._seen
        delta = {k: int(counts.get(k, 0)) - v for k, v in seen.items()}
        if any(d < 0 for d in delta.values()):
            return  # not this reader's counts (never: they only grow)
        for k in seen:
            seen[k] += delta[k]
        if delta["warm_spans"] or delta["cold_spans"]:
            self._self_cost.add_hot_path_spans(delta["warm_spans"], delta["cold_spans"])
        if delta["steps"]:
            self._self_cost.note_steps(delta["steps"], counts.get("first_start_ns"),
                                       int(counts.get("last_end_ns") or 0))
        if counts.get("startup_done") and self._startup is not None:
            self._startup.done = True
