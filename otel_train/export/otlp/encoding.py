"""OTLP span encoding written straight to protobuf wire format, ~7x cheaper than the SDK's.

The SDK's ``encode_spans`` builds one protobuf message object per attribute, value, span and
event: about 60 µs of GIL-holding CPU per span here, 0.45 ms per 7-span training step
(``benchmarks/bench_hot_path.py``). On a CPU-bound loop that background CPU is paid by
training. Our spans repeat the same attributes on every span (run id, rank, phase, kind,
loader...), so this encoder writes the wire bytes directly and caches each encoded key/value
pair; only values that change (the step index, a loss) are encoded per span. The bytes parse
into exactly the message ``encode_spans`` builds (``tests/test_otlp_encoding.py`` checks it
field by field on our spans and on ordinary SDK spans).

``FastGrpcSpanExporter`` and ``FastHttpSpanExporter`` are the SDK's OTLP exporters with only
the encoding step replaced; they fall back to the SDK's encoder if ours ever fails.

Spans otel-train builds itself (plain ``ReadableSpan``s with dict attributes) take a fast path
that reads their fields directly and encodes what repeats once: the step's trace id, span
names, the shared UNSET status, and the run's constant attributes, which head every span's
attributes as a :class:`RunConstantAttributes` dict and go out as one cached block.

Usage::

    data = encode_spans_fast(spans)              # bytes of an ExportTraceServiceRequest
"""

from __future__ import annotations

import functools
import logging
import struct
from collections.abc import Mapping, Sequence
from itertools import islice
from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from otel_train.common import attributes as A
from otel_train.records import span_rows as _rows
from otel_train.records.span_rows import RunConstantAttributes

_log = logging.getLogger("otel_train")
_pack_q = struct.Struct("<Q").pack
_pack_d = struct.Struct("<d").pack
_pack_i = struct.Struct("<I").pack
# A usual span's fixed fields in one call each: the span and parent ids (tag, 8 bytes big
# endian, as the SDK writes ids) and the start and end times (tag, fixed64 little endian).
_pack_id = struct.Struct(">2sQ").pack
_pack_ids = struct.Struct(">2sQ2sQ").pack
_pack_times = struct.Struct("<cQcQ").pack
_SPAN_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3,
              SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
_FLAGS_HAS_IS_REMOTE = 0x100
_FLAGS_IS_REMOTE = 0x200
_MAX_CACHED = 8192
# Floats are not cached: they are the values that change (a loss, a duration), and -0.0 == 0.0
# would share an entry while their bytes differ.
_SCALARS = frozenset((str, bool, int, bytes))
_INTERNAL = SpanKind.INTERNAL
_INTERNAL_VALUE = _INTERNAL.value  # a row's kind (span_rows.INTERNAL_KIND)
# otel-train's phase attributes, in the order rows_from_record sets them.
_ATTR_STEP, _ATTR_PHASE, _ATTR_KIND = A.STEP, A.PHASE, A.PHASE_KIND
_ATTR_LOADER, _ATTR_DEVICE = A.DATALOADER, A.DEVICE_DURATION
_PHASE_KEYS = frozenset((_ATTR_STEP, _ATTR_PHASE, _ATTR_KIND, _ATTR_LOADER, _ATTR_DEVICE))
_ATTR_SLOW = A.SLOW
_ROOT_KEYS = (_ATTR_STEP, _ATTR_SLOW)  # a step root's attributes, without and with a loader
_ROOT_KEYS_LOADER = (_ATTR_STEP, _ATTR_LOADER, _ATTR_SLOW)
# SpanContext is a tuple (trace_id, span_id, is_remote, trace_flags, trace_state, is_valid);
# the fast path unpacks it directly, and only if this SDK still lays it out so.
_CTX_LAYOUT_OK = tuple(SpanContext(7, 9, True, trace_state=TraceState([("k", "v")])))[:3] == (
    7, 9, True)


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _SMALL[n] if n >= 0 else _varint(n & 0xFFFFFFFFFFFFFFFF)
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL = [bytes((i,)) for i in range(0x80)]
_BYTES_ONLY = {bytes}


