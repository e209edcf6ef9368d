"""A step's phases from timestamps: for hooks and callbacks that split a ``with`` block; and
``iter_data``, a data phase per fetch of a loop the step's body runs itself.

Integrations see a phase's start and end in different callbacks (a forward pre-hook and
post-hook, ``on_step_begin`` and ``on_step_end``), so they cannot wrap it in ``with``: they
open and close it by timestamps instead, or record it whole once it has ended. The events
go to the same flat list a ``with`` block writes (see ``step_events.py``), so the phases
nest and decode alike.

Usage::

    t0 = run.timestamp_ns()
    step.open_phase("forward", start_ns=t0)
    ...
    step.close_phase(run.timestamp_ns())
    step.record_phase("data", fetch_start_ns, fetch_end_ns, loader="train")
"""

from __future__ import annotations

from time import perf_counter_ns
from collections.abc import Iterable, Iterator
from typing import Any

from otel_train.common.attributes import KIND_MONITOR, KIND_TRAIN, PHASE_DATA
from otel_train.recording.call_checks import ended_step_error
from otel_train.recording.step_events import PhaseEntry, active_ordinal


class StepPhaseEvents:
    """``Step``'s phases opened, closed or recorded by timestamps (a mixin of ``Step``)."""

    __slots__ = ()
    _recorder: Any
    end_ns: int
    ev: list[Any]
    error: BaseException | None
    phase_attrs: dict[int, dict[str, Any]] | None
    dev: dict[int, Any] | None
    # Monitoring phases opened here under monitor_sync and not yet closed (a class default:
    # a step writes it only when it opens one).
    monitors_open = 0
    # monitor_sync: event-list position of a monitoring phase -> ns its start's synchronize
    # waited for the work queued before it (the builder puts it on the phase's span).
    queued_waits: dict[int, int] | None = None

    def open_phase(self, name: str, kind: str = KIND_TRAIN, start_ns: int | None = None,
                   loader: str | None = None, attributes: dict[str, Any] | None = None
                   ) -> None:
        """Open a phase at ``start_ns`` (a ``perf_counter_ns`` value; default now).

        It nests inside the innermost open phase, exactly like a ``with`` block; close it
        with :meth:`close_phase`. Use :meth:`Run.timestamp_ns` for boundary timestamps that
        honour ``device_sync``.
        """
        if self.end_ns:
            raise ended_step_error(self, name)
        ev = self.ev
        rec = self._recorder
        if attributes:
            self._attrs_for_next_phase(attributes)
        if kind == KIND_MONITOR and rec.monitor_synchronize is not None:
            # explicit (monitor_sync): the training work still queued runs first, charged
            # to training; a start seen earlier by a callback moves to after that wait.
            waited = rec.monitor_synchronize()  # explicit: monitor_sync, see above
            now = perf_counter_ns()
            start_ns = now if start_ns is None else max(start_ns, now)
            self.monitors_open += 1
            self.note_queued_wait(len(ev), waited)
        if self.dev is not None:  # a sampled step: the boundary's device event and peaks, now
            rec.probes.boundary(self.dev, len(ev))
        ev.append(rec.phase(name, kind, loader))
        ev.append(perf_counter_ns() if start_ns is None else start_ns)

    def close_phase(self, end_ns: int | None = None, error: BaseException | None = None
                    ) -> None:
        """Close the innermost open phase at ``end_ns`` (default now), failed if ``error``."""
        ev = self.ev
        rec = self._recorder
        probes = rec.probes
        if self.monitors_open and self._closing_monitor():
            # explicit (monitor_sync): the monitoring phase's own kernels finish inside it,
            # even when its end was seen earlier by a callback.
            rec.monitor_synchronize()  # explicit: monitor_sync, see above
            now = perf_counter_ns()
            end_ns = now if end_ns is None else max(end_ns, now)
            self.monitors_open -= 1
        if self.dev is not None:
            probes.boundary(self.dev, len(ev))
        elif error is not None and probes is not None:
            probes.phase_failed(self, len(ev), error)  # out of memory: keep the peak
        ev.append(perf_counter_ns() if end_ns is None else end_ns)
        ev.append(error)
        if error is not None and self.error is None:
            self.error = error

    def note_queued_wait(self, pos: int, waited_ns: Any) -> None:
        """The monitoring phase opening at event position ``pos`` waited ``waited_ns`` for
        the work queued before it (monitor_sync)."""
        if type(waited_ns) is not int:
            return
        waits = self.queued_waits
        if waits is None:
            waits = self.queued_waits = {}
        waits[pos] = waited_ns

    def _closing_monitor(self) -> bool:
        """The innermost open phase is a monitoring one (read only while one is open)."""
        ordinal, _ = active_ordinal(self.ev)
        if ordinal < 0:
            return False
        seen = -1
        for e in self.ev:
            if isinstance(e, PhaseEntry):
                seen += 1
                if seen == ordinal:
                    return e.kind == KIND_MONITOR
        return False

    def record_phase(self, name: str, start_ns: int, end_ns: int, kind: str = KIND_TRAIN,
                     loader: str | None = None, attributes: dict[str, Any] | None = None
                     ) -> None:
        """Record a finished phase (``perf_counter_ns`` times) inside the innermost open one."""
        if self.end_ns:
            raise ended_step_error(self, name)
        if attributes:
            self._attrs_for_next_phase(attributes)
        self.ev.extend((self._recorder.phase(name, kind, loader), start_ns, end_ns, None))

    def iter_data(self, iterable: Iterable[Any], loader: str) -> Iterator[Any]:
        """Iterate ``iterable``, timing each fetch as a ``data`` phase of loader ``loader``.

        For validation loaders inside a monitoring phase, e.g.
        ``for vb in step.iter_data(val_loader, loader="val"):``.
        """
        if self.end_ns:
            raise ended_step_error(self, f"{PHASE_DATA}[{loader}]")
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

    def _attrs_for_next_phase(self, attributes: dict[str, Any]) -> None:
        """Keep ``attributes`` for the phase about to be opened (by its ordinal)."""
        ordinal = sum(1 for e in self.ev if isinstance(e, PhaseEntry))
        if self.phase_attrs is None:
            self.phase_attrs = {}
        keep = self._recorder.keep_value
        self.phase_attrs[ordinal] = {k: keep(v) for k, v in attributes.items()}
