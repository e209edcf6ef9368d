"""The hot path: steps and phases that only take timestamps and append.

Nothing here creates OpenTelemetry SDK objects, nor even a record per phase. A step keeps one
flat event list: entering a phase appends ``(phase, start_ns)``, leaving it appends
``(end_ns, exception_or_None)``; the background (``span_builder.py``) turns that stream into the
span tree. A finished step goes to a bounded deque the background drains. Timestamps are
``perf_counter_ns``; the builder converts them to epoch nanoseconds with one offset.

Device synchronization, when enabled (``device.py``), is an explicit call at every step and
phase boundary (``SyncedPhase``): the one thing here that may wait on the device, by choice.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from time import perf_counter_ns, thread_time_ns
from typing import TYPE_CHECKING, Any

from otel_train.common.attributes import KIND_MONITOR, KIND_TRAIN, PHASE_DATA

if TYPE_CHECKING:
    from otel_train.common.drop_counter import DropCounter

_INT = {int}  # flat_events: the one type an end time has


class _PurePhaseCore:
    """A phase's hot path in pure Python: the twin of ``_recorder_c.PhaseCore``."""

    __slots__ = ("_rec", "name", "kind", "loader")

    def __init__(self, recorder: Recorder, name: str, kind: str, loader: str | None = None
                 ) -> None:
        self._rec = recorder
        self.name = name
        self.kind = kind
        self.loader = loader

    # ``_clock`` is bound as a default argument: a local, not a global lookup, on every use.
    # Two appends beat one extend of a new tuple (~13% of a phase, measured); a reader of a
    # live list may see half a pair, which decode_events allows for.
    def __enter__(self, _clock: Callable[[], int] = perf_counter_ns) -> Phase:
        ev = self._rec.ev  # the current step's event list, None between steps
        if ev is None:
            raise _outside(self.name)
        ev.append(self)
        ev.append(_clock())
        return self  # type: ignore[return-value]

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any,
                 _clock: Callable[[], int] = perf_counter_ns) -> bool:
        now = _clock()
        ev = self._rec.ev
        if ev is None:
            return False  # the step was ended inside this phase (e.g. by shutdown)
        ev.append(now)
        ev.append(exc)
        if exc is not None:
            step = self._rec.current
            if step is not None and step.error is None:
                step.error = exc
        return False  # never swallow: the exception propagates unchanged


# The C accelerator (``_recorder_c.c``, built at install where a compiler is found) runs the
# phases' __enter__/__exit__, a step's fields and lookups, and run.steps' loop with no Python
# frame or instance dict of their own: with steps 1 ms apart (cold caches, as in a real loop)
# that is the larger part of what a 7-span step costs beyond six empty ``with`` blocks. The
# pure-Python twins here (_PurePhaseCore, _PureStepCore, _steps_python) are the reference,
# run where it was not built or with OTEL_TRAIN_PURE_PYTHON=1; the tests run against both.
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
    _PhaseCore = _PurePhaseCore
else:
    _PhaseCore = _recorder_c.PhaseCore if _recorder_c is not None else _PurePhaseCore


class Phase(_PhaseCore):
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
        return _outside(self.name)

    def set_attribute(self, key: str, value: Any) -> None:
        """Set an attribute on the innermost open phase of the current step."""
        step = self._rec.current
        if step is None:
            raise _outside(self.name)
        step._set_phase_attribute(key, value)


