"""The hot path: steps and phases that only take timestamps and append.

Nothing here creates OpenTelemetry SDK objects. A phase is a small list
``[name, kind, parent_index, start_ns, end_ns, span_id, error, attributes, loader]``
appended to its step; a finished step is appended to a bounded deque that the background
worker drains (``spans.py``). Timestamps are ``perf_counter_ns``; the builder converts them
to epoch nanoseconds with one offset taken at run start.

Device synchronization, when enabled (``device.py``), is an explicit call at every step and
phase boundary: it is the one thing here that may wait on the device, and it is chosen.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any

from otel_train.attributes import KIND_MONITOR, KIND_TRAIN, PHASE_DATA

if TYPE_CHECKING:
    from otel_train.accounting import DropCounter

# Indices into a phase list (a list, not an object: the cheapest thing to build and append).
NAME, KIND, PARENT, START, END, SPAN_ID, ERROR, ATTRS, LOADER = range(9)


class Recorder:
    """Where finished steps go: a bounded queue, plus what the watchdog needs to see."""

    def __init__(
        self,
        max_queued: int,
        drops: DropCounter,
        synchronize: Callable[[], None] | None,
    ) -> None:
        self.queue: deque[Step | MonitorRecord] = deque()
        self.max_queued = max_queued
        self.drops = drops
        self.synchronize = synchronize
        self.current: Step | None = None  # the step in progress (read by watchdog and proxy)
        self.closed = False
        self.next_index = 0
        self.steps_recorded = 0
        self.last_step_end_ns = 0
        # A step closed by GeneratorExit is held back until the next event, so that an
        # exception escaping the loop body (seen later by Run.__exit__) can still mark it.
        self.held: Step | None = None

    def submit(self, record: Step | MonitorRecord) -> None:
        """Queue a finished record for the background; count it if the queue is full."""
        q = self.queue
        if len(q) < self.max_queued:
            q.append(record)
        else:
            self.drops.add("record_queue_full", 1 + len(record.phases))

    def release_held(self, error: BaseException | None = None) -> None:
        """Submit the held step, marking it failed with ``error`` if given."""
        held = self.held
        if held is not None:
            self.held = None
            if error is not None and held.error is None:
                held.error = error
            self.submit(held)

    def in_progress(self) -> tuple[int, int, str | None, int] | None:
        """(step index, step start ns, active phase name, phase start ns) or None; any thread."""
        step = self.current
        if step is None or step.end_ns:
            return None
        active = step.active
        phases = step.phases
        if 0 <= active < len(phases):
            ph = phases[active]
            return step.index, step.start_ns, ph[NAME], ph[START]
        return step.index, step.start_ns, None, step.start_ns


class Phase:
    """A timed phase of a step; a context manager. Phases may nest."""

    __slots__ = ("_step", "_name", "_kind", "_ph")

    def __init__(self, step: Step, name: str, kind: str) -> None:
        self._step = step
        self._name = name
        self._kind = kind
        self._ph: list[Any] | None = None

    def __enter__(self) -> Phase:
        step = self._step
        if step.end_ns:
            raise RuntimeError(
                f"phase {self._name!r} opened on step {step.index}, which has already ended; "
                "open phases inside the step's loop body"
            )
        sync = step._sync
        if sync is not None:
            sync()  # explicit: drain device work from before this phase (device_sync)
        ph = [self._name, self._kind, step.active, perf_counter_ns(), 0, 0, None, None, None]
        phases = step.phases
        step.active = len(phases)
        phases.append(ph)
        self._ph = ph
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        sync = self._step._sync
        if sync is not None:
            sync()  # explicit: this phase's device work counts in this phase
        ph = self._ph
        ph[END] = perf_counter_ns()
        step = self._step
        step.active = ph[PARENT]
        if exc is not None:
            ph[ERROR] = exc
            if step.error is None:
                step.error = exc
        return False  # never swallow: the exception propagates unchanged

    def set_attribute(self, key: str, value: Any) -> None:
        """Set an attribute on this phase's span (tensors are read off the hot path)."""
        ph = self._ph
        if ph is None:
            raise RuntimeError("set_attribute on a phase that has not started")
        if ph[ATTRS] is None:
            ph[ATTRS] = {}
        ph[ATTRS][key] = _detach(value)


