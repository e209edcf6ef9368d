"""The step ring: finished flat steps, written by the hot path into shared memory.

A single-producer, single-consumer byte ring of length-prefixed records in memory that can
be shared with another process (a ``memfd`` mapped ``MAP_SHARED``, or an unlinked temporary
file where there is no ``memfd_create``; another process maps it from an inherited
descriptor, ``StepRing.open``). The training thread is the one producer: at a step's end it writes the step's
record (index, start, end, loader, each phase's id with its start and end, the root's
attribute values that are numbers, booleans or short strings) and moves ``head``; the one
consumer reads records up to ``head`` and moves ``tail``. Phase names, kinds, loaders and
attribute keys are interned: a string or a phase is sent once, in a definition record ahead
of the first step that uses it, and steps carry their ids.

Layout (little-endian; ``HEADER_BYTES`` of header, then ``capacity`` bytes of data)::

    0   u32 magic 'OTRR'   4  u32 version   8  u64 capacity (data bytes, a multiple of 8)
    64  u64 head: bytes ever written (producer only; its own cache line)
    128 u64 tail: bytes ever read    (consumer only; its own cache line)
    136 u64 read: bytes a reader in another process has read ahead of tail (consumer only)
    192 u64 steps dropped, full      200 u64 spans dropped, full   208 u64 steps written
    216 u64 1 once the run times collectives (a reader elsewhere waits for their entries)

A record starts at an 8-byte boundary with ``u32 length (a multiple of 8), u16 type,
u16 count``; a record never wraps: where it does not fit before the end of the data, a
``PAD`` record fills the rest and it starts at offset 0. Types: ``QUEUED`` (u64 ordinal: a
record the recorder's queue holds comes here, in order; the n-th marker since the ring was
attached, 0 first, holds the n-th record queued), ``STRING`` (u32 id, u16 length,
utf-8), ``PHASE`` (u32 id, i32 name, i32 kind, i32 loader string ids; -1: none), ``STEP``
(count phases; i64 index, i64 start_ns, i64 end_ns, i32 loader string id, u32 attribute
count; per phase u32 id, 4 pad, i64 start, i64 end; per attribute i32 key id, u16 type,
u16 length, then 8 bytes of value or the string's bytes padded to 8).

A full ring drops the newest step, counted (``steps dropped``, and the recorder's
``DropCounter`` under ``step_ring_full``): the producer never touches ``tail``, so dropping
the oldest would mean writing what the reader owns. The producer writes a record's bytes,
then publishes ``head``: in C with a release store; in Python with a plain store after the
record's, which x86 keeps in that order, as it keeps the Python reader's load of ``head``
before its loads of the record. In one process the GIL orders both sides; a reader in
another process on a weaker memory model (ARM) needs an acquire load of ``head``, which the
C reader (``_recorder_c_ringread.c``) gives.

Usage::

    ring = StepRing.create(capacity_bytes=1 << 20)
    attach_ring(recorder, ring)               # the hot path writes into it from now on
    reader = StepRingReader(StepRing.open(ring.fd))  # step_ring_reader.py: another process,
    for step in reader.read(): ...                   # or this one; RingSteps, read like Steps
"""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
from typing import Any

from otel_train.recording.step_events import PhaseEntry

__all__ = ["HEADER_BYTES", "QUEUED", "StepRing", "StepRingWriter", "attach_ring",
           "detach_ring", "ring_capacity_bytes"]

MAGIC = 0x5252544F  # 'OTRR'
VERSION = 1
HEADER_BYTES = 256
OFF_CAPACITY = 8
OFF_HEAD = 64
OFF_TAIL = 128
OFF_READ = 136
OFF_DROPPED_STEPS = 192
OFF_DROPPED_SPANS = 200
OFF_WRITTEN_STEPS = 208
OFF_COLLECTIVES = 216
REC_PAD, REC_STRING, REC_PHASE, REC_STEP, REC_QUEUED = 0, 1, 2, 3, 4
#: What the reader returns in the place of a record the recorder's queue holds (a step the
#: ring cannot carry, a ``run.monitor`` record): the next one in that queue, in this order.
QUEUED = "queued"
ATTR_BOOL, ATTR_INT, ATTR_FLOAT, ATTR_STR = 0, 1, 2, 3
#: The longest string attribute value the ring carries (utf-8 bytes); longer go the queue.
MAX_STRING_BYTES = 256
REC_HEAD = struct.Struct("<IHH")
STRING_BODY = struct.Struct("<IH2x")
PHASE_BODY = struct.Struct("<Iiii")
STEP_BODY = struct.Struct("<qqqiI")
STEP_PHASE_BODY = struct.Struct("<I4xqq")
ATTR_HEAD = struct.Struct("<iHH")
U64 = struct.Struct("<Q")
I64 = struct.Struct("<q")
F64 = struct.Struct("<d")
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_FULL: Any = []  # _attributes: the ring had no room for a key's definition
# The rare fields of a step that the ring does not carry: a step with any of them set goes
# the queue (records/step_records.py builds it as before).
_RARE_FIELDS = ("phase_attrs", "dev", "span_ids", "trace_id", "queued_waits", "stall_events",
                "governing_events")


