"""The hot path: steps and phases that only take timestamps and append.

Nothing here creates OpenTelemetry SDK objects, nor even a record per phase. A step keeps one
flat event list: entering a phase appends ``(phase, start_ns)``, leaving it appends
``(end_ns, exception_or_None)``; the background (``records/step_records.py``) turns that
stream into the span tree. A finished step goes to a bounded deque the background drains.
Timestamps are ``perf_counter_ns``; the builder turns them into epoch ns with one offset.

Device synchronization (``device.py``) is an explicit call: at every step and phase boundary
with ``device_sync="sync"`` (``SyncedPhase``), at monitoring boundaries only with
``monitor_sync``, the default on an accelerator (``MonitorSyncedPhase``, ``MonitorRecord``,
``Step.open_phase`` of a monitor phase): the one thing here that may wait on the device, by
choice. A device tensor given to ``set_attribute`` / ``count`` starts a non-blocking copy to
host memory here (``device_values.py``); nothing reads it on this thread.

This module picks the twin that runs (the C accelerator or ``pure_twin.py``) and builds
``Phase``, ``Step`` and ``Recorder`` on it. Beside it: ``step_events.py`` reads an event list
back, ``step_phase_events.py`` opens and closes phases by timestamps (integrations),
``monitor_record.py`` times ``run.monitor`` between steps, ``call_checks.py`` holds the
errors of misuse. The names the rest of the package uses are re-exported here.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

from otel_train.common.attributes import KIND_MONITOR, KIND_TRAIN, PHASE_DATA
from otel_train.recording import pure_twin
from otel_train.recording.call_checks import (
    bad_key_error,
    check_iterable,
    check_max_steps,
    detached,
    ended_step_error,
    nested_step_error,
    outside_step_error,
)
from otel_train.recording.monitor_record import MonitorRecord
from otel_train.recording.schedule import DueSchedule
from otel_train.recording.step_events import (DecodedPhase, PhaseEntry, active_ordinal,
                                              decode_events, flat_events, in_progress,
                                              open_monitoring)
from otel_train.recording.step_counts import BatchCounter, StepCounts
from otel_train.recording.step_phase_events import StepPhaseEvents

if TYPE_CHECKING:
    from otel_train.common.drop_counter import DropCounter
    from otel_train.recording.device_probes import DeviceProbes

__all__ = ["ACCELERATED", "FLAT_PHASE_ROWS", "FLAT_STEP_RECORD", "HOT_PATH", "DecodedPhase", "DeviceEventPhase",
           "MonitorRecord", "MonitorSyncedPhase", "Phase", "Recorder", "Step", "SyncedPhase",
           "decode_events", "flat_events"]

# The C accelerator (``_recorder_c.c``, built at install where a compiler is found) runs the
# phases' __enter__/__exit__, a step's fields and lookups, and run.steps' loop with no Python
# frame or instance dict of their own: with steps 1 ms apart (cold caches, as in a real loop)
# that is the larger part of what a 7-span step costs beyond six empty ``with`` blocks
# (benchmarks/bench_accelerator.py measures both twins). The pure-Python twins
# (``pure_twin.py``) are the reference, run where it was not built or with
# OTEL_TRAIN_PURE_PYTHON=1; the tests run against both. The choice is made here, as this
# module loads (the benchmark loads it twice more, once on each twin).
_recorder_c: Any
if os.environ.get("OTEL_TRAIN_PURE_PYTHON", "").strip().lower() in ("", "0", "false", "no"):
    try:
        from otel_train.recording import _recorder_c  # type: ignore[attr-defined, no-redef]
        HOT_PATH = "C accelerator (otel_train.recording._recorder_c)"
    except ImportError:
        _recorder_c = None
        HOT_PATH = ("pure Python: the C accelerator was not built at install (it needs a C "
                    "compiler and Python's headers); reinstall with them to build it")
else:
    _recorder_c = None
    HOT_PATH = "pure Python (OTEL_TRAIN_PURE_PYTHON is set)"

#: True when the hot path runs in the C accelerator, False when in pure Python.
ACCELERATED = _recorder_c is not None
if TYPE_CHECKING:  # type checkers read the pure-Python twins: they define the same API
    _PhaseCore = pure_twin.PurePhaseCore
    _RecorderCore = pure_twin.PureRecorderCore
    _StepCore = pure_twin.PureStepCore
elif _recorder_c is not None:
    _PhaseCore, _RecorderCore, _StepCore = (
        _recorder_c.PhaseCore, _recorder_c.RecorderCore, _recorder_c.StepCore)
else:
    _PhaseCore, _RecorderCore, _StepCore = (
        pure_twin.PurePhaseCore, pure_twin.PureRecorderCore, pure_twin.PureStepCore)
# run.steps' loop: the C StepLoop or its twin, called alike.
_step_loop: Any = _recorder_c.StepLoop if _recorder_c is not None else pure_twin.step_loop
#: A flat step's phase rows in C (``_recorder_c_rows.c``), for the span worker's record
#: builder; None on the pure twin, whose builder runs its Python twin
#: (records/step_records.py ``_flat_phases``).
FLAT_PHASE_ROWS: Any = _recorder_c.flat_phase_rows if _recorder_c is not None else None
FLAT_STEP_RECORD: Any = _recorder_c.flat_step_record if _recorder_c is not None else None
# The pure twin's running steps shadow phase/monitor with the tables' lookups (PureStepCore).
_SHADOWED_LOOKUPS = _recorder_c is None


class Phase(_PhaseCore, PhaseEntry):
    """A timed phase; a reusable context manager (one per name, kind and loader).

    It carries no per-use state: entering appends ``(self, start_ns)`` to the current step's
    event list, leaving appends ``(end_ns, exception)``. Phases nest by the order of events.
    """

    __slots__ = ()
    _rec: Recorder
    name: str
    kind: str
    loader: str | None

    def _outside_error(self) -> RuntimeError:
        """The error of a phase opened outside a step (raised by the C twin too)."""
        return outside_step_error(self.name)

    def set_attribute(self, key: str, value: Any) -> None:
        """Set an attribute on the innermost open phase of the current step."""
        step = self._rec.current
        if step is None:
            raise outside_step_error(self.name)
        step._set_phase_attribute(key, value)


class SyncedPhase(Phase):
    """A phase whose boundaries synchronize the accelerator (``device_sync``)."""

    __slots__ = ()

    def __enter__(self) -> Phase:  # type: ignore[override]
        rec = self._rec
        ev = rec.ev
        if ev is None:
            raise outside_step_error(self.name)
        rec.synchronize()  # explicit: drain device work from before this phase
        ev.extend((self, perf_counter_ns()))
        return self

    def __exit__(  # type: ignore[override]
            self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self._rec.synchronize()  # explicit: this phase's device work counts in this phase
        return Phase.__exit__(self, exc_type, exc, tb)


class DeviceEventPhase(Phase):
    """A phase whose boundaries record device events and/or allocator peaks on a sampled step
    (``device_probes.py``; resolved in the background); with ``device_sync=sync``, synced too."""

    __slots__ = ()

    def __enter__(self) -> Phase:  # type: ignore[override]
        rec = self._rec
        step = rec.current
        if step is None:
            raise outside_step_error(self.name)
        if rec.synchronize is not None:
            rec.synchronize()  # explicit: device_sync=sync, as SyncedPhase
        ev = step.ev
        if step.dev is not None:
            rec.probes.boundary(step.dev, len(ev))  # type: ignore[union-attr]
        ev.extend((self, perf_counter_ns()))
        return self

    def __exit__(  # type: ignore[override]
            self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        rec = self._rec
        step = rec.current
        if rec.synchronize is not None:
            rec.synchronize()  # explicit: device_sync=sync, as SyncedPhase
        if step is not None:
            if step.dev is not None:
                rec.probes.boundary(step.dev, len(step.ev))  # type: ignore[union-attr]
            elif exc is not None:
                rec.probes.phase_failed(step, len(step.ev), exc)  # type: ignore[union-attr]
        return Phase.__exit__(self, exc_type, exc, tb)


class MonitorSyncedPhase(Phase):
    """A monitoring phase under ``device_sync="monitor_sync"``: the device is synchronized at
    its start and its end; on a sampled step its boundaries record events and peaks too."""

    __slots__ = ()

    def __enter__(self) -> Phase:  # type: ignore[override]
        rec = self._rec
        step = rec.current
        if step is None:
            raise outside_step_error(self.name)
        # explicit: the training work still queued runs before monitoring starts, so it is
        # charged to training and not to this phase (monitor_sync).
        waited = rec.monitor_synchronize()  # type: ignore[misc]  # explicit: see above
        ev = step.ev
        step.note_queued_wait(len(ev), waited)
        if step.dev is not None and rec.probes is not None:
            rec.probes.boundary(step.dev, len(ev))
        ev.extend((self, perf_counter_ns()))
        return self

    def __exit__(  # type: ignore[override]
            self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        rec = self._rec
        step = rec.current
        # explicit: this phase's own kernels finish inside it (monitor_sync).
        rec.monitor_synchronize()  # type: ignore[misc]  # explicit: see above
        probes = rec.probes
        if step is not None and probes is not None:
            if step.dev is not None:
                probes.boundary(step.dev, len(step.ev))
            elif exc is not None:
                probes.phase_failed(step, len(step.ev), exc)
        return Phase.__exit__(self, exc_type, exc, tb)


class _PhaseTable(dict):  # type: ignore[type-arg]
    """name -> reusable Phase of one kind; a missing name creates its Phase on first use."""

    def __init__(self, recorder: Recorder, kind: str) -> None:
        super().__init__()
        self._recorder = recorder
        self._kind = kind

    def __missing__(self, name: str) -> Phase:
        return self._recorder.phase(name, self._kind)


class Recorder(_RecorderCore):
    """Where finished steps go: a bounded queue, plus what the watchdog needs to see."""

    def __init__(
        self,
        max_queued: int,
        drops: DropCounter,
        synchronize: Callable[[], None] | None,
        probes: DeviceProbes | None = None,
        monitor_synchronize: Callable[[], None] | None = None,
        keep_value: Callable[[Any], Any] | None = None,
        schedule: DueSchedule | None = None,
        batch_counter: BatchCounter | None = None,
        keep_finished: bool = True,  # False (a disabled run): finished steps go, for free
    ) -> None:
        self.queue: deque[Step | MonitorRecord] = deque(maxlen=None if keep_finished else 0)
        self.batch_counter = batch_counter  # step.count(batch=...); None: nothing per batch
        self.max_queued = max_queued
        self.drops = drops
        self.synchronize = synchronize
        # monitor_sync: synchronize at monitoring boundaries only (None in every other mode:
        # with device_sync=sync, ``synchronize`` covers monitoring boundaries too).
        self.monitor_synchronize = monitor_synchronize if synchronize is None else None
        # What set_attribute / count keep of a value: a device tensor's copy on its way to
        # host memory (device_values.py), else the value (a tensor detached).
        self.keep_value: Callable[[Any], Any] = keep_value or detached
        self.current: Step | None = None  # the step in progress (read by watchdog and proxy)
        self.open_record: MonitorRecord | None = None  # run.monitor() running between steps
        self.ev: list[Any] | None = None  # current.ev, one attribute away for the hot path
        self.closed = False
        self.next_index = 0
        self.last_step_end_ns = 0  # perf_counter_ns of the last step's end (0: none yet)
        # A step closed by GeneratorExit is held back until the next event, so that an
        # exception escaping the loop body (seen later by Run.__exit__) can still mark it.
        self.held: Step | None = None
        # Re-entrant: a signal handler may end the run while this thread is inside.
        self._held_lock = threading.RLock()
        self.probes = probes if probes is not None and probes.active else None
        self.plain = synchronize is None and self.probes is None  # host clock only
        self._phase_cls = (DeviceEventPhase if self.probes is not None
                           else SyncedPhase if synchronize is not None else Phase)
        self._phases: dict[tuple[str, str, str | None], Phase] = {}
        # The common lookups, by name alone: each running step's ``phase`` / ``monitor`` is
        # the bound ``__getitem__`` of these tables (a C call, no Python frame per phase).
        self.train_phases = _PhaseTable(self, KIND_TRAIN)
        self.monitor_phases = _PhaseTable(self, KIND_MONITOR)
        self.phase_lookup = self.train_phases.__getitem__
        self.monitor_lookup = self.monitor_phases.__getitem__
        self.schedule = schedule or DueSchedule()  # step.due's (schedule.py): every-N if None
        self.ring: Any = None  # the step ring's writer (step_ring.attach_ring), or None

    def phase(self, name: str, kind: str, loader: str | None = None) -> Phase:
        """The reusable Phase for (name, kind, loader)."""
        key = (name, kind, loader)
        p = self._phases.get(key)
        if p is None:
            cls = (MonitorSyncedPhase if kind == KIND_MONITOR
                   and self.monitor_synchronize is not None else self._phase_cls)
            p = self._phases[key] = cls(self, name, kind, loader)
            if loader is None:
                by_name = self.train_phases if kind == KIND_TRAIN else self.monitor_phases
                by_name[name] = p
        return p

    # -- the step lifecycle: one start routine, one end routine, one loop ------------------
    def begin_step(self, loader: str | None, index: int | None = None,
                   first_phase: Phase | None = None) -> Step:
        """Start the next step (it becomes ``current``); steps never nest."""
        cur = self.current
        if cur is not None and not cur.end_ns:
            raise nested_step_error(cur)
        if index is None:
            index = self.next_index
        self.next_index = index + 1
        return Step(self, index, loader, first_phase)

    def finish_step(self, step: Step, error: BaseException | None, hold: bool = False,
                    _clock: Callable[[], int] = perf_counter_ns) -> None:
        """End ``step`` now (phases still open end with it) and queue it for the background.

        ``hold`` keeps it back until the next run event instead (see ``held``).
        """
        if step.end_ns:
            return
        if not self.plain:
            self.device_step_end(step)
        step.end_ns = end = _clock()
        if _SHADOWED_LOOKUPS:
            del step.phase, step.monitor  # back to the methods that refuse an ended step
        if error is not None and step.error is None:
            step.error = error
        if step.batch is not None:
            step.batch = None  # the background must never keep a batch (or its device memory)
        if self.current is step:
            self.current = self.ev = None
        self.last_step_end_ns = end
        if hold:
            if self.held is not None:
                self.release_held()  # one held step at a time: the earlier one goes first
            self.held = step
        else:
            self.submit(step)

    def device_step_start(self, step: Step) -> None:
        """The device side of a step's start (device_sync or events mode only)."""
        if self.synchronize is not None:
            self.synchronize()  # explicit: the step starts when the device is idle
        if self.probes is not None:
            self.probes.step_start(step)

    def device_step_end(self, step: Step) -> None:
        """The device side of a step's end (device_sync or events mode only)."""
        if self.probes is not None:
            self.probes.step_end(step)
        if self.synchronize is not None:
            self.synchronize()  # explicit: the step ends when its device work has ended

    def steps(self, iterable: Iterable[Any], loader: str | None,
              max_steps: int | None = None, counter: Any = None) -> Iterator[Step]:
        """Yield a Step per item of ``iterable``; fetching the item is the ``data`` phase.

        ``iter(iterable)`` runs in the first step's ``data`` phase; ``max_steps`` ends the
        loop after that many steps, without fetching another item. Leaving the loop
        (``break``, an exception in its body) ends the step in progress and holds it (see
        ``held``). The C accelerator's ``StepLoop`` when built, else the generator
        ``pure_twin.step_loop``; the two behave alike.
        """
        check_iterable(iterable)
        return _step_loop(  # type: ignore[no-any-return]
            self, iterable, loader, self.phase(PHASE_DATA, KIND_TRAIN), Step, nested_step_error,
            check_max_steps(max_steps), counter)

    def timestamp_ns(self) -> int:
        """A phase-boundary timestamp (``perf_counter_ns``), synchronizing per device_sync."""
        sync = self.synchronize
        if sync is not None:
            sync()  # explicit: the run's device_sync choice, as at every phase boundary
        return perf_counter_ns()

    def submit(self, record: Step | MonitorRecord) -> None:
        """Queue a finished record for the background; count it if the queue is full."""
        if self.ring is not None and self.ring.write_step(record):
            return  # the step ring took it (written, queued behind a marker, or dropped)
        q = self.queue
        if len(q) < self.max_queued:
            q.append(record)
        else:
            self.drops.add("record_queue_full", record.span_count())

    def release_held(self, error: BaseException | None = None) -> None:
        """Submit the held step, marking it failed with ``error`` if given; any thread."""
        with self._held_lock:
            held = self.held
            if held is None:
                return
            self.held = None
        if error is not None and held.error is None:
            held.error = error
        self.submit(held)

    def open_monitoring(self) -> tuple[int, str, int] | None:
        """(step index, name, start ns) of the outermost monitoring operation running now.

        A monitoring phase of the current step, or a ``run.monitor`` between steps; any
        thread (the watchdog warns while one runs too long, not only once it has ended).
        """
        return open_monitoring(self)

    def in_progress(self) -> tuple[int, int, str | None, int] | None:
        """(step index, step start ns, active phase name, phase start ns) or None; any thread."""
        return in_progress(self)


