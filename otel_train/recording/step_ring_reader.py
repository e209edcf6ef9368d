"""The step ring read back: ``StepRingReader`` turns its records into ``RingStep`` objects.

The consumer side of ``step_ring.py`` (whose docstring holds the layout): it reads records
from ``tail`` up to ``head`` (the C writer publishes ``head`` with a release store; the C
reader, ``_recorder_c_ringread.c``, used where the accelerator was built, loads it with
acquire; the Python read loop, its twin, relies on x86 keeping loads in order), keeps the strings and phases each definition record sends, and moves ``tail`` past each
record it has read, which frees its room for the writer. A ``RingStep`` has the fields the
record builder (``records/step_records.py``) reads of a ``Step``, so a step from the ring is
built by the same code as one from the queue. The C reader makes its C twin
(``_recorder_c.RingStep``: the same fields, read only, its phases kept in C and its event
list made only when read), whose record ``flat_step_records`` builds from those C fields.

Usage::

    reader = StepRingReader(StepRing.open(fd))
    for item in reader.read():   # RingStep, or QUEUED where the queue holds the record
        ...
"""

from __future__ import annotations

from typing import Any

from otel_train.recording.recorder import _recorder_c
from otel_train.recording.step_events import PhaseEntry
from otel_train.recording.step_ring import (
    ATTR_BOOL,
    ATTR_FLOAT,
    ATTR_HEAD,
    ATTR_STR,
    F64,
    HEADER_BYTES,
    I64,
    OFF_COLLECTIVES,
    OFF_HEAD,
    OFF_READ,
    OFF_TAIL,
    PHASE_BODY,
    QUEUED,
    REC_HEAD,
    REC_PHASE,
    REC_QUEUED,
    REC_STEP,
    REC_STRING,
    STEP_BODY,
    STEP_PHASE_BODY,
    STRING_BODY,
    U64,
    StepRing,
)

__all__ = ["RING_READER", "RingPhase", "RingStep", "StepRingReader", "unread_step_spans"]

# The C reader where the accelerator was built and OTEL_TRAIN_PURE_PYTHON is not set (the
# recorder's choice, made once in recorder.py), else the Python read loop below.
_C_READ_ITEMS: Any = getattr(_recorder_c, "ring_read_items", None)
#: Which reader reads the ring's records in this process.
RING_READER = ("C accelerator (otel_train.recording._recorder_c.ring_read_items)"
               if _C_READ_ITEMS is not None else "pure Python")


class RingPhase(PhaseEntry):
    """A phase read back from the ring: name, kind and loader, as a ``Phase`` has them."""

    __slots__ = ("name", "kind", "loader")

    def __init__(self, name: str, kind: str, loader: str | None) -> None:
        self.name = name
        self.kind = kind
        self.loader = loader

    def __repr__(self) -> str:
        return f"RingPhase({self.name!r}, {self.kind!r}, {self.loader!r})"


class RingStep:
    """A finished flat step read back from the ring, with the fields the record builder
    (``records/step_records.py``) reads of a ``Step``; the rare ones are never set. The
    Python reader's; the C reader makes ``_recorder_c.RingStep``, its twin."""

    __slots__ = ("index", "loader", "start_ns", "end_ns", "ev", "attrs")
    error = None
    phase_attrs = None
    dev = None
    span_ids = None
    trace_id = 0
    queued_waits = None
    batch = None

    def __init__(self, index: int, loader: str | None, start_ns: int, end_ns: int,
                 ev: list[Any], attrs: dict[str, Any] | None) -> None:
        self.index = index
        self.loader = loader
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.ev = ev
        self.attrs = attrs

    def span_count(self) -> int:
        """Spans this step will produce (root + phases)."""
        return 1 + len(self.ev) // 4

    def __repr__(self) -> str:
        return f"<RingStep {self.index}>"