def ring_capacity_bytes(max_queued_steps: int) -> int:
    """The ring's data bytes for a run queuing ``max_queued_steps``: 256 bytes a step (a
    7-phase step's record is 208), 64 KiB at least."""
    return max(64 * 1024, (max_queued_steps * 256 + 7) // 8 * 8)


class StepRing:
    """The ring's memory: a descriptor and its ``MAP_SHARED`` mapping."""

    def __init__(self, fd: int, size: int, owner: bool) -> None:
        self.fd = fd
        self.owner = owner
        self.map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.buffer = memoryview(self.map)
        self.capacity = U64.unpack_from(self.buffer, OFF_CAPACITY)[0]
        if I64.unpack_from(self.buffer, 0)[0] & 0xFFFFFFFF != MAGIC or self.capacity + \
                HEADER_BYTES > size:
            self.close()
            raise ValueError("step ring: not a step ring (magic or size)")

    @classmethod
    def create(cls, capacity_bytes: int) -> StepRing:
        """A new, empty ring of ``capacity_bytes`` (rounded up to 8) in shared memory."""
        if capacity_bytes < 4096:
            raise ValueError(f"step ring: capacity_bytes must be >= 4096, got {capacity_bytes}")
        capacity = (capacity_bytes + 7) // 8 * 8
        size = HEADER_BYTES + capacity
        memfd = getattr(os, "memfd_create", None)
        if memfd is not None:
            fd = memfd("otel-train-step-ring", getattr(os, "MFD_CLOEXEC", 0))
        else:  # no memfd: an unlinked file, shared by its descriptor alike
            fd = os.dup(tempfile.TemporaryFile(prefix="otel-train-ring-").fileno())
        os.ftruncate(fd, size)
        header = bytearray(HEADER_BYTES)
        struct.pack_into("<IIQ", header, 0, MAGIC, VERSION, capacity)
        os.pwrite(fd, bytes(header), 0)
        return cls(fd, size, owner=True)

    @classmethod
    def open(cls, fd: int) -> StepRing:
        """The ring behind ``fd`` (inherited from the process that made it)."""
        return cls(fd, os.fstat(fd).st_size, owner=False)

    def counters(self) -> dict[str, int]:
        """head, tail, steps dropped and written, spans dropped: a snapshot."""
        buf = self.buffer
        return {"head": U64.unpack_from(buf, OFF_HEAD)[0],
                "tail": U64.unpack_from(buf, OFF_TAIL)[0],
                "dropped_steps": U64.unpack_from(buf, OFF_DROPPED_STEPS)[0],
                "dropped_spans": U64.unpack_from(buf, OFF_DROPPED_SPANS)[0],
                "written_steps": U64.unpack_from(buf, OFF_WRITTEN_STEPS)[0]}

    def close(self) -> None:
        """Unmap and close the descriptor (the memory lives while another holds it)."""
        try:
            self.buffer.release()
            self.map.close()
        except (BufferError, ValueError):
            pass  # a view still exported (the C writer holds one): freed with it
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1


def ring_attribute(value: Any) -> tuple[int, bytes] | None:
    """(type, encoded value) of an attribute value the ring carries, None for any other."""
    t = type(value)
    if t is bool:
        return ATTR_BOOL, I64.pack(1 if value else 0)
    if t is int:
        return (ATTR_INT, I64.pack(value)) if _I64_MIN <= value <= _I64_MAX else None
    if t is float:
        return ATTR_FLOAT, F64.pack(value)
    if t is str:
        raw = value.encode("utf-8", "surrogatepass")
        return (ATTR_STR, raw) if len(raw) <= MAX_STRING_BYTES else None
    return None


class StepRingWriter:
    """The producer: the hot path's twin of the C writer (``_recorder_c_ring.c``)."""

    def __init__(self, ring: StepRing, recorder: Any) -> None:
        self.ring = ring
        self.recorder = recorder  # its queue takes what the ring cannot carry
        self.drops = recorder.drops
        self._buf = ring.buffer
        self._cap = ring.capacity
        self.phase_ids: dict[Any, int] = {}  # Phase object -> id, once its record is in
        self.string_ids: dict[str, int] = {}
        self.markers = 0  # QUEUED markers written: the next one's ordinal

    # -- the step ----------------------------------------------------------------------
    def write_step(self, record: Any) -> bool:
        """Hand on a finished record: True, always (the caller has nothing left to do).

        A flat step is written into the ring, or dropped and counted when it is full. A
        record the ring cannot carry (not flat, failed, rare fields, attribute values it
        cannot encode, times beyond 64 bits, a ``MonitorRecord``) goes to the recorder's
        queue as before, then a ``QUEUED`` marker holds its place in the ring, so the
        reader takes every record in the order they ended (the queue first: a reader that
        sees the marker finds its record). Never raises: it runs at the end of every step,
        on the training thread."""
        try:
            if self._write_step(record):
                return True
        except Exception:  # e.g. times of another type: the queue takes the step
            pass
        rec = self.recorder
        queue = rec.queue
        if len(queue) >= rec.max_queued:
            rec.drops.add("record_queue_full", record.span_count())
            return True
        queue.append(record)
        try:
            off = self._reserve(16)
        except Exception:
            off = None
        if off is None:
            queue.pop()  # the marker did not fit: nothing reads it, it is dropped
            return self._full(record)
        REC_HEAD.pack_into(self._buf, off, 16, REC_QUEUED, 0)
        U64.pack_into(self._buf, off + 8, self.markers)
        self.markers += 1
        self._publish(16)
        return True

    def _write_step(self, step: Any) -> bool:
        if step.error is not None or getattr(step, "ev", None) is None:
            return False
        for name in _RARE_FIELDS:
            if getattr(step, name, None):
                return False
        ev = step.ev
        n = len(ev)
        if n & 3 or not n:
            return False
        encoded = self._attributes(step.attrs) if step.attrs else []
        if encoded is None:
            return False
        if encoded is _FULL:
            return self._full(step)
        ids = self.phase_ids
        phases = []
        for i in range(0, n, 4):
            phase = ev[i]
            start, end = ev[i + 1], ev[i + 2]
            if ev[i + 3] is not None or type(end) is not int or type(start) is not int \
                    or not isinstance(phase, PhaseEntry) \
                    or not (_I64_MIN <= start <= _I64_MAX and _I64_MIN <= end <= _I64_MAX):
                return False
            pid = ids.get(phase)
            if pid is None:
                pid = self._phase_id(phase)
                if pid is None:
                    return self._full(step)
            phases.append((pid, start, end))
        index, start_ns, end_ns = step.index, step.start_ns, step.end_ns
        if not all(type(v) is int and _I64_MIN <= v <= _I64_MAX
                   for v in (index, start_ns, end_ns)):
            return False
        loader = -1
        if step.loader is not None:
            sid = self._string_id(step.loader)
            if sid is None:
                return self._full(step)
            loader = sid
        return self._pack(step, (index, start_ns, end_ns, loader), phases, encoded)

    def _pack(self, step: Any, fields: tuple[int, int, int, int],
              phases: list[tuple[int, int, int]], encoded: list[tuple[int, int, bytes]]
              ) -> bool:
        """The step's record into the ring (its definitions are in), or counted dropped."""
        size = 8 + STEP_BODY.size + STEP_PHASE_BODY.size * len(phases)
        for _, _, raw in encoded:
            size += ATTR_HEAD.size + (len(raw) + 7) // 8 * 8
        off = self._reserve(size)
        if off is None:
            return self._full(step)
        buf = self._buf
        REC_HEAD.pack_into(buf, off, size, REC_STEP, len(phases))
        STEP_BODY.pack_into(buf, off + 8, *fields, len(encoded))
        pos = off + 8 + STEP_BODY.size
        for pid, start, end in phases:
            STEP_PHASE_BODY.pack_into(buf, pos, pid, start, end)
            pos += STEP_PHASE_BODY.size
        for kid, kind, raw in encoded:
            ATTR_HEAD.pack_into(buf, pos, kid, kind, len(raw))
            pos += ATTR_HEAD.size
            buf[pos:pos + len(raw)] = raw
            pos += (len(raw) + 7) // 8 * 8
        self._publish(size)
        _add(buf, OFF_WRITTEN_STEPS, 1)
        return True

    def _attributes(self, attrs: dict[str, Any]) -> list[tuple[int, int, bytes]] | None:
        """(key id, type, value) of each root attribute; None when one cannot go in the
        ring, ``_FULL`` when a new key's definition did not fit."""
        encoded = []
        for key, value in attrs.items():
            enc = ring_attribute(value)
            if enc is None or type(key) is not str:
                return None
            kid = self._string_id(key)
            if kid is None:
                return _FULL
            encoded.append((kid, enc[0], enc[1]))
        return encoded

    def _full(self, step: Any) -> bool:
        """The ring is full: drop this, the newest step, and count it."""
        spans = step.span_count()
        _add(self._buf, OFF_DROPPED_STEPS, 1)
        _add(self._buf, OFF_DROPPED_SPANS, spans)
        self.drops.add("step_ring_full", spans)
        return True

    # -- definitions -------------------------------------------------------------------
    def _string_id(self, text: str) -> int | None:
        sid = self.string_ids.get(text)
        if sid is not None:
            return sid
        raw = text.encode("utf-8", "surrogatepass")[:0xFFFF]
        sid = len(self.string_ids)
        size = 8 + STRING_BODY.size + (len(raw) + 7) // 8 * 8
        off = self._reserve(size)
        if off is None:
            return None
        REC_HEAD.pack_into(self._buf, off, size, REC_STRING, 0)
        STRING_BODY.pack_into(self._buf, off + 8, sid, len(raw))
        self._buf[off + 8 + STRING_BODY.size:off + 8 + STRING_BODY.size + len(raw)] = raw
        self._publish(size)
        self.string_ids[text] = sid
        return sid

    def _phase_id(self, phase: Any) -> int | None:
        name = self._string_id(phase.name)
        kind = self._string_id(phase.kind)
        loader = -1 if phase.loader is None else self._string_id(phase.loader)
        if name is None or kind is None or loader is None:
            return None
        pid = len(self.phase_ids)
        off = self._reserve(8 + PHASE_BODY.size)
        if off is None:
            return None
        REC_HEAD.pack_into(self._buf, off, 8 + PHASE_BODY.size, REC_PHASE, 0)
        PHASE_BODY.pack_into(self._buf, off + 8, pid, name, kind, loader)
        self._publish(8 + PHASE_BODY.size)
        self.phase_ids[phase] = pid
        return pid

    # -- space -------------------------------------------------------------------------
    def _reserve(self, size: int) -> int | None:
        """The data offset where a record of ``size`` bytes goes (a PAD written first where
        it would cross the end), or None when the ring has no room for it."""
        buf, cap = self._buf, self._cap
        head = U64.unpack_from(buf, OFF_HEAD)[0]
        tail = U64.unpack_from(buf, OFF_TAIL)[0]
        at = head % cap
        room_to_end = cap - at
        skip = room_to_end if room_to_end < size else 0
        if cap - (head - tail) < size + skip:
            return None
        if skip:
            if skip >= 8:
                REC_HEAD.pack_into(buf, HEADER_BYTES + at, skip, REC_PAD, 0)
            U64.pack_into(buf, OFF_HEAD, head + skip)  # the PAD is published on its own
            at = 0
        return HEADER_BYTES + at

    def _publish(self, size: int) -> None:
        # The record's bytes are in memory before head moves (one thread, stores in order;
        # the C writer uses a release store).
        head = U64.unpack_from(self._buf, OFF_HEAD)[0]
        U64.pack_into(self._buf, OFF_HEAD, head + size)


def attach_ring(recorder: Any, ring: StepRing, writer: StepRingWriter | None = None) -> Any:
    """Send ``recorder``'s finished records through ``ring`` from now on: the C writer where
    the accelerator was built (its Python twin ``writer``, made here unless given, takes the
    rare cases), else the Python one. Returns the writer, now ``recorder.ring``."""
    from otel_train.recording.recorder import _recorder_c  # recorder.py imports this module

    writer = writer if writer is not None else StepRingWriter(ring, recorder)
    if _recorder_c is not None:
        recorder.ring = _recorder_c.RingWriterCore(ring.buffer, ring.capacity, writer.phase_ids,
                                                   writer.string_ids, writer.write_step)
    else:
        recorder.ring = writer
    return recorder.ring


def detach_ring(recorder: Any) -> None:
    """``recorder`` queues every record from now on; the C writer lets go of the memory."""
    writer, recorder.ring = recorder.ring, None
    release = getattr(writer, "release", None)
    if release is not None:
        release()


def _add(buf: memoryview, offset: int, n: int) -> None:
    U64.pack_into(buf, offset, U64.unpack_from(buf, offset)[0] + n)
