"""A step's phases from timestamps: for hooks and callbacks that split a ``with`` block.

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
from typing import Any

from otel_train.common.attributes import KIND_TRAIN
from otel_train.recording.call_checks import detached, ended_step_error
from otel_train.recording.step_events import PhaseEntry


class StepPhaseEvents:
    """``Step``'s phases opened, closed or recorded by timestamps (a mixin of ``Step``)."""

    __slots__ = ()
    _recorder: Any
    end_ns: int
    ev: list[Any]
    error: BaseException | None
    phase_attrs: dict[int, dict[str, Any]] | None
    dev: dict[int, Any] | None

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
        if attributes:
            self._attrs_for_next_phase(attributes)
        if self.dev is not None:  # a sampled step: the boundary's device event and peaks, now
            self._recorder.probes.boundary(self.dev, len(ev))
        ev.append(self._recorder.phase(name, kind, loader))
        ev.append(perf_counter_ns() if start_ns is None else start_ns)

    def close_phase(self, end_ns: int | None = None, error: BaseException | None = None
                    ) -> None:
        """Close the innermost open phase at ``end_ns`` (default now), failed if ``error``."""
        ev = self.ev
        probes = self._recorder.probes
        if self.dev is not None:
            probes.boundary(self.dev, len(ev))
        elif error is not None and probes is not None:
            probes.phase_failed(self, len(ev), error)  # out of memory: keep the peak
        ev.append(perf_counter_ns() if end_ns is None else end_ns)
        ev.append(error)
        if error is not None and self.error is None:
            self.error = error

    def record_phase(self, name: str, start_ns: int, end_ns: int, kind: str = KIND_TRAIN,
                     loader: str | None = None, attributes: dict[str, Any] | None = None
                     ) -> None:
        """Record a finished phase (``perf_counter_ns`` times) inside the innermost open one."""
        if self.end_ns:
            raise ended_step_error(self, name)
        if attributes:
            self._attrs_for_next_phase(attributes)
        self.ev.extend((self._recorder.phase(name, kind, loader), start_ns, end_ns, None))

    def _attrs_for_next_phase(self, attributes: dict[str, Any]) -> None:
        """Keep ``attributes`` for the phase about to be opened (by its ordinal)."""
        ordinal = sum(1 for e in self.ev if isinstance(e, PhaseEntry))
        if self.phase_attrs is None:
            self.phase_attrs = {}
        self.phase_attrs[ordinal] = {k: detached(v) for k, v in attributes.items()}