class Step(_StepCore, StepPhaseEvents, StepCounts):
    """One training step: the root span ``train.step`` and its phases.

    ``step.batch`` holds what the data phase fetched; it is released when the step ends so
    the background never keeps a batch (and its device memory) alive.
    """

    index: int
    loader: str | None
    _recorder: Recorder
    start_ns: int
    end_ns: int
    ev: list[Any]
    batch: Any
    error: BaseException | None
    # The rare fields (attributes, span ids asked for by user spans, device events) default
    # on the class and are written when used.
    attrs: dict[str, Any] | None = None
    phase_attrs: dict[int, dict[str, Any]] | None = None
    span_ids: dict[int, int] | None = None  # ordinal (-1: root) -> id, drawn lazily
    trace_id = 0
    dev: dict[int, Any] | None = None  # sampled: boundary position -> (event, peaks); -1/-2 step

    def __init__(self, recorder: Recorder, index: int, loader: str | None,
                 first_phase: Phase | None = None) -> None:
        self.index = index
        self.loader = loader
        self._recorder = recorder
        if _SHADOWED_LOOKUPS:
            self.phase = recorder.phase_lookup  # type: ignore[method-assign, assignment]
            self.monitor = recorder.monitor_lookup  # type: ignore[method-assign, assignment]
        if not recorder.plain:
            recorder.device_step_start(self)
        self.start_ns = t = perf_counter_ns()
        # ``first_phase`` opens with the step, at the same instant (run.steps' data fetch).
        self.ev = [first_phase, t] if first_phase is not None else []
        recorder.current = self
        recorder.ev = self.ev

    def _ended_error(self, name: str) -> RuntimeError:
        """The error of a phase opened on this ended step (raised by the C twin too)."""
        return ended_step_error(self, name)

    def set_attribute(self, key: str, value: Any) -> None:
        """Set an attribute on the step's root span; never forces a device sync.

        A tensor is kept (detached) and read in the background, not with ``Tensor.item`` here; a
        one-element device tensor starts a non-blocking copy to host memory, read once it has
        landed (``device_values.py``).
        """
        if type(key) is not str or not key:
            raise bad_key_error(key)
        attrs = self.attrs
        if attrs is None:
            attrs = self.attrs = {}
        attrs[key] = self._recorder.keep_value(value)

    def due(self, operation: str, every: int | None = None, *, force: bool = False,
            min_every: int | None = None, max_every: int | None = None) -> bool:
        """Whether ``operation`` runs now: every N steps, or governed (``schedule.py``)."""
        return self._recorder.schedule.due(self, operation, every, force, min_every, max_every)

    # -- lifecycle and background helpers -----------------------------------------------
    def span_count(self) -> int:
        """Spans this step will produce (root + phases)."""
        return 1 + sum(1 for e in self.ev if isinstance(e, Phase))

    def _set_phase_attribute(self, key: str, value: Any) -> None:
        if type(key) is not str or not key:
            raise bad_key_error(key)
        ordinal, _ = active_ordinal(self.ev)
        if ordinal < 0:
            raise RuntimeError(f"set_attribute({key!r}): no phase is open in step {self.index}")
        if self.phase_attrs is None:
            self.phase_attrs = {}
        self.phase_attrs.setdefault(ordinal, {})[key] = self._recorder.keep_value(value)

    def _active_span_ordinal(self) -> int:
        return active_ordinal(self.ev)[0]

    def _finish(self, error: BaseException | None, hold: bool = False) -> None:
        self._recorder.finish_step(self, error, hold)

    def end(self, error: BaseException | None = None) -> None:
        """End the step now (phases still open end with it), failed if ``error``."""
        self._recorder.finish_step(self, error)

    def __enter__(self) -> Step:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self._recorder.finish_step(self, exc)
        return False

    def __repr__(self) -> str:
        return f"<Step {self.index}{' ended' if self.end_ns else ''}>"

