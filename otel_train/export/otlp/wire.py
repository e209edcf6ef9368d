"""Protobuf wire format for OTLP spans: varints, length-delimited fields, attribute values.

The pieces ``encoding.py`` joins into ``ExportTraceServiceRequest`` bytes, written by hand
(the SDK's encoder builds one protobuf message object per attribute, value, span and event).
Field numbers follow ``opentelemetry/proto/trace/v1/trace.proto``; the bytes parse into
exactly the message the SDK's ``encode_spans`` builds (``tests/export/otlp/test_encoding.py``
checks it).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.trace import SpanKind, StatusCode

pack_q = struct.Struct("<Q").pack
pack_d = struct.Struct("<d").pack
pack_i = struct.Struct("<I").pack
# A usual span's fixed fields in one call each: the span and parent ids (tag, 8 bytes big
# endian, as the SDK writes ids) and the start and end times (tag, fixed64 little endian).
pack_id = struct.Struct(">2sQ").pack
pack_ids = struct.Struct(">2sQ2sQ").pack
pack_times = struct.Struct("<cQcQ").pack

SMALL = [bytes((i,)) for i in range(0x80)]
_SPAN_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3,
              SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
# A row's SpanKind value -> the Span.kind field (an unknown kind is INTERNAL, as the factory).
KIND_BYTES = {k.value: b"\x30" + SMALL[v] for k, v in _SPAN_KIND.items()}
_FLAGS_HAS_IS_REMOTE = 0x100
_FLAGS_IS_REMOTE = 0x200
FLAGS_LOCAL = b"\x85\x01" + pack_i(_FLAGS_HAS_IS_REMOTE)
FLAGS_REMOTE = b"\x85\x01" + pack_i(_FLAGS_HAS_IS_REMOTE | _FLAGS_IS_REMOTE)
_LINK_FLAGS = b"\x35" + pack_i(_FLAGS_HAS_IS_REMOTE | _FLAGS_IS_REMOTE)  # links are remote


def varint(n: int) -> bytes:
    """A base-128 varint (negative numbers as their 64-bit two's complement)."""
    if n < 0x80:
        return SMALL[n] if n >= 0 else varint(n & 0xFFFFFFFFFFFFFFFF)
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def ld(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field."""
    return tag + varint(len(payload)) + payload


# ScopeSpans.spans field heads (tag and length) for the usual span sizes, so a record's
# spans are framed as they are joined (the export thread then joins a batch as it is).
_SPAN_FIELD_HEADS = [b"\x12" + varint(n) for n in range(4096)]


def span_field_head(n: int) -> bytes:
    """The ScopeSpans.spans field's tag and length for an ``n``-byte Span message."""
    return _SPAN_FIELD_HEADS[n] if n < 4096 else b"\x12" + varint(n)


def span_field(span: bytes) -> bytes:
    """A Span message as a ScopeSpans.spans field."""
    return span_field_head(len(span)) + span


def any_value(value: Any) -> bytes:
    """An AnyValue message's bytes (the SDK's ``_encode_value`` rules)."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10" + (b"\x01" if value else b"\x00")
    if isinstance(value, str):
        return ld(b"\x0a", value.encode("utf-8"))
    if isinstance(value, int):
        return b"\x18" + varint(value)
    if isinstance(value, float):
        return b"\x21" + pack_d(value)
    if isinstance(value, bytes):
        return ld(b"\x3a", value)
    if isinstance(value, Sequence):
        return ld(b"\x2a", b"".join(ld(b"\x0a", any_value(v)) for v in value))
    if isinstance(value, Mapping):
        return ld(b"\x32", b"".join(ld(b"\x0a", key_value(str(k), v))
                                    for k, v in value.items()))
    raise TypeError(f"Invalid type {type(value)} of value {value}")


def key_value(key: str, value: Any) -> bytes:
    """A KeyValue message's bytes."""
    return ld(b"\x0a", key.encode("utf-8")) + ld(b"\x12", any_value(value))


def status_field(code: int, description: str | None) -> bytes:
    """The Span.status field of a row's ``(code, description)``, as the SDK's ``Status``
    keeps it: an unknown code is UNSET, and only an ERROR keeps its description."""
    st = []
    if description and code == _ERROR:
        st.append(ld(b"\x12", description.encode("utf-8")))
    if code in _STATUS_CODES and code:
        st.append(b"\x18" + SMALL[code])
    return ld(b"\x7a", b"".join(st))


def link_field(trace_id: int, span_id: int, attributes: bytes) -> bytes:
    """A Span.links field (a link's context is remote, as the row factory makes it)."""
    return ld(b"\x6a", b"".join((b"\x0a\x10" + trace_id.to_bytes(16, "big"),
                                 b"\x12\x08" + span_id.to_bytes(8, "big"), attributes,
                                 _LINK_FLAGS)))


_STATUS_CODES = frozenset(c.value for c in StatusCode)
_ERROR = StatusCode.ERROR.value
UNSET_STATUS = status_field(StatusCode.UNSET.value, None)
UNSET_LOCAL = UNSET_STATUS + FLAGS_LOCAL  # the usual end of a phase span
UNSET_LOCAL_LEN = len(UNSET_LOCAL)
