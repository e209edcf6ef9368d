"""The step ring read in the exporter process: its steps, and the queued records in their
places, through the same path as a frame of records from the pipe.

Where the plan has the exporter process read the step ring (``PipelinePlan.step_ring``), the
training process does no per-step work after the hot path: the hot path writes each flat
step into the shared-memory ring (``recording/step_ring.py``), and this reader, a thread of
the exporter process, builds each step's span record with a ``StepRecordBuilder`` made here
from the training process's settings (the same code, so the same records) and hands them to
the child's ``spans`` path (derived chain, tail sampler, export stage), as a pipe's frame.

A record the ring cannot carry is queued in the training process, and a ``QUEUED`` marker
holds its place in the ring, with its ordinal. The training process's span worker builds
those records and sends them, each tagged with its ordinal, in its frames. Meeting marker
``n``, this reader takes record ``n`` from the frames at hand and goes on; if it has not
come, it waits (holding its place in the ring, ``MARKER_WAIT_SECONDS`` at most), so the
derived chain sees steps in the order they ended. A marker whose record never comes (its
frame was dropped in the training process, ``export_queue_full``, or its build failed there,
``build_error``: counted there) is passed over and counted here (``markers_unmatched``); a
record that comes after its marker was passed over goes on at once.

Accounting (``ring_settle.py``): ``tail`` moves only past records whose spans are settled
(exported, dropped or sampled out), and only after the count report that says so was sent.
The training process reads the spans of frames settled so far (``frames_settled``) and the
ring position settled (``ring_position``) in each count report: should this process die, it
sends again the frames not settled, and reads the ring itself from ``tail``
(``pipeline/ring_source.py``), so nothing is lost nor counted twice but the batch in flight;
should it be killed at the shutdown deadline, the training process counts the ring's spans
past the position it last read as not delivered.

A thread, as the child's main loop blocks on the pipe and the ring has no descriptor to wait
on: it sleeps once it has read to the head (``ring_pace.py``: up to 0.25 s, less when the
ring fills fast), and reads in batches.

Usage::

    feed = ChildRingFeed(child, ring_fd, settings)    # ring_source.py ring_settings()
    feed.start(); feed.add_frame(recs, rows, cost, ordinals)
    feed.catch_up(deadline); feed.counts(); feed.finish(deadline)
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.export.process.ring_build import RingRecordBuilds
from otel_train.export.process.ring_comm import CollectivesWait
from otel_train.export.process.ring_pace import BoundedWait, RingPace
from otel_train.export.process.ring_runs import take_steps
from otel_train.export.process.ring_settle import RingSettlement
from otel_train.recording.step_ring import QUEUED, StepRing
from otel_train.recording.step_ring_reader import StepRingReader, unread_step_spans
from otel_train.records.device_readings import HostRss
from otel_train.common.attributes import STEP_SPAN_NAME
from otel_train.records.span_rows import C_ATTRS, C_NAME, C_START, record_span_count
from otel_train.records.step_batch import always_sampled
from otel_train.records.step_records import StepRecordBuilder

__all__ = ["MARKER_WAIT_SECONDS", "ChildRingFeed"]

_log = logging.getLogger("otel_train")
#: How long the reader holds its place at a marker whose record has not come: the training
#: process drains its queue within 0.5 s of a record's end (span_worker.py), then the pipe.
MARKER_WAIT_SECONDS = 3.0
#: Steps read in one go: one hand-over to the derived chain and the stage.
_BATCH_ITEMS = 512
#: How long the first step waits for the training process's start_run time (train.startup).
_READY_WAIT_SECONDS = 2.0


class _Frame:
    """A frame's queued records (each with its ordinal), its user span rows, and how far
    through its records the reader is."""

    __slots__ = ("recs", "ordinals", "rows", "next")

    def __init__(self, recs: list[Any], ordinals: list[int], rows: list[Any]) -> None:
        self.recs, self.ordinals, self.rows, self.next = recs, ordinals, rows, 0


class ChildRingFeed:
    """The exporter process's reader of the step ring (see the module docstring)."""

    def __init__(self, child: Any, ring_fd: int, settings: dict[str, Any],
                 resource: tuple[dict[str, Any], str | None], scope: tuple[Any, ...]) -> None:
        self._child = child
        self.ring = StepRing.open(ring_fd)
        self._reader = StepRingReader(self.ring, move_tail=False)
        attrs, schema = resource
        # In scope the SDK sampler always samples (or the tail sampler decides here, after
        # the metrics): every step is built sampled, as the training process's builder would.
        builder = StepRecordBuilder(
            settings["identity"], Resource(attrs, schema), InstrumentationScope(*scope),
            settings["device_synced"], settings["device_type"], always_sampled,
            settings["offset_ns"], settings["span_timing"], settings["host_rss_every_steps"])
        builder.host_rss = HostRss(pid=settings["pid"])  # the training process's memory
        self._builder = builder
        self._startup = settings.get("startup")
        self._startup_done = self._startup is None or self._startup.done
        self._first_done = False  # the first step's record (a resumed run's attributes)
        self._first_start_ns: int | None = None
        self.ready_ns: int | None = None
        self._ready_known = False
        self._started = time.monotonic()
        self._warn = RateLimitedLogger(_log)
        self._lock = threading.Lock()  # one reader: the thread, a flush, the stop
        self._frames: deque[_Frame] = deque()
        self._frames_lock = threading.Lock()
        self._skipped: set[int] = set()  # ordinals the training process will not send
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._items: deque[tuple[Any, int, int]] = deque()  # read, not yet handed on
        self._markers = 0  # markers passed: the next marker's ordinal
        self._marker_wait = BoundedWait()  # at a marker whose record has not come
        # Collectives (when the training process times them): a step waits for the entries
        # that cover it (ring_comm.py).
        self._comm = CollectivesWait(builder, self._reader)
        self._parent_cost_ns = 0
        # Accounting: the hand-overs to the stage and what of them is settled.
        self.settlement = RingSettlement(self._reader)
        self._position = self._reader.position  # after the last item handed on
        # The steps' records, and (for the training process's own cost) what it would have
        # counted of them (ring_build.py).
        self._builds = RingRecordBuilds(builder, child.drops, self.settlement, self._warn)
        self.markers_unmatched = 0
        self.late_records = 0
        self._thread = threading.Thread(target=self._run, name="otel-train-ring", daemon=True)

    # -- from the child's main loop ----------------------------------------------------------
    def start(self) -> None:
        """Start the reader thread."""
        self._thread.start()

    def add_frame(self, recs: list[Any], rows: list[Any], parent_cost_ns: int,
                  ordinals: list[int] | None) -> None:
        """A frame from the training process: its queued records wait for their markers."""
        self._parent_cost_ns = parent_cost_ns
        if ordinals is None or len(ordinals) != len(recs):  # not tagged: in order, at once
            ordinals = [-1] * len(recs)
        with self._frames_lock:
            self._frames.append(_Frame(list(recs), list(ordinals), list(rows)))
        self._wake.set()

    def set_ready(self, ready_ns: int | None) -> None:
        """When ``start_run`` returned in the training process (``train.startup``'s cut)."""
        self.ready_ns = ready_ns
        self._ready_known = True
        self._wake.set()

    def skip(self, ordinals: list[int]) -> None:
        """Queued records the training process will not send (their build failed there,
        counted): their markers are passed at once."""
        with self._frames_lock:
            self._skipped.update(ordinals)
        self._wake.set()

    def add_collectives(self, entries: list[list[Any]], complete_ns: int) -> None:
        """Collectives' entries from the training process, complete up to ``complete_ns``:
        from now on a ring step waits (bounded) until they cover its end (ring_comm.py)."""
        self._comm.add(entries, complete_ns)
        self._wake.set()

    def catch_up(self, deadline: float) -> None:
        """Hand on what the ring holds now (a flush, a sync: the steps so far count)."""
        with self._lock:
            while time.monotonic() < deadline:
                if not self._pass(final=False):
                    break

    def finish(self, deadline: float) -> None:
        """Stop the thread, hand on everything (the ring to its head within ``deadline``,
        then every frame, whatever its markers); count what is left unread as
        ``shutdown_timeout``. Everything before the head is then accounted for: the last
        settle frees the whole ring."""
        self._stop.set()
        self._wake.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            while time.monotonic() < deadline:
                if not self._pass(final=True):
                    break
            self._emit_startup()
            self._flush_frames()
            unread = sum(item.span_count() for item, _, _ in self._items
                         if item is not QUEUED)
            self._items.clear()
            try:
                unread += unread_step_spans(self.ring, self._reader.position)
                head = self._reader.head()
            except Exception:
                head = self._position
            if unread > 0:
                self._child.drops.add("shutdown_timeout", unread)
                self.settlement.stage_in += unread  # settled: counted dropped
            self._reader.position = max(self._reader.position, head)
            self._position = max(self._position, head)
            self._mark(self._position)

    # -- the reader ----------------------------------------------------------------------
    def _run(self) -> None:
        pace = RingPace(self.ring.capacity, self._reader.position)
        while not self._stop.is_set():
            try:
                with self._lock:
                    progressed = self._pass(final=False)
            except Exception as exc:  # never a dead reader: log, go on
                progressed = False
                self._warn.warning("ring", "otel-train: reading the step ring: %r", exc)
            if not progressed:  # read to the head: sleep (ring_pace.py says how long)
                self._wake.wait(pace.next_sleep(self._reader.position))
                self._wake.clear()

    def _pass(self, final: bool) -> bool:
        """One batch: read, build, hand on; True when something moved. ``final``: nothing
        more will come (the stop): a marker's record is not waited for. Each run of steps
        between markers is built in one call (ring_build.py)."""
        items = self._items
        if len(items) < _BATCH_ITEMS:
            items.extend(self._reader.read_items(_BATCH_ITEMS - len(items)))
        # Whether the run times collectives, read once after the read: the writer says so
        # before it writes the first step that waits for them, so a step read before this
        # read of the flag saw it set if it had to.
        comm = self._comm.timed() and not final
        moved = False
        batch: list[Any] = []
        run: list[Any] = []  # steps to build, in order
        batch_end = self._position
        popleft = items.popleft
        while items:
            item, end, ordinal = items[0]
            if item is QUEUED:
                if run:
                    batch += self._build_run(run)
                    run = []
                if batch:
                    self._hand_on(batch, [], batch_end)
                    batch = []
                if not self._at_marker(ordinal, end, final):
                    return moved
                batch_end = self._position
                moved = True
                continue
            if comm and self._comm.pending(item.end_ns, MARKER_WAIT_SECONDS):
                break
            if self._first_start_ns is None and not self._startup_done:
                if self._first_waits(final):
                    break  # the first step waits for start_run's time (bounded)
                self._first_start_ns = item.start_ns
                self._emit_startup()
            elif not comm:  # nothing to wait for: every step up to the next marker at once
                batch_end = take_steps(items, run)
                moved = True
                continue
            popleft()
            run.append(item)
            batch_end = end
            moved = True
        if run:
            batch += self._build_run(run)
        if batch:
            self._hand_on(batch, [], batch_end)
        elif batch_end > self._position:
            self._position = batch_end
            self._mark(batch_end)
        if not items:  # read to the head: records whose markers were passed over go on
            moved = self._late_frames() or moved
        self._release_done_frames(self._position)
        return moved

    def _at_marker(self, ordinal: int, end: int, final: bool) -> bool:
        """Marker ``ordinal`` at the head of the items: its record handed on, or passed over
        (counted); False while it waits for the record."""
        self._markers = max(self._markers, ordinal)
        self._late_frames()  # records whose markers were passed over, first
        self._release_done_frames(self._position)  # frames of rows alone, first
        rec = self._match(ordinal, final)
        if rec is _WAIT:
            return False
        self._items.popleft()
        self._markers = max(self._markers, ordinal + 1)
        if rec is not None:
            self._hand_frame_record(rec, end)
        else:
            self._position = max(self._position, end)
            self._mark(self._position)
        self._release_done_frames(self._position)
        return True

    def _first_waits(self, final: bool) -> bool:
        """The run's first step waits for start_run's time (``set_ready``), bounded."""
        return (not self._ready_known and not final
                and time.monotonic() - self._started < _READY_WAIT_SECONDS)

    def _first_step(self, rec: tuple[Any, ...]) -> None:
        """The run's first step's record: it carries a resumed run's attributes."""
        self._first_done = True
        extra = self._startup.first_step_attributes if self._startup is not None else None
        if extra:
            rec[C_ATTRS].update(extra)

    def _build_run(self, steps: list[Any]) -> list[tuple[Any, ...]]:
        """The records of a run of ring steps (the first step's carries a resumed run's
        attributes)."""
        recs = self._builds.build(steps)
        if recs and not self._first_done:
            self._first_step(recs[0])
        return recs

    def _emit_startup(self) -> None:
        """The run's train.startup record, ahead of its first step's (made here: the first
        step may be a ring step, which the training process never sees)."""
        if self._startup_done or self._first_start_ns is None:
            return
        self._startup_done = True
        try:
            rec = self._startup.record(self._first_start_ns, self.ready_ns)
            if rec is None:
                return
            rec = self._builder.host_timed(rec)
        except Exception as exc:
            self._child.drops.add("build_error", 1)
            self.settlement.stage_in += 1
            self._warn.warning("build", "otel-train: could not build train.startup: %r", exc)
            return
        self._builds.warm_spans += record_span_count(rec)
        self._hand_on([rec], [], self._position)

    def _match(self, ordinal: int, final: bool) -> Any:
        """The queued record for marker ``ordinal``: the record, None (never to come: passed
        over, counted), or ``_WAIT``."""
        with self._frames_lock:
            if ordinal in self._skipped:  # not coming, counted in the training process
                self._skipped.discard(ordinal)
                self._marker_wait.reset()
                return None
            frame = self._frames[0] if self._frames else None
            if frame is not None and frame.next < len(frame.recs):
                have = frame.ordinals[frame.next]
                if have == ordinal:
                    rec = frame.recs[frame.next]
                    frame.next += 1
                    self._marker_wait.reset()
                    return rec
                if have > ordinal:  # record ``ordinal`` is not coming: its frame was dropped
                    self._unmatched()
                    return None
        if final:
            self._unmatched()
            return None
        if self._marker_wait.waiting(MARKER_WAIT_SECONDS):
            return _WAIT
        self._unmatched()
        return None

    def _unmatched(self) -> None:
        self._marker_wait.reset()
        self.markers_unmatched += 1
        self._warn.warning("marker", "otel-train: a queued record never reached the "
                           "exporter process (%d so far); passed over", self.markers_unmatched)

    # -- hand-over and accounting --------------------------------------------------------
    def _hand_on(self, recs: list[Any], rows: list[Any], position: int,
                 frame_spans: int = 0) -> None:
        """Through the child's spans path (chain, sampler, stage), then marked."""
        handed = self._child.spans(recs, rows, self._parent_cost_ns, count=True)
        self.settlement.stage_in += handed
        self.settlement.frame_spans += frame_spans
        self._position = max(self._position, position)
        self._mark(self._position)

    def _mark(self, position: int) -> None:
        self.settlement.mark(position)

    def _hand_frame_record(self, rec: tuple[Any, ...], position: int) -> None:
        """A record built in the training process (its first step: train.startup first;
        a step's device verdict carries over to the ring steps built here after it)."""
        if rec[C_NAME] == STEP_SPAN_NAME:
            self._builder.take_device_verdict(rec)
        if not self._first_done and rec[C_NAME] == STEP_SPAN_NAME:
            if self._first_start_ns is None and not self._startup_done:
                self._first_start_ns = rec[C_START] - self._builder.offset_ns
                self._emit_startup()
            self._first_step(rec)
        # Its frame's (the head frame's) user span rows go ahead of its first record, as in
        # a frame from the pipe: the tail sampler holds them, a failed one keeps its step.
        with self._frames_lock:
            frame = self._frames[0] if self._frames else None
            rows = frame.rows if frame is not None else []
            if rows:
                frame.rows = []
        self._hand_on([rec], rows, position, frame_spans=record_span_count(rec) + len(rows))

    def _release_done_frames(self, position: int) -> None:
        """Frames whose records are all handed on: their rows (if not sent with the first
        record) follow, in frame order."""
        while True:
            with self._frames_lock:
                if not self._frames or self._frames[0].next < len(self._frames[0].recs):
                    return
                frame = self._frames.popleft()
            if frame.rows:
                self._hand_on([], frame.rows, position, frame_spans=len(frame.rows))

    def _late_frames(self) -> bool:
        """Records at the head of the frames whose markers were passed over (or that carry
        none) go on now, in the order they came."""
        moved = False
        while True:
            with self._frames_lock:
                frame = self._frames[0] if self._frames else None
                if frame is None or frame.next >= len(frame.recs):
                    break
                if frame.ordinals[frame.next] >= self._markers:
                    break  # its marker is still to come
                rec = frame.recs[frame.next]
                frame.next += 1
            self.late_records += 1
            self._hand_frame_record(rec, self._position)
            self._release_done_frames(self._position)
            moved = True
        return moved

    def _flush_frames(self) -> None:
        """At the stop: every frame's records and rows, in order (records queued after the
        ring was detached have no marker)."""
        while True:
            with self._frames_lock:
                frame = self._frames[0] if self._frames else None
                if frame is None:
                    return
                rec = None
                if frame.next < len(frame.recs):
                    rec = frame.recs[frame.next]
                    frame.next += 1
            if rec is not None:
                self._hand_frame_record(rec, self._position)
            else:
                self._release_done_frames(self._position)

    def counts(self) -> dict[str, Any]:
        """What the training process reads of this reader in each count report."""
        builds = self._builds
        return {**self.settlement.counts(), "steps": builds.steps,
                "warm_spans": builds.warm_spans, "cold_spans": builds.cold_spans,
                "last_end_ns": builds.last_end_ns, "first_start_ns": self._first_start_ns,
                "startup_done": self._startup_done, "markers_unmatched": self.markers_unmatched,
                "late_records": self.late_records}


_WAIT = object()

