"""The hot path in pure Python: the reference twin of the C accelerator (``_recorder_c``).

Each type here is the twin of one in ``_recorder_c.c``, with the same fields and behaviour:
``PurePhaseCore`` of ``PhaseCore`` (a phase's ``__enter__`` / ``__exit__``),
``PureStepCore`` of ``StepCore`` (a step's fields and phase lookups),
``PureRecorderCore`` of ``RecorderCore`` (the recorder's hot fields) and ``step_loop`` of
``StepLoop`` (``run.steps``' loop, which starts and ends each step inline, as
``Step.__init__`` and ``Recorder.finish_step`` would, with no Python call of their own per
step; they still end it on the rare paths). ``recorder.py`` builds ``Phase``, ``Step`` and
``Recorder`` on whichever twin runs: this one where the accelerator was not built or with
``OTEL_TRAIN_PURE_PYTHON=1``. The tests run against both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from time import perf_counter_ns
from typing import Any

from otel_train.recording.call_checks import ended_step_error, outside_step_error


class PurePhaseCore:
    """A phase's hot path in pure Python: the twin of ``_recorder_c.PhaseCore``."""

    __slots__ = ("_rec", "name", "kind", "loader")

    def __init__(self, recorder: Any, name: str, kind: str, loader: str | None = None
                 ) -> None:
        self._rec = recorder
        self.name = name
        self.kind = kind
        self.loader = loader

    # ``_clock`` is bound as a default argument: a local, not a global lookup, on every use.
    # Two appends beat one extend of a new tuple; a reader of a live list may see half a
    # pair, which decode_events allows for.
    def __enter__(self, _clock: Callable[[], int] = perf_counter_ns) -> Any:
        ev = self._rec.ev  # the current step's event list, None between steps
        if ev is None:
            raise outside_step_error(self.name)
        ev.append(self)
        ev.append(_clock())
        return self

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


class PureStepCore:
    """A step's fields and phase lookups in pure Python: the twin of ``_recorder_c.StepCore``.

    While a step runs, its ``phase`` / ``monitor`` are shadowed by the bound ``__getitem__``
    of the recorder's tables (a lookup done in C, no Python frame per phase); when it ends
    they fall back to the methods here, which refuse. The C twin checks ``end_ns`` in C.
    """

    _recorder: Any
    index: int
    # Defaults live on the class: a step sets only what every step has.
    batch: Any = None
    error: BaseException | None = None
    end_ns: int = 0

    def phase(self, name: str) -> Any:
        """A training phase (forward, backward, optimizer, or your own name)."""
        if self.end_ns:
            raise ended_step_error(self, name)
        return self._recorder.train_phases[name]

    def monitor(self, name: str) -> Any:
        """A monitoring phase (inference, val_loss, ...): counts toward monitoring overhead."""
        if self.end_ns:
            raise ended_step_error(self, name)
        return self._recorder.monitor_phases[name]


class PureRecorderCore:
    """The recorder's hot fields as plain attributes: the twin of ``_recorder_c.RecorderCore``
    (which keeps them in C slots that the C phases and step loop read directly)."""

    ring: Any = None  # the step ring's writer, or None (step_ring.attach_ring)


def step_loop(rec: Any, iterable: Iterable[Any], loader: str | None, data: Any,
              step_type: type, nested_error: Callable[[Any], Exception],
              max_steps: int | None = None, counter: Any = None) -> Iterator[Any]:
    """The twin of ``_recorder_c.StepLoop``: a step per item, fetching it is ``data``;
    ``counter`` (a ``BatchCounter``) counts each batch after the fetch."""
    steps = _steps(rec, iterable, loader, data, step_type, nested_error, max_steps, counter)
    del iterable  # as the C twin: the loop keeps the iterator, not the iterable
    try:
        yield from steps
    finally:
        if counter is not None and counter.loop_mode == 2:
            counter.before_fetch(None)  # a FLOP count still open ends with the loop (lost)