class Step:
    """One training step: the root span ``train.step`` and its phases.

    ``step.batch`` holds what the data phase fetched; it is released when the step ends so
    the background never keeps a batch (and its device memory) alive.
    """

    __slots__ = ("index", "batch", "loader", "start_ns", "end_ns", "phases", "active", "error",
                 "attrs", "root_span_id", "trace_id", "_sync", "_recorder", "kind")

    def __init__(self, recorder: Recorder, index: int, loader: str | None) -> None:
        self.index = index
        self.batch: Any = None
        self.loader = loader
        self.phases: list[list[Any]] = []
        self.active = -1
        self.error: BaseException | None = None
        self.attrs: dict[str, Any] | None = None
        self.root_span_id = 0
        self.trace_id = 0
        self.end_ns = 0
        self.kind = KIND_TRAIN
        self._recorder = recorder
        sync = self._sync = recorder.synchronize
        if sync is not None:
            sync()  # explicit: the step starts when the device is idle
        self.start_ns = perf_counter_ns()

    # -- the public API ------------------------------------------------------------------
    def phase(self, name: str) -> Phase:
        """A training phase (forward, backward, optimizer, or your own name)."""
        return Phase(self, name, KIND_TRAIN)

    def monitor(self, name: str) -> Phase:
        """A monitoring phase (inference, val_loss, ...): counts toward monitoring overhead."""
        return Phase(self, name, KIND_MONITOR)

    def set_attribute(self, key: str, value: Any) -> None:
        """Set an attribute on the step's root span; never forces a device sync.

        A tensor is kept (detached) and read in the background, not with ``.item()`` here.
        """
        attrs = self.attrs
        if attrs is None:
            attrs = self.attrs = {}
        attrs[key] = _detach(value)

    def iter_data(self, iterable: Iterable[Any], loader: str) -> Iterator[Any]:
        """Iterate ``iterable``, timing each fetch as a ``data`` phase of loader ``loader``.

        For validation loaders inside a monitoring phase, e.g.
        ``for vb in step.iter_data(val_loader, loader="val"):``.
        """
        it = iter(iterable)
        while True:
            ph = [PHASE_DATA, self._kind_of_active(), self.active, perf_counter_ns(), 0, 0,
                  None, None, loader]
            try:
                item = next(it)
            except StopIteration:
                return
            except BaseException as exc:
                ph[END] = perf_counter_ns()
                ph[ERROR] = exc
                self.phases.append(ph)
                if self.error is None:
                    self.error = exc
                raise
            ph[END] = perf_counter_ns()
            self.phases.append(ph)
            yield item

    # -- lifecycle ----------------------------------------------------------------------
    def _kind_of_active(self) -> str:
        active = self.active
        return self.phases[active][KIND] if active >= 0 else KIND_TRAIN

    def _finish(self, error: BaseException | None, hold: bool = False) -> None:
        if self.end_ns:
            return
        sync = self._sync
        if sync is not None:
            sync()  # explicit: the step ends when its device work has ended
        self.end_ns = perf_counter_ns()
        if error is not None and self.error is None:
            self.error = error
        self.batch = None
        rec = self._recorder
        if rec.current is self:
            rec.current = None
        rec.steps_recorded += 1
        rec.last_step_end_ns = self.end_ns
        if hold:
            rec.held = self
        else:
            rec.submit(self)

    def __enter__(self) -> Step:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self._finish(exc)
        return False

    def __repr__(self) -> str:
        return f"<Step {self.index} phases={len(self.phases)}{' ended' if self.end_ns else ''}>"


class MonitorRecord:
    """Monitoring work done outside any step (``run.monitor``): one root span."""

    __slots__ = ("name", "after_step", "start_ns", "end_ns", "error", "attrs", "phases",
                 "_recorder", "_sync")

    def __init__(self, recorder: Recorder, name: str) -> None:
        self.name = name
        self.after_step = recorder.next_index - 1
        self.phases: list[list[Any]] = []
        self.error: BaseException | None = None
        self.attrs: dict[str, Any] | None = None
        self.start_ns = 0
        self.end_ns = 0
        self._recorder = recorder
        self._sync = recorder.synchronize

    def __enter__(self) -> MonitorRecord:
        if self._sync is not None:
            self._sync()  # explicit: measure only this operation's device work
        self.start_ns = perf_counter_ns()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if self._sync is not None:
            self._sync()
        self.end_ns = perf_counter_ns()
        self.error = exc
        self._recorder.submit(self)
        return False

    def set_attribute(self, key: str, value: Any) -> None:
        """Set an attribute on this operation's span."""
        if self.attrs is None:
            self.attrs = {}
        self.attrs[key] = _detach(value)


def _detach(value: Any) -> Any:
    # Tensors: keep a detached reference (no graph, no sync); the builder reads the value.
    detach = getattr(value, "detach", None)
    return detach() if detach is not None else value