class StepRingReader:
    """The consumer: reads records up to ``head``; one reader at a time.

    By default each record's room is freed as it is read (``tail`` moves past it). With
    ``move_tail=False`` (the exporter process) the reader reads ahead from ``tail`` and
    publishes how far at ``read``, and ``tail`` moves only when ``release`` says so: once
    what was read is settled, so that a reader taking over after this one dies reads the
    rest again from ``tail``."""

    def __init__(self, ring: StepRing, move_tail: bool = True) -> None:
        self.ring = ring
        self._buf = ring.buffer
        self._cap = ring.capacity
        self.move_tail = move_tail
        self.position = U64.unpack_from(self._buf, OFF_TAIL)[0]  # the next record's byte
        self.strings: dict[int, str] = {}
        self.phases: dict[int, RingPhase] = {}

    def know(self, string_ids: dict[str, int], phase_ids: dict[Any, int]) -> None:
        """The definitions the writer sent so far (its own dicts): a reader that starts at a
        ``tail`` past them (a take-over) knows every id the steps after it carry."""
        for text, sid in list(string_ids.items()):
            self.strings.setdefault(sid, text)
        for phase, pid in list(phase_ids.items()):
            if pid not in self.phases:
                self.phases[pid] = RingPhase(phase.name, phase.kind, phase.loader)

    def waiting_bytes(self) -> int:
        """Bytes written and not yet read."""
        return U64.unpack_from(self._buf, OFF_HEAD)[0] - self.position

    def collectives_timed(self) -> bool:
        """The run times collectives (from the first step written after it said so)."""
        return bool(U64.unpack_from(self._buf, OFF_COLLECTIVES)[0])

    def head(self) -> int:
        """Bytes ever written (the producer's ``head``)."""
        return U64.unpack_from(self._buf, OFF_HEAD)[0]

    def read(self, max_steps: int | None = None) -> list[RingStep | str]:
        """The steps written since the last read (at most ``max_steps``), in order, with
        ``QUEUED`` in the place of each record the recorder's queue holds."""
        return [item for item, _, _ in self.read_items(max_steps)]

    def read_items(self, max_items: int | None = None
                   ) -> list[tuple[RingStep | str, int, int]]:
        """(step or ``QUEUED``, the byte position after its record, the marker's ordinal or
        -1) of each record written since the last read, at most ``max_items``: read in C
        where the accelerator was built (``_recorder_c_ringread.c``), else in Python."""
        read = _C_READ_ITEMS
        if read is None:
            return self._read_items_python(max_items)
        out, self.position = read(self._buf, self._cap, self.position, max_items,
                                  self.move_tail, self.strings, self.phases, RingPhase,
                                  QUEUED)
        if not self.move_tail:
            U64.pack_into(self._buf, OFF_READ, self.position)
        return out

    def _read_items_python(self, max_items: int | None = None
                           ) -> list[tuple[RingStep | str, int, int]]:
        """``read_items`` in Python: the C reader's twin."""
        buf, cap = self._buf, self._cap
        head = U64.unpack_from(buf, OFF_HEAD)[0]
        tail = self.position
        move_tail = self.move_tail
        out: list[tuple[RingStep | str, int, int]] = []
        while tail < head and (max_items is None or len(out) < max_items):
            at = tail % cap
            if cap - at < 8:  # too little room for a PAD: the writer skipped it
                tail += cap - at
                continue
            size, kind, count = REC_HEAD.unpack_from(buf, HEADER_BYTES + at)
            if size < 8 or size > cap - at:
                raise ValueError(f"step ring: corrupt record of {size} bytes at {tail}")
            pos = HEADER_BYTES + at + 8
            end = tail + size
            if kind == REC_STEP:
                out.append((self._step(buf, pos, count), end, -1))
            elif kind == REC_STRING:
                sid, length = STRING_BODY.unpack_from(buf, pos)
                start = pos + STRING_BODY.size
                self.strings[sid] = bytes(buf[start:start + length]).decode(
                    "utf-8", "surrogatepass")
            elif kind == REC_QUEUED:
                ordinal = U64.unpack_from(buf, pos)[0] if size >= 16 else -1
                out.append((QUEUED, end, ordinal))  # type: ignore[arg-type]
            elif kind == REC_PHASE:
                pid, name, kind_id, loader = PHASE_BODY.unpack_from(buf, pos)
                strings = self.strings
                self.phases[pid] = RingPhase(strings[name], strings[kind_id],
                                             strings[loader] if loader >= 0 else None)
            tail = end
            if move_tail:
                U64.pack_into(buf, OFF_TAIL, tail)  # the record is read: its room is free
        self.position = tail
        if not move_tail:
            U64.pack_into(buf, OFF_READ, tail)
        return out

    def release(self, position: int) -> None:
        """Free the room of every record before ``position`` (``move_tail=False``: what was
        read there is settled)."""
        if position > U64.unpack_from(self._buf, OFF_TAIL)[0]:
            U64.pack_into(self._buf, OFF_TAIL, min(position, self.position))

    def _step(self, buf: memoryview, pos: int, count: int) -> RingStep:
        index, start_ns, end_ns, loader, n_attrs = STEP_BODY.unpack_from(buf, pos)
        pos += STEP_BODY.size
        phases = self.phases
        ev: list[Any] = []
        for _ in range(count):
            pid, start, end = STEP_PHASE_BODY.unpack_from(buf, pos)
            pos += STEP_PHASE_BODY.size
            ev += (phases[pid], start, end, None)
        attrs: dict[str, Any] | None = None
        if n_attrs:
            attrs = {}
            strings = self.strings
            for _ in range(n_attrs):
                kid, kind, length = ATTR_HEAD.unpack_from(buf, pos)
                pos += ATTR_HEAD.size
                if kind == ATTR_STR:
                    value: Any = bytes(buf[pos:pos + length]).decode("utf-8", "surrogatepass")
                    pos += (length + 7) // 8 * 8
                else:
                    value = (F64.unpack_from(buf, pos)[0] if kind == ATTR_FLOAT
                             else I64.unpack_from(buf, pos)[0])
                    if kind == ATTR_BOOL:
                        value = bool(value)
                    pos += 8
                attrs[strings[kid]] = value
        return RingStep(index, self.strings[loader] if loader >= 0 else None, start_ns,
                        end_ns, ev, attrs)


def unread_step_spans(ring: StepRing, start: int | None = None) -> int:
    """Spans of the steps between ``tail`` (or the byte position ``start``) and ``head``:
    what no reader settled, counted when a run ends before they are read; markers hold no
    span of their own (their records travel apart)."""
    buf, cap = ring.buffer, ring.capacity
    head = U64.unpack_from(buf, OFF_HEAD)[0]
    tail = U64.unpack_from(buf, OFF_TAIL)[0] if start is None else start
    spans = 0
    while tail < head:
        at = tail % cap
        if cap - at < 8:
            tail += cap - at
            continue
        size, kind, count = REC_HEAD.unpack_from(buf, HEADER_BYTES + at)
        if size < 8 or size > cap - at:
            break
        if kind == REC_STEP:
            spans += 1 + count
        tail += size
    return spans