def _ld(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field."""
    return tag + _varint(len(payload)) + payload


# ScopeSpans.spans field heads (tag and length) for the usual span sizes, so a record's
# spans are framed as they are joined (the export thread then joins a batch as it is).
_SPAN_FIELD_HEADS = [b"\x12" + _varint(n) for n in range(4096)]


def _span_field_head(n: int) -> bytes:
    """The ScopeSpans.spans field's tag and length for an ``n``-byte Span message."""
    return _SPAN_FIELD_HEADS[n] if n < 4096 else b"\x12" + _varint(n)


def _span_field(span: bytes) -> bytes:
    """A Span message as a ScopeSpans.spans field."""
    return _span_field_head(len(span)) + span


def _any_value(value: Any) -> bytes:
    """An AnyValue message's bytes (the SDK's ``_encode_value`` rules)."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, str):
        return _ld(b"\x0a", value.encode("utf-8"))
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _pack_d(value)
    if isinstance(value, bytes):
        return _ld(b"\x3a", value)
    if isinstance(value, Sequence):
        return _ld(b"\x2a", b"".join(_ld(b"\x0a", _any_value(v)) for v in value))
    if isinstance(value, Mapping):
        return _ld(b"\x32", b"".join(_ld(b"\x0a", _key_value(str(k), v))
                                     for k, v in value.items()))
    raise TypeError(f"Invalid type {type(value)} of value {value}")


def _key_value(key: str, value: Any) -> bytes:
    return _ld(b"\x0a", key.encode("utf-8")) + _ld(b"\x12", _any_value(value))


class _Encoder:
    """Holds the caches; one per exporter (encoding happens on its export thread)."""

    def __init__(self) -> None:
        self._kv: dict[tuple[bytes, str, type, Any], bytes] = {}
        self._names: dict[str, bytes] = {}
        self._blocks: dict[type, bytes] = {}
        self._resources: dict[int, tuple[Any, bytes]] = {}
        self._scopes: dict[int, tuple[Any, bytes]] = {}
        self._trace: tuple[int, bytes] = (-1, b"")
        self._status: tuple[Any, bytes] = (None, b"")
        # (name and kind fields, attribute fields, their length in all)
        self._phase_heads: dict[tuple[Any, ...], tuple[bytes, bytes, int]] = {}
        self._root_heads: dict[tuple[Any, ...], tuple[bytes, bytes, int]] = {}
        self._record_constants: tuple[Any, ...] | None = None  # (mapping, items, keys, block)

    def attributes(self, tag: bytes, attrs: Mapping[str, Any] | None) -> list[bytes]:
        if not attrs:
            return []
        return self._items(tag, attrs.items())

    def _items(self, tag: bytes, items: Any) -> list[bytes]:
        cache = self._kv
        out = []
        for key, value in items:
            t = type(value)
            if t in _SCALARS:
                ck = (tag, key, t, value)
                kv = cache.get(ck)
                if kv is None:
                    kv = _ld(tag, _key_value(key, value))
                    if len(cache) >= _MAX_CACHED:
                        cache.clear()
                    cache[ck] = kv
            else:
                try:
                    kv = _ld(tag, _key_value(key, value))
                except Exception as exc:  # the SDK logs and skips such an attribute too
                    _log.debug("otel-train: cannot encode attribute %s: %r", key, exc)
                    continue
            out.append(kv)
        return out

    def resource(self, resource: Any) -> bytes:
        hit = self._resources.get(id(resource))
        if hit is not None and hit[0] is resource:
            return hit[1]
        data = b"".join(self.attributes(b"\x0a", resource.attributes))
        self._resources[id(resource)] = (resource, data)
        return data

    def scope(self, scope: Any) -> bytes:
        hit = self._scopes.get(id(scope))
        if hit is not None and hit[0] is scope:
            return hit[1]
        parts = []
        if scope is not None:
            if scope.name:
                parts.append(_ld(b"\x0a", scope.name.encode("utf-8")))
            if scope.version:
                parts.append(_ld(b"\x12", scope.version.encode("utf-8")))
            parts.extend(self.attributes(b"\x1a", scope.attributes))
        data = b"".join(parts)
        self._scopes[id(scope)] = (scope, data)
        return data

    def span(self, span: ReadableSpan) -> bytes:
        """One Span message's bytes."""
        if (_CTX_LAYOUT_OK and type(span) is ReadableSpan
                and isinstance(span._attributes, dict) and type(span._context) is SpanContext):
            return self._plain_span(span)
        return self._any_span(span)

    def _plain_span(self, span: ReadableSpan) -> bytes:
        """Spans as otel-train builds them (plain dicts and tuples): private fields read
        directly (the public properties copy attributes, events and links), repeated parts
        (trace id, name, status) cached."""
        trace_id, span_id, _, _, state, _ = span._context
        parts = [self._trace_id(trace_id), b"\x12\x08" + span_id.to_bytes(8, "big")]
        if state:
            parts.append(_ld(b"\x1a", ",".join(f"{k}={v}" for k, v in state.items())
                             .encode("utf-8")))
        parent = span._parent
        if parent is not None:
            parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
        name = span._name
        if name:
            parts.append(self._name(name))
        kind = span._kind
        parts.append(b"\x30\x01" if kind is _INTERNAL else b"\x30" + _SMALL[_SPAN_KIND[kind]])
        if span._start_time:
            parts.append(b"\x39" + _pack_q(span._start_time))
        if span._end_time:
            parts.append(b"\x41" + _pack_q(span._end_time))
        attrs = span._attributes
        cls = type(attrs)
        if cls is dict or not issubclass(cls, RunConstantAttributes):
            parts.extend(self.attributes(b"\x4a", attrs))
        else:  # the run's constants as one block, then the span's own attributes
            block = self._blocks.get(cls)
            if block is None:
                block = b"".join(self._items(b"\x4a", cls.constants))
                if len(self._blocks) >= 64:
                    self._blocks.clear()
                self._blocks[cls] = block
            parts.append(block)
            parts.extend(self._items(b"\x4a", islice(attrs.items(), len(cls.constants), None)))
        for event in span._events:
            parts.append(self._event(event))
        for link in span._links:
            parts.append(self._link(link))
        status = span._status
        if status is not None:
            last, enc = self._status
            if status is not last:  # healthy spans share one UNSET Status instance
                enc = self._status_bytes(status)
                self._status = (status, enc)
            parts.append(enc)
        parts.append(_FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL)
        return b"".join(parts)

    def _trace_id(self, trace_id: int) -> bytes:
        """The trace id field; a step's spans share one trace, so the last one is kept."""
        last_id, tid = self._trace
        if trace_id != last_id:
            tid = b"\x0a\x10" + trace_id.to_bytes(16, "big")
            self._trace = (trace_id, tid)
        return tid

    def _name(self, name: str) -> bytes:
        """The name field, cached (span names repeat: train.step, forward, ...)."""
        enc = self._names.get(name)
        if enc is None:
            enc = _ld(b"\x2a", name.encode("utf-8"))
            if len(self._names) >= _MAX_CACHED:
                self._names.clear()
            self._names[name] = enc
        return enc

    def _event(self, event: Any) -> bytes:
        ev = []
        if event.timestamp:
            ev.append(b"\x09" + _pack_q(event.timestamp))
        if event.name:
            ev.append(_ld(b"\x12", event.name.encode("utf-8")))
        ev.extend(self.attributes(b"\x1a", event.attributes))
        if event.dropped_attributes:
            ev.append(b"\x20" + _varint(event.dropped_attributes))
        return _ld(b"\x5a", b"".join(ev))

    def _link(self, link: Any) -> bytes:
        lk = [b"\x0a\x10" + link.context.trace_id.to_bytes(16, "big"),
              b"\x12\x08" + link.context.span_id.to_bytes(8, "big")]
        lk.extend(self.attributes(b"\x22", link.attributes))
        if link.dropped_attributes:
            lk.append(b"\x28" + _varint(link.dropped_attributes))
        lk.append(b"\x35" + _pack_i(_flags(link.context)))
        return _ld(b"\x6a", b"".join(lk))

    @staticmethod
    def _status_bytes(status: Any) -> bytes:
        st = []
        if status.description:
            st.append(_ld(b"\x12", status.description.encode("utf-8")))
        if status.status_code.value:
            st.append(b"\x18" + _SMALL[status.status_code.value])
        return _ld(b"\x7a", b"".join(st))

    def _any_span(self, span: ReadableSpan) -> bytes:
        """Any ReadableSpan, through its public properties."""
        ctx = span.context
        parent = span.parent
        # The SDK's dropped_* properties do an ABC isinstance check each; spans built by
        # otel-train hold plain dicts and tuples, which never drop anything.
        plain = type(getattr(span, "_attributes", None)) is dict
        parts = [
            b"\x0a\x10" + ctx.trace_id.to_bytes(16, "big"),
            b"\x12\x08" + ctx.span_id.to_bytes(8, "big"),
        ]
        state = ctx.trace_state
        if state:
            parts.append(_ld(b"\x1a", ",".join(f"{k}={v}" for k, v in state.items())
                             .encode("utf-8")))
        if parent is not None:
            parts.append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
        if span.name:
            parts.append(_ld(b"\x2a", span.name.encode("utf-8")))
        parts.append(b"\x30" + _SMALL[_SPAN_KIND[span.kind]])
        if span.start_time:
            parts.append(b"\x39" + _pack_q(span.start_time))
        if span.end_time:
            parts.append(b"\x41" + _pack_q(span.end_time))
        parts.extend(self.attributes(b"\x4a", span.attributes))
        if not plain and span.dropped_attributes:
            parts.append(b"\x50" + _varint(span.dropped_attributes))
        for event in span.events:
            parts.append(self._event(event))
        if not plain and span.dropped_events:
            parts.append(b"\x60" + _varint(span.dropped_events))
        for link in span.links:
            parts.append(self._link(link))
        if not plain and span.dropped_links:
            parts.append(b"\x70" + _varint(span.dropped_links))
        status = span.status
        if status is not None:
            parts.append(self._status_bytes(status))
        parts.append(_FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL)
        return b"".join(parts)

    def row(self, row: tuple[Any, ...], constants: tuple[tuple[str, Any], ...],
            constant_keys: frozenset[str], block: bytes) -> bytes:
        """One Span message's bytes from a span row (span_rows.py), without the span.

        The same bytes as ``span(RowSpanFactory.span(row))``: the run's constants head an
        otel-train span's attributes as one cached block; a row that sets a constant's key
        gets its own value in the constant's place, as a dict ``update`` would.
        """
        (name, trace_id, span_id, _flags, parent_id, remote, start, end, attrs, status,
         events, kind, scope, links) = row
        parts = [self._trace_id(trace_id), b"\x12\x08" + span_id.to_bytes(8, "big")]
        if parent_id:
            parts.append(b"\x22\x08" + parent_id.to_bytes(8, "big"))
        if name:
            parts.append(self._name(name))
        parts.append(_KIND_BYTES.get(kind, b"\x30\x01"))
        if start:
            parts.append(b"\x39" + _pack_q(start))
        if end:
            parts.append(b"\x41" + _pack_q(end))
        if scope is None:
            if not attrs:
                parts.append(block)
            elif constant_keys.isdisjoint(attrs):
                parts.append(block)
                parts.extend(self._items(b"\x4a", attrs.items()))
            else:  # the row sets a constant's key: its value, in the constant's place
                merged = dict(constants)
                merged.update(attrs)
                parts.extend(self._items(b"\x4a", merged.items()))
        elif attrs:
            parts.extend(self._items(b"\x4a", attrs.items()))
        if events:
            for ev_name, ev_time, ev_attrs in events:
                parts.append(self._event(Event(ev_name, ev_attrs, timestamp=ev_time)))
        if links:
            for l_trace, l_span, l_flags, l_attrs in links:
                parts.append(self._link(Link(SpanContext(l_trace, l_span, True,
                                                         TraceFlags(l_flags)), l_attrs)))
        if status is None:
            parts.append(_UNSET_STATUS)
        else:
            parts.append(self._status_bytes(row_status(status)))
        parts.append(_FLAGS_REMOTE if parent_id and remote else _FLAGS_LOCAL)
        return b"".join(parts)

    def _constants(self, constants: Mapping[str, Any]
                   ) -> tuple[tuple[tuple[str, Any], ...], frozenset[str], bytes]:
        """The run's constants as items, keys and their cached attribute block."""
        consts = tuple(constants.items())
        key = ("rows", consts)
        block = self._blocks.get(key)  # type: ignore[call-overload]
        if block is None:
            block = b"".join(self._items(b"\x4a", consts))
            if len(self._blocks) >= 64:
                self._blocks.clear()
            self._blocks[key] = block  # type: ignore[index]
        return consts, frozenset(constants), block

    def record(self, rec: tuple[Any, ...], constants: Mapping[str, Any]) -> list[bytes]:
        """The Span messages of one span record (span_rows.py) as ScopeSpans.spans fields
        (tag, length, message), in ``rows_from_record``'s order and with its span ids: the
        same bytes as encoding its rows, no row made.

        A step's phases share the trace id, the step attribute and, per (name, kind,
        loader), their name, kind and attribute fields: those are encoded once and joined,
        and the usual span's length is known from their lengths, so it is framed in the
        same join.
        """
        const = self._record_constants
        if const is None or const[0] is not constants:
            const = self._record_constants = (constants, *self._constants(constants))
        _, consts, keys, block = const
        (name, trace_id, root_id, flags, start, end, attrs, status, events, phases,
         ids) = rec
        root = (name, trace_id, root_id, flags, 0, False, start, end, attrs, status, events,
                _INTERNAL_VALUE, None, ())
        if phases is None or not keys.isdisjoint(_PHASE_KEYS):
            if phases is None:
                return [_span_field(self.row(root, consts, keys, block))]
            # A run constant named like a phase attribute: the rows' own rules.
            return [_span_field(self.row(r, consts, keys, block))
                    for r in _rows.rows_from_record(rec)]
        step = attrs[_ATTR_STEP]
        span_ids = _rows.phase_span_ids(phases, ids)
        tid = self._trace_id(trace_id)
        # The run's constants then the step: the head of every phase's attributes.
        attrs_head = block + b"".join(self._items(b"\x4a", ((_ATTR_STEP, step),)))
        # A usual span's fields but its heads: trace id, span id (10), parent id (10),
        # start (9), end (9), the attributes' head, UNSET status and flags.
        fixed = len(tid) + 38 + len(attrs_head) + _UNSET_LOCAL_LEN
        heads = self._phase_heads
        out = []
        for i in _rows.phase_end_order(phases):
            (ph_name, kind, loader, _duration, _ordinal, parent_ref, ph_start, ph_end,
             ph_status, ph_events, extra, device) = phases[i]
            parent = root_id if parent_ref == root_id else span_ids[parent_ref - 1]
            head = heads.get((ph_name, kind, loader)) if not extra else None
            if head is None:
                if extra or not ph_name:  # the row's own dict order and rules: its row
                    out.append(_span_field(self._phase_row(rec, i, span_ids[i], parent,
                                                           consts, keys, block)))
                    continue
                head = self._phase_head(ph_name, kind, loader)
            if (ph_start and ph_end and parent and device is None and not ph_events
                    and ph_status is None):  # the usual phase: one join
                out.append(b"".join((_span_field_head(fixed + head[2]), tid,
                                     _pack_ids(b"\x12\x08", span_ids[i], b"\x22\x08", parent),
                                     head[0], _pack_times(b"\x39", ph_start, b"\x41", ph_end),
                                     attrs_head, head[1], _UNSET_LOCAL)))
                continue
            parts = [tid, b"\x12\x08" + span_ids[i].to_bytes(8, "big")]
            if parent:
                parts.append(b"\x22\x08" + parent.to_bytes(8, "big"))
            parts.append(head[0])
            if ph_start:
                parts.append(b"\x39" + _pack_q(ph_start))
            if ph_end:
                parts.append(b"\x41" + _pack_q(ph_end))
            parts.append(attrs_head)
            parts.append(head[1])
            if device is not None:
                parts.extend(self._items(b"\x4a", ((_ATTR_DEVICE, device),)))
            if ph_events:
                for ev_name, ev_time, ev_attrs in ph_events:
                    parts.append(self._event(Event(ev_name, ev_attrs, timestamp=ev_time)))
            parts.append(_UNSET_STATUS if ph_status is None
                         else self._status_bytes(row_status(ph_status)))
            parts.append(_FLAGS_LOCAL)
            out.append(_span_field(b"".join(parts)))
        head = None
        if status is None and not events and start and end and name and _ATTR_SLOW not in keys:
            # The usual root: the step, the loader (if any) and the slow flag, in that order
            # (a run constant named like one of them went through the rows above).
            root_keys = tuple(attrs)
            if root_keys == _ROOT_KEYS or root_keys == _ROOT_KEYS_LOADER:
                head = self._root_head(name, attrs.get(_ATTR_LOADER), attrs[_ATTR_SLOW])
        if head is None:
            out.append(_span_field(self.row(root, consts, keys, block)))
        else:  # a phase's fields less the parent id
            out.append(b"".join((_span_field_head(fixed - 10 + head[2]), tid,
                                 _pack_id(b"\x12\x08", root_id), head[0],
                                 _pack_times(b"\x39", start, b"\x41", end),
                                 attrs_head, head[1], _UNSET_LOCAL)))
        return out

    def _root_head(self, name: str, loader: Any, slow: Any) -> tuple[bytes, bytes, int] | None:
        """A root's name and kind fields, its loader and slow attributes and their length
        (cached), or None for values a cache key should not hold (the row encodes those)."""
        if type(slow) is not bool or not (loader is None or type(loader) is str):
            return None
        key = (name, loader, slow)
        head = self._root_heads.get(key)
        if head is None:
            items = [(_ATTR_SLOW, slow)] if loader is None else [(_ATTR_LOADER, loader),
                                                                 (_ATTR_SLOW, slow)]
            head = _head(self._name(name) + _KIND_BYTES[_INTERNAL_VALUE],
                         b"".join(self._items(b"\x4a", items)))
            if len(self._root_heads) >= _MAX_CACHED:
                self._root_heads.clear()
            self._root_heads[key] = head
        return head

    def _phase_head(self, name: str, kind: str, loader: str | None
                    ) -> tuple[bytes, bytes, int]:
        """A phase's name and kind fields, its phase, kind and loader attributes, and their
        length."""
        items = [(_ATTR_PHASE, name), (_ATTR_KIND, kind)]
        if loader is not None:
            items.append((_ATTR_LOADER, loader))
        head = _head(self._name(name) + _KIND_BYTES[_INTERNAL_VALUE],
                     b"".join(self._items(b"\x4a", items)))
        if len(self._phase_heads) >= _MAX_CACHED:
            self._phase_heads.clear()
        self._phase_heads[(name, kind, loader)] = head
        return head

    def _phase_row(self, rec: tuple[Any, ...], i: int, span_id: int, parent: int,
                   consts: Any, keys: frozenset[str], block: bytes) -> bytes:
        """A phase with attributes of its own, through its row (rows_from_record's dict)."""
        phase = rec[9][i]
        (ph_name, _kind, _loader, _duration, _ordinal, _parent_ref, ph_start, ph_end,
         ph_status, ph_events, _extra, _device) = phase
        ph_attrs = _rows.phase_attributes(rec[6][_ATTR_STEP], phase)
        return self.row((ph_name, rec[1], span_id, rec[3], parent, False, ph_start, ph_end,
                         ph_attrs, ph_status, ph_events, _INTERNAL_VALUE, None, ()),
                        consts, keys, block)

    def request_rows(self, rows: Sequence[Any], resource: Any, scope: Any,
                     constants: Mapping[str, Any]) -> bytes:
        """ExportTraceServiceRequest bytes for span rows: the same bytes as
        ``request(RowSpanFactory(resource, scope, constants).spans(rows))``, with no
        ``ReadableSpan`` made (the exporter process's path). An item that is ``bytes`` is a
        span of otel-train's own scope encoded already, as a ScopeSpans.spans field
        (:meth:`record`)."""
        if set(map(type, rows)) == _BYTES_ONLY:  # the usual batch: joined as it is
            return self._resource_spans(resource, ((scope, rows),))
        consts, keys, block = self._constants(constants)
        by_scope: dict[Any, list[bytes]] = {}
        encode = self.row
        for row in rows:
            if type(row) is bytes:
                by_scope.setdefault(None, []).append(row)
            else:
                by_scope.setdefault(row[12], []).append(
                    _span_field(encode(row, consts, keys, block)))
        return self._resource_spans(resource, (
            (scope if key is None else row_scope(key), fields)
            for key, fields in by_scope.items()))

    def _resource_spans(self, resource: Any, scopes: Any) -> bytes:
        """One ResourceSpans field: ``scopes`` is ``(scope, [ScopeSpans.spans field, ...])``
        pairs. Each message's length is summed from its parts, so a batch's spans are copied
        once, by the one join at the end (not once per nesting level)."""
        res = _ld(b"\x0a", self.resource(resource))
        parts = [b"", res]  # the ResourceSpans head goes first, when its length is known
        size = len(res)
        for scope, fields in scopes:
            sc = _ld(b"\x0a", self.scope(scope))
            tail = (_ld(b"\x1a", scope.schema_url.encode("utf-8"))
                    if scope is not None and scope.schema_url else b"")
            n = len(sc) + sum(map(len, fields)) + len(tail)
            head = b"\x12" + _varint(n)
            parts += (head, sc)
            parts += fields
            parts.append(tail)
            size += len(head) + n
        if resource.schema_url:
            tail = _ld(b"\x1a", resource.schema_url.encode("utf-8"))
            parts.append(tail)
            size += len(tail)
        parts[0] = b"\x0a" + _varint(size)
        return b"".join(parts)

    def request(self, spans: Sequence[ReadableSpan]) -> bytes:
        """ExportTraceServiceRequest bytes: spans grouped by resource, then by scope."""
        groups: dict[int, tuple[Any, dict[int, tuple[Any, list[bytes]]]]] = {}
        for span in spans:
            resource = span._resource if type(span) is ReadableSpan else span.resource
            scope = span.instrumentation_scope or None
            by_scope = groups.setdefault(id(resource), (resource, {}))[1]
            by_scope.setdefault(id(scope), (scope, []))[1].append(
                _span_field(self.span(span)))
        return b"".join(self._resource_spans(resource, by_scope.values())
                        for resource, by_scope in groups.values())


_FLAGS_LOCAL = b"\x85\x01" + _pack_i(_FLAGS_HAS_IS_REMOTE)
_FLAGS_REMOTE = b"\x85\x01" + _pack_i(_FLAGS_HAS_IS_REMOTE | _FLAGS_IS_REMOTE)
# A row's SpanKind value -> the Span.kind field (an unknown kind is INTERNAL, as the factory).
_KIND_BYTES = {k.value: b"\x30" + _SMALL[v] for k, v in _SPAN_KIND.items()}
_UNSET_STATUS = _Encoder._status_bytes(Status(StatusCode.UNSET))
_UNSET_LOCAL = _UNSET_STATUS + _FLAGS_LOCAL  # the usual end of a phase span
_UNSET_LOCAL_LEN = len(_UNSET_LOCAL)


def _head(fields: bytes, attributes: bytes) -> tuple[bytes, bytes, int]:
    """A cached span head: its name and kind fields, attribute fields, and their length."""
    return fields, attributes, len(fields) + len(attributes)


_STATUS_CODES = {c.value: c for c in StatusCode}


@functools.lru_cache(maxsize=256)
def row_scope(scope: tuple[Any, ...]) -> InstrumentationScope:
    """The InstrumentationScope of a user span row's ``(name, version, schema_url)``, one
    object per scope (the encoders' scope caches go by identity)."""
    return InstrumentationScope(*scope)


def row_status(status: tuple[int, str | None]) -> Status:
    """A row's ``(code, description)`` as the factory makes it a Status."""
    return Status(_STATUS_CODES.get(status[0], StatusCode.UNSET), status[1])


def _flags(parent: Any) -> int:
    flags = _FLAGS_HAS_IS_REMOTE
    if parent and parent.is_remote:
        flags |= _FLAGS_IS_REMOTE
    return flags


def encode_spans_fast(spans: Sequence[ReadableSpan]) -> bytes:
    """Serialized ``ExportTraceServiceRequest`` for ``span_builder`` (a one-off encoder)."""
    return _Encoder().request(spans)


# -- the SDK's exporters with the encoding step replaced --------------------------------------

def make_grpc_exporter(**kwargs: Any) -> Any:
    """The SDK's OTLP/gRPC span exporter, encoding with :class:`_Encoder`."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    class FastGrpcSpanExporter(OTLPSpanExporter):
        """OTLPSpanExporter (gRPC) whose request is built by the fast encoder."""

        _otel_train_encoder = _Encoder()

        def _translate_data(self, data: Sequence[ReadableSpan]) -> Any:
            try:
                return ExportTraceServiceRequest.FromString(
                    self._otel_train_encoder.request(data))
            except Exception as exc:  # never lose a batch to our encoder: use the SDK's
                _log.warning("otel-train: fast OTLP encoding failed (%r); using the SDK's", exc)
                return super()._translate_data(data)

    return FastGrpcSpanExporter(**kwargs)


def make_http_exporter(**kwargs: Any) -> Any:
    """The SDK's OTLP/HTTP span exporter, encoding with :class:`_Encoder` where it can.

    The encoding is replaced only on SDK versions whose exporter sends through
    ``self._client.export(bytes)`` (1.40+); older ones keep the SDK's own path.
    """
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    class FastHttpSpanExporter(OTLPSpanExporter):
        """OTLPSpanExporter (HTTP/protobuf) whose body is built by the fast encoder."""

        _otel_train_encoder = _Encoder()

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            client = getattr(self, "_client", None)
            if getattr(self, "_shutdown", False) or client is None or not hasattr(
                    client, "export") or not hasattr(self, "_metrics"):
                return super().export(spans)
            try:
                body = self._otel_train_encoder.request(spans)
            except Exception as exc:
                _log.warning("otel-train: fast OTLP encoding failed (%r); using the SDK's", exc)
                return super().export(spans)
            max_size = getattr(self, "_max_request_size", None)
            if max_size and len(body) > max_size:
                return super().export(spans)  # the SDK's own too-large handling and logging
            with self._metrics.export_operation(len(spans)) as result:
                sent = client.export(body)
                if not sent.success:
                    result.error = sent.error
                    return SpanExportResult.FAILURE
            return SpanExportResult.SUCCESS

    return FastHttpSpanExporter(**kwargs)