def _steps(rec: Any, iterable: Iterable[Any], loader: str | None, data: Any,
           step_type: type, nested_error: Callable[[Any], Exception],
           max_steps: int | None, counter: Any) -> Iterator[Any]:
    plain, sync = rec.plain, rec.synchronize  # a step's start synced: data starts clean
    new_step = step_type.__new__
    train_lookup, monitor_lookup = rec.phase_lookup, rec.monitor_lookup
    it: Iterator[Any] | None = None
    left = -1 if max_steps is None else max_steps  # steps this loop may still start
    while left:
        left -= 1
        if rec.held is not None or rec.closed or rec.current is not None:
            if not _may_start(rec, nested_error):
                return
        step = new_step(step_type)  # the stores of Step.__init__, without its call
        step.index = index = rec.next_index
        rec.next_index = index + 1
        step.loader, step._recorder = loader, rec
        step.phase, step.monitor = train_lookup, monitor_lookup
        if not plain:
            rec.device_step_start(step)
        step.start_ns = t = perf_counter_ns()
        step.ev = ev = [data, t]  # the data phase opens with the step
        rec.current, rec.ev = step, ev
        try:
            if it is None:  # in the first step's data phase: a DataLoader starts its workers
                it = iter(iterable)
                del iterable  # as the C twin: the loop keeps the iterator, not the iterable
            # The counter's work this step (loop_mode: 0 none, 1 count the batch after the
            # fetch, 2 also end the open FLOP count before it), read once a step.
            count_mode = counter.loop_mode if counter is not None else 0
            if count_mode == 2:
                counter.before_fetch(step)
            batch = next(it)
        except BaseException as exc:
            if _end_fetch(rec, step, exc):
                return  # the loader is exhausted
            raise
        if sync is not None:
            sync()  # explicit: device work of the fetch (e.g. a copy) counts as data
        ev.append(perf_counter_ns())
        ev.append(None)
        if count_mode:  # after the data phase: the counter times its own work
            counter.on_batch(step, batch)
        step.batch = batch
        try:
            yield step
        except BaseException as exc:
            _leave_loop(rec, step, exc)
            raise
        if not step.end_ns:  # else ended in the body (step.end(), or the run's shutdown)
            _end_step(rec, step, plain)


def _end_step(rec: Any, step: Any, plain: bool) -> None:
    """The step the loop body left: finish_step's usual path, inline."""
    if not plain:
        rec.device_step_end(step)
    step.end_ns = end = perf_counter_ns()
    del step.phase, step.monitor  # back to the methods that refuse an ended step
    step.batch = None  # the background must never keep a batch (or its memory)
    if rec.current is step:
        rec.current = rec.ev = None
    rec.last_step_end_ns = end
    queue = rec.queue  # read per step: a forked child's run swaps it out
    if rec.ring is not None:  # the step ring takes it (or queues it behind a marker)
        rec.ring.write_step(step)
    elif len(queue) < rec.max_queued:
        queue.append(step)
    else:
        rec.drops.add("record_queue_full", step.span_count())


def _may_start(rec: Any, nested_error: Callable[[Any], Exception]) -> bool:
    """The rare checks before a step starts: the held step goes first; a closed recorder
    starts none (False); a step still running refuses a nested one."""
    if rec.held is not None:
        rec.release_held()
    if rec.closed:
        return False
    cur = rec.current
    if cur is not None and not cur.end_ns:
        raise nested_error(cur)
    return True


def _end_fetch(rec: Any, step: Any, exc: BaseException) -> bool:
    """After a fetch raised ``exc``: True when the loader is exhausted (no batch, so no
    step: it is undone), else end ``step`` failed by its fetch and return False."""
    if isinstance(exc, StopIteration):
        rec.current = rec.ev = None
        rec.next_index = step.index
        return True
    ev = step.ev
    ev.append(perf_counter_ns())
    ev.append(exc)
    rec.finish_step(step, exc)
    return False


def _leave_loop(rec: Any, step: Any, exc: BaseException) -> None:
    """End ``step`` as its loop body is left by ``exc``."""
    if isinstance(exc, GeneratorExit):
        # By ``break`` or by an exception in the body: hold the step until the next event,
        # so that Run.__exit__ can still mark it failed.
        rec.finish_step(step, None, True)
    else:
        rec.finish_step(step, exc)
