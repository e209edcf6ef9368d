"""A step's flat event list, read back into phases.

A running step records its phases as one flat list: entering a phase appends
``(phase, start_ns)``, leaving it appends ``(end_ns, exception_or_None)``; phases nest by the
order of these pairs. The readers here run in the background (span building) and in other
threads (the watchdog, user spans asking for the active phase), on finished lists and on
live ones, where a reader may see half a pair.

Usage::

    for ph in decode_events(step.ev):
        print(ph.phase.name, ph.parent, ph.end_ns - ph.start_ns)
"""

from __future__ import annotations

from typing import Any

from otel_train.common.attributes import KIND_MONITOR

_INT = {int}  # flat_events: the one type an end time has


class PhaseEntry:
    """Base of every ``Phase``: an entry that opens a phase, told apart from an end time.

    The recorder's ``Phase`` derives from the C or the pure-Python core, whichever runs;
    this common base lets the readers here recognize a phase without knowing which.
    """

    __slots__ = ()
    name: str
    kind: str
    loader: str | None


class DecodedPhase:
    """One phase decoded from a step's event list (see :func:`decode_events`)."""

    __slots__ = ("ordinal", "phase", "start_ns", "end_ns", "parent", "error", "start_pos",
                 "end_pos")

    def __init__(self, ordinal: int, phase: PhaseEntry, start_ns: int, end_ns: int, parent: int,
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
        if isinstance(a, PhaseEntry):
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


def flat_events(ev: list[Any]) -> tuple[list[PhaseEntry], list[int], list[int]] | None:
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


def active_ordinal(ev: list[Any]) -> tuple[int, int]:
    """(ordinal of the innermost open phase or -1, number of phases started)."""
    stack: list[int] = []
    count = 0
    n = len(ev) - (len(ev) & 1)
    for i in range(0, n, 2):
        if isinstance(ev[i], PhaseEntry):
            stack.append(count)
            count += 1
        elif stack:
            stack.pop()
    return (stack[-1] if stack else -1), count



def open_monitoring(recorder: Any) -> tuple[int, str, int] | None:
    """(step index, name, start ns) of the outermost monitoring operation ``recorder`` runs
    now: a monitoring phase of its current step, or a ``run.monitor`` between steps."""
    record = recorder.open_record
    if record is not None and not record.end_ns:
        return record.after_step, record.name, record.start_ns
    step = recorder.current
    if step is None or step.end_ns:
        return None
    for ph in decode_events(list(step.ev)):
        if not ph.end_ns and ph.phase.kind == KIND_MONITOR:
            return step.index, ph.phase.name, ph.start_ns
    return None


def in_progress(recorder: Any) -> tuple[int, int, str | None, int] | None:
    """(step index, step start ns, active phase name, phase start ns) of ``recorder``'s step
    in progress, or None."""
    step = recorder.current
    if step is None or step.end_ns:
        return None
    phases = decode_events(list(step.ev))
    for ph in reversed(phases):
        if not ph.end_ns:
            return step.index, step.start_ns, ph.phase.name, ph.start_ns
    return step.index, step.start_ns, None, step.start_ns