class SyncedPhase(Phase):
    """A phase whose boundaries synchronize the accelerator (``device_sync``)."""

    __slots__ = ()

    def __enter__(self) -> Phase:  # type: ignore[override]
        rec = self._rec
        ev = rec.ev
        if ev is None:
            raise _outside(self.name)
        rec.synchronize()  # explicit: drain device work from before this phase
        ev.extend((self, perf_counter_ns()))
        return self

    def __exit__(  # type: ignore[override]
            self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self._rec.synchronize()  # explicit: this phase's device work counts in this phase
        return Phase.__exit__(self, exc_type, exc, tb)


class DeviceEventPhase(Phase):
    """A phase that also records a device timing event at each boundary (``events`` mode).

    Events are kept in ``step.dev`` keyed by the position of their boundary in the event
    list; the builder resolves them in the background, so training never waits for them.
    """

    __slots__ = ()

    def __enter__(self) -> Phase:  # type: ignore[override]
        rec = self._rec
        step = rec.current
        if step is None:
            raise _outside(self.name)
        ev = step.ev
        step.dev[len(ev)] = rec.make_event()  # type: ignore[index, misc]
        ev.extend((self, perf_counter_ns()))
        return self

    def __exit__(  # type: ignore[override]
            self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        step = self._rec.current
        if step is not None and step.dev is not None:
            step.dev[len(step.ev)] = self._rec.make_event()  # type: ignore[misc]
        return Phase.__exit__(self, exc_type, exc, tb)


class DecodedPhase:
    """One phase decoded from a step's event list (see :func:`decode_events`)."""

    __slots__ = ("ordinal", "phase", "start_ns", "end_ns", "parent", "error", "start_pos",
                 "end_pos")

    def __init__(self, ordinal: int, phase: Phase, start_ns: int, end_ns: int, parent: int,
                 error: BaseException | None, start_pos: int = -1, end_pos: int = -1
                 ) -> None:
        self.ordinal = ordinal  # position among the step's phases, in start order
        self.phase = phase
        self.start_ns = start_ns
        self.end_ns = end_ns  # 0 while still open
        self.parent = parent  # ordinal of the enclosing phase, -1 for the root
        self.error = error
        self.start_pos = start_pos  # positions of the boundaries in the step's event list
        self.end_pos = end_pos

    def __repr__(self) -> str:
        return (f"DecodedPhase({self.ordinal}, {self.phase.name!r}, parent={self.parent}, "
                f"{self.start_ns}..{self.end_ns})")


def decode_events(ev: list[Any]) -> list[DecodedPhase]:
    """Turn a step's flat event list into phases (start order); safe on a live list."""
    out: list[DecodedPhase] = []
    stack: list[DecodedPhase] = []
    n = len(ev) - (len(ev) & 1)  # a concurrent reader may see half an event pair
    for i in range(0, n, 2):
        a = ev[i]
        if isinstance(a, Phase):
            ph = DecodedPhase(len(out), a, ev[i + 1], 0, stack[-1].ordinal if stack else -1,
                            None, i)
            out.append(ph)
            stack.append(ph)
        elif stack:
            ph = stack.pop()
            ph.end_ns = a
            ph.error = ev[i + 1]
            ph.end_pos = i
    return out


def flat_events(ev: list[Any]) -> tuple[list[Phase], list[int], list[int]] | None:
    """(phases, start_ns, end_ns) of a step whose phases ran one after another and none
    failed, by slices (no per-event Python loop); None for any other list (nested, failed,
    left open, or a live one): decode_events reads every list.
    """
    # Flat: each entry (phase, start) is followed by its exit (end, None), so phases sit at
    # positions 0 mod 4 only, int end times at 2 mod 4 and no exception at 3 mod 4.
    if len(ev) & 3:
        return None
    opens, ends = ev[0::4], ev[2::4]
    if opens and (any(ev[3::4]) or set(map(type, ends)) != _INT
                  or int in set(map(type, opens))):
        return None
    return opens, ev[1::4], ends


def _active_ordinal(ev: list[Any]) -> tuple[int, int]:
    """(ordinal of the innermost open phase or -1, number of phases started)."""
    stack: list[int] = []
    count = 0
    n = len(ev) - (len(ev) & 1)
    for i in range(0, n, 2):
        if isinstance(ev[i], Phase):
            stack.append(count)
            count += 1
        elif stack:
            stack.pop()
    return (stack[-1] if stack else -1), count


class _PhaseTable(dict):  # type: ignore[type-arg]
    """name -> reusable Phase of one kind; a missing name creates its Phase on first use."""

    def __init__(self, recorder: Recorder, kind: str) -> None:
        super().__init__()
        self._recorder = recorder
        self._kind = kind

    def __missing__(self, name: str) -> Phase:
        return self._recorder.phase(name, self._kind)


class _PureRecorderCore:
    """The recorder's hot fields as plain attributes: the twin of ``_recorder_c.RecorderCore``
    (which keeps them in C slots that the C phases and step loop read directly)."""


if TYPE_CHECKING:
    _RecorderCore = _PureRecorderCore
else:
    _RecorderCore = (_recorder_c.RecorderCore if _recorder_c is not None
                     else _PureRecorderCore)


class Recorder(_RecorderCore):
    """Where finished steps go: a bounded queue, plus what the watchdog needs to see."""

    def __init__(
        self,
        max_queued: int,
        drops: DropCounter,
        synchronize: Callable[[], None] | None,
        make_event: Callable[[], Any] | None = None,
    ) -> None:
        self.queue: deque[Step | MonitorRecord] = deque()
        self.max_queued = max_queued
        self.drops = drops
        self.synchronize = synchronize
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
        self.make_event = make_event
        self.plain = synchronize is None and make_event is None  # host clock only
        self._phase_cls = (SyncedPhase if synchronize is not None
                           else DeviceEventPhase if make_event is not None else Phase)
        self._phases: dict[tuple[str, str, str | None], Phase] = {}
        # The common lookups, by name alone: each running step's ``phase`` / ``monitor`` is
        # the bound ``__getitem__`` of these tables (a C call, no Python frame per phase).
        self.train_phases = _PhaseTable(self, KIND_TRAIN)
        self.monitor_phases = _PhaseTable(self, KIND_MONITOR)
        self.phase_lookup = self.train_phases.__getitem__
        self.monitor_lookup = self.monitor_phases.__getitem__

    def phase(self, name: str, kind: str, loader: str | None = None) -> Phase:
        """The reusable Phase for (name, kind, loader)."""
        key = (name, kind, loader)
        p = self._phases.get(key)
        if p is None:
            p = self._phases[key] = self._phase_cls(self, name, kind, loader)
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
            raise _nested(cur)
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
            self.held = step
        elif len(self.queue) < self.max_queued:
            self.queue.append(step)
        else:
            self.drops.add("record_queue_full", step.span_count())

    def device_step_start(self, step: Step) -> None:
        """The device side of a step's start (device_sync or events mode only)."""
        if self.synchronize is not None:
            self.synchronize()  # explicit: the step starts when the device is idle
        elif self.make_event is not None:
            step.dev = {-1: self.make_event()}

    def device_step_end(self, step: Step) -> None:
        """The device side of a step's end (device_sync or events mode only)."""
        if self.synchronize is not None:
            self.synchronize()  # explicit: the step ends when its device work has ended
        elif step.dev is not None:
            step.dev[-2] = self.make_event()

    def steps(self, iterable: Iterable[Any], loader: str | None) -> Iterator[Step]:
        """Yield a Step per item of ``iterable``; fetching the item is the ``data`` phase.

        Leaving the loop (``break``, an exception in its body) ends the step in progress and
        holds it (see ``held``). The C accelerator's ``StepLoop`` when built, else the
        generator :meth:`_steps_python`; the two behave alike.
        """
        if _recorder_c is not None:
            return _recorder_c.StepLoop(  # type: ignore[no-any-return]
                self, iterable, loader, self.phase(PHASE_DATA, KIND_TRAIN), Step, _nested)
        return self._steps_python(iterable, loader)

    def _steps_python(self, iterable: Iterable[Any], loader: str | None) -> Iterator[Step]:
        """The pure-Python twin of ``_recorder_c.StepLoop``.

        A step starts and ends here inline, as ``Step.__init__`` and ``finish_step`` would
        (which still end it on the exceptional paths): no Python call of their own per step.
        With each step after 1 ms of other work (cold caches, as in a real loop) that takes
        5-7% off a 7-span step's hot path: ~1.55 -> ~1.47x the floor of six empty ``with``
        blocks (module copies A/B, paired rounds); 4% with warm caches.
        """
        plain = self.plain
        sync = self.synchronize  # the step's start already synchronized: data starts clean
        finish = self.finish_step
        data = self.phase(PHASE_DATA, KIND_TRAIN)  # its loader is the step's
        new_step = Step.__new__
        train_lookup, monitor_lookup = self.phase_lookup, self.monitor_lookup
        it = iter(iterable)
        while True:
            if self.held is not None:
                self.release_held()
            if self.closed:
                return
            cur = self.current
            if cur is not None and not cur.end_ns:
                raise _nested(cur)
            step = new_step(Step)  # the stores of Step.__init__, without its call
            step.index = index = self.next_index
            self.next_index = index + 1
            step.loader = loader
            step._recorder = self
            step.phase = train_lookup  # type: ignore[method-assign, assignment]
            step.monitor = monitor_lookup  # type: ignore[method-assign, assignment]
            if not plain:
                self.device_step_start(step)
            step.start_ns = t = perf_counter_ns()
            step.ev = ev = [data, t]  # the data phase opens with the step
            self.current = step
            self.ev = ev
            try:
                batch = next(it)
            except StopIteration:
                self.current = self.ev = None  # no batch, no step
                self.next_index = index
                return
            except BaseException as exc:
                ev.append(perf_counter_ns())
                ev.append(exc)
                finish(step, exc)
                raise
            if sync is not None:
                sync()  # explicit: device work of the fetch (e.g. a copy) counts as data
            ev.append(perf_counter_ns())
            ev.append(None)
            step.batch = batch
            try:
                yield step
            except GeneratorExit:
                # The loop was left: by ``break`` or by an exception in its body. Hold the
                # step until the next event so Run.__exit__ can still mark it failed.
                finish(step, None, True)
                raise
            except BaseException as exc:
                finish(step, exc)
                raise
            if step.end_ns:
                continue  # ended in the body (step.end(), or the run's shutdown)
            # finish_step's usual path, inline.
            if not plain:
                self.device_step_end(step)
            step.end_ns = end = perf_counter_ns()
            del step.phase, step.monitor  # back to the methods that refuse an ended step
            step.batch = None  # the background must never keep a batch (or its memory)
            if self.current is step:
                self.current = self.ev = None
            self.last_step_end_ns = end
            queue = self.queue  # read per step: a forked child's run swaps it out
            if len(queue) < self.max_queued:
                queue.append(step)
            else:
                self.drops.add("record_queue_full", step.span_count())

    def timestamp_ns(self) -> int:
        """A phase-boundary timestamp (``perf_counter_ns``), synchronizing per device_sync."""
        sync = self.synchronize
        if sync is not None:
            sync()  # explicit: the run's device_sync choice, as at every phase boundary
        return perf_counter_ns()

    def submit(self, record: Step | MonitorRecord) -> None:
        """Queue a finished record for the background; count it if the queue is full."""
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
        record = self.open_record
        if record is not None and not record.end_ns:
            return record.after_step, record.name, record.start_ns
        step = self.current
        if step is None or step.end_ns:
            return None
        for ph in decode_events(list(step.ev)):
            if not ph.end_ns and ph.phase.kind == KIND_MONITOR:
                return step.index, ph.phase.name, ph.start_ns
        return None

    def in_progress(self) -> tuple[int, int, str | None, int] | None:
        """(step index, step start ns, active phase name, phase start ns) or None; any thread."""
        step = self.current
        if step is None or step.end_ns:
            return None
        phases = decode_events(list(step.ev))
        for ph in reversed(phases):
            if not ph.end_ns:
                return step.index, step.start_ns, ph.phase.name, ph.start_ns
        return step.index, step.start_ns, None, step.start_ns


class _PureStepCore:
    """A step's fields and phase lookups in pure Python: the twin of ``_recorder_c.StepCore``.

    While a step runs, its ``phase`` / ``monitor`` are shadowed by the bound ``__getitem__``
    of the recorder's tables (a lookup done in C, no Python frame per phase); when it ends
    they fall back to the methods here, which refuse. The C twin checks ``end_ns`` in C.
    """

    _recorder: Recorder
    # Defaults live on the class: a step sets only what every step has.
    batch: Any = None
    error: BaseException | None = None
    end_ns: int = 0

    def phase(self, name: str) -> Phase:
        """A training phase (forward, backward, optimizer, or your own name)."""
        if self.end_ns:
            raise _ended(self, name)  # type: ignore[arg-type]
        return self._recorder.train_phases[name]  # type: ignore[no-any-return]

    def monitor(self, name: str) -> Phase:
        """A monitoring phase (inference, val_loss, ...): counts toward monitoring overhead."""
        if self.end_ns:
            raise _ended(self, name)  # type: ignore[arg-type]
        return self._recorder.monitor_phases[name]  # type: ignore[no-any-return]


if TYPE_CHECKING:
    _StepCore = _PureStepCore
else:
    _StepCore = _recorder_c.StepCore if _recorder_c is not None else _PureStepCore
# The pure twin's running steps shadow phase/monitor with the tables' lookups (see above).
_SHADOWED_LOOKUPS = _recorder_c is None


class Step(_StepCore):
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
    dev: dict[int, Any] | None = None  # events mode: boundary position -> event; -1/-2 step

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
        return _ended(self, name)

    def set_attribute(self, key: str, value: Any) -> None:
        """Set an attribute on the step's root span; never forces a device sync.

        A tensor is kept (detached) and read in the background, not with ``.item()`` here.
        """
        if type(key) is not str or not key:
            raise _bad_key(key)
        attrs = self.attrs
        if attrs is None:
            attrs = self.attrs = {}
        attrs[key] = _detach(value)

    def iter_data(self, iterable: Iterable[Any], loader: str) -> Iterator[Any]:
        """Iterate ``iterable``, timing each fetch as a ``data`` phase of loader ``loader``.

        For validation loaders inside a monitoring phase, e.g.
        ``for vb in step.iter_data(val_loader, loader="val"):``.
        """
        if self.end_ns:
            raise _ended(self, f"{PHASE_DATA}[{loader}]")
        phase = self._recorder.phase(PHASE_DATA, KIND_TRAIN, loader)
        sync = self._recorder.synchronize
        ev = self.ev
        it = iter(iterable)
        while True:
            if self.end_ns:
                return  # the step ended while the caller still iterated: stop recording
            if sync is not None:
                sync()  # explicit: the fetch's own device work starts clean
            ev.append(phase)
            ev.append(perf_counter_ns())
            try:
                item = next(it)
            except StopIteration:
                del ev[-2:]  # the fetch that found the loader exhausted is not a batch
                return
            except BaseException as exc:
                ev.append(perf_counter_ns())
                ev.append(exc)
                if self.error is None:
                    self.error = exc
                raise
            if sync is not None:
                sync()  # explicit: device work of the fetch counts as data
            ev.append(perf_counter_ns())
            ev.append(None)
            yield item

    # -- phases from events (integrations: hooks and callbacks split a with-block) -------
    def open_phase(self, name: str, kind: str = KIND_TRAIN, start_ns: int | None = None,
                   loader: str | None = None, attributes: dict[str, Any] | None = None
                   ) -> None:
        """Open a phase at ``start_ns`` (a ``perf_counter_ns`` value; default now).

        It nests inside the innermost open phase, exactly like a ``with`` block; close it
        with :meth:`close_phase`. Use :meth:`Run.timestamp_ns` for boundary timestamps that
        honour ``device_sync``.
        """
        if self.end_ns:
            raise _ended(self, name)
        ev = self.ev
        if attributes:
            self._attrs_for_next_phase(attributes)
        ev.append(self._recorder.phase(name, kind, loader))
        ev.append(perf_counter_ns() if start_ns is None else start_ns)

    def close_phase(self, end_ns: int | None = None, error: BaseException | None = None
                    ) -> None:
        """Close the innermost open phase at ``end_ns`` (default now), failed if ``error``."""
        ev = self.ev
        ev.append(perf_counter_ns() if end_ns is None else end_ns)
        ev.append(error)
        if error is not None and self.error is None:
            self.error = error

    def record_phase(self, name: str, start_ns: int, end_ns: int, kind: str = KIND_TRAIN,
                     loader: str | None = None, attributes: dict[str, Any] | None = None
                     ) -> None:
        """Record a finished phase (``perf_counter_ns`` times) inside the innermost open one."""
        if self.end_ns:
            raise _ended(self, name)
        if attributes:
            self._attrs_for_next_phase(attributes)
        self.ev.extend((self._recorder.phase(name, kind, loader), start_ns, end_ns, None))

    def _attrs_for_next_phase(self, attributes: dict[str, Any]) -> None:
        ordinal = sum(1 for e in self.ev if isinstance(e, Phase))
        if self.phase_attrs is None:
            self.phase_attrs = {}
        self.phase_attrs[ordinal] = {k: _detach(v) for k, v in attributes.items()}

    # -- lifecycle and background helpers -----------------------------------------------
    def span_count(self) -> int:
        """Spans this step will produce (root + phases)."""
        return 1 + sum(1 for e in self.ev if isinstance(e, Phase))

    def _set_phase_attribute(self, key: str, value: Any) -> None:
        if type(key) is not str or not key:
            raise _bad_key(key)
        ordinal, _ = _active_ordinal(self.ev)
        if ordinal < 0:
            raise RuntimeError(f"set_attribute({key!r}): no phase is open in step {self.index}")
        if self.phase_attrs is None:
            self.phase_attrs = {}
        self.phase_attrs.setdefault(ordinal, {})[key] = _detach(value)

    def _active_span_ordinal(self) -> int:
        return _active_ordinal(self.ev)[0]

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


class MonitorRecord:
    """Monitoring work done outside any step (``run.monitor``): one root span."""

    __slots__ = ("name", "after_step", "start_ns", "end_ns", "error", "attrs", "trace_id",
                 "span_id", "_recorder")

    def __init__(self, recorder: Recorder, name: str) -> None:
        self.name = name
        self.after_step = recorder.next_index - 1
        self.error: BaseException | None = None
        self.attrs: dict[str, Any] | None = None
        self.start_ns = 0
        self.end_ns = 0
        self.trace_id = 0  # drawn when a user span inside asks for it, else when built
        self.span_id = 0
        self._recorder = recorder

    def start(self, start_ns: int | None = None) -> MonitorRecord:
        """Start timing, at ``start_ns`` (``perf_counter_ns``) if the start was seen earlier."""
        if start_ns is None:
            sync = self._recorder.synchronize
            if sync is not None:
                sync()  # explicit: measure only this operation's device work
            start_ns = perf_counter_ns()
        self.start_ns = start_ns
        self._recorder.open_record = self
        return self

    def end(self, end_ns: int | None = None, error: BaseException | None = None) -> None:
        """Stop timing (at ``end_ns`` if given) and hand the span to the background."""
        if self.end_ns:
            return
        if end_ns is None:
            sync = self._recorder.synchronize
            if sync is not None:
                sync()  # explicit: this operation's device work counts in this operation
            end_ns = perf_counter_ns()
        self.end_ns = end_ns
        self.error = error
        rec = self._recorder
        if rec.open_record is self:
            rec.open_record = None
        rec.submit(self)

    def __enter__(self) -> MonitorRecord:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self.end(error=exc)
        return False

    def set_attribute(self, key: str, value: Any) -> None:
        """Set an attribute on this operation's span."""
        if type(key) is not str or not key:
            raise _bad_key(key)
        if self.attrs is None:
            self.attrs = {}
        self.attrs[key] = _detach(value)

    def span_count(self) -> int:
        """One span."""
        return 1


def _bad_key(key: Any) -> ValueError:
    # Refused at the call: in the background the value could only be dropped with a warning.
    return ValueError(f"set_attribute: the key must be a non-empty string, got {key!r}")


def _outside(name: str) -> RuntimeError:
    return RuntimeError(
        f"phase {name!r} opened outside a step: open phases inside "
        "`for step in run.steps(...)` or `with run.step() as step:`")


def _nested(step: Step) -> RuntimeError:
    return RuntimeError(
        f"step {step.index} is still in progress: steps do not nest (end it first)")


def _ended(step: Step, name: str) -> RuntimeError:
    return RuntimeError(
        f"phase {name!r} opened on step {step.index}, which has already ended; "
        "open phases inside the step's loop body, and time work after the loop (a final "
        f"eval) with run.monitor({name!r}) instead")


def _detach(value: Any) -> Any:
    # Tensors: keep a detached reference (no graph, no sync); the builder reads the value.
    detach = getattr(value, "detach", None)
    return detach() if detach is not None else value


def calibrate_ns_per_phase(rounds: int = 200) -> float:
    """This machine's CPU cost of one recorded phase (for the self-cost gauge)."""
    from otel_train.common.drop_counter import DropCounter

    rec = Recorder(rounds + 1, DropCounter(), None)
    t0 = thread_time_ns()
    for i in range(rounds):
        step = rec.begin_step(None, i)
        with step.phase("a"):
            pass
        rec.finish_step(step, None)
        rec.queue.clear()
    return max((thread_time_ns() - t0) / (rounds * 2), 0.0)
