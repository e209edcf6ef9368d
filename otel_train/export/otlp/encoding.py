"""OTLP span encoding from span records and rows, written straight to protobuf wire format.

The SDK's ``encode_spans`` builds one protobuf message object per attribute, value, span and
event, all of it GIL-holding CPU. otel-train's spans repeat the same attributes on every span
(run id, rank, phase, kind, loader...), so this encoder writes the wire bytes directly from
span records and rows (``records/span_rows.py``) and caches each encoded key/value pair; only
values that change (the step index, a loss) are encoded per span. No ``ReadableSpan`` is made:
the bytes parse into exactly the message ``encode_spans`` builds for the spans
``RowSpanFactory`` would make of the same rows (``tests/export/otlp/test_encoding.py``).

What the export stage queues for an OTLP exporter is *encoded spans*: each a Span message
framed as a ``ScopeSpans.spans`` field (``bytes``), otel-train's own scope; a user span of
another scope is a :class:`ScopedSpanField`, which names its scope. :meth:`_Encoder.request`
joins a batch of them into one request. The usual step record is encoded by the C twin of
:meth:`_Encoder.record` (``_encode_c.c``) where it was built; every other record, and every
record with ``OTEL_TRAIN_PURE_PYTHON=1``, by the Python here, to the same bytes.

Usage::

    enc = _Encoder()
    fields = enc.record(rec, run_constants)          # one step's spans, encoded
    field = enc.row_field(row, run_constants)        # one user span, encoded
    body = enc.request(fields + [field], resource, scope)
"""

from __future__ import annotations

import logging
import os
from itertools import islice
from collections.abc import Mapping, Sequence
from typing import Any

from otel_train.common import attributes as A
from otel_train.export.encode_cache import ForeignScope, IdentityCache, KeyValueCache, by_scope
from otel_train.export.otlp import wire as W
from otel_train.records import span_rows as _rows
from otel_train.records.span_rows import INTERNAL_KIND, row_scope
from otel_train.records.span_rows import phase_span_ids as _phase_span_ids

_log = logging.getLogger("otel_train")
_MAX_CACHED = 8192
_OWN_ONLY = {bytes}
_INTERNAL = INTERNAL_KIND
# otel-train's phase attributes, in the order rows_from_record sets them.
_ATTR_STEP, _ATTR_PHASE, _ATTR_KIND = A.STEP, A.PHASE, A.PHASE_KIND
_ATTR_LOADER, _ATTR_DEVICE, _ATTR_SLOW = A.DATALOADER, A.DEVICE_DURATION, A.SLOW
_PHASE_KEYS = frozenset((_ATTR_STEP, _ATTR_PHASE, _ATTR_KIND, _ATTR_LOADER, _ATTR_DEVICE))
# A phase whose only attributes of its own say its device timing (``train.device.synced``,
# ``train.device.timing``: every span of a run with device events or monitor_sync) is still
# a usual phase: those two pairs come from a cache too.
_TIMING_KEYS = (A.DEVICE_SYNCED, A.DEVICE_TIMING)
_C_PHASES, _C_IDS = _rows.C_PHASES, _rows.C_IDS  # a record's fields, read per record
_ROOT_KEYS = (_ATTR_STEP, _ATTR_SLOW)  # a step root's attributes, without and with a loader
_ROOT_KEYS_LOADER = (_ATTR_STEP, _ATTR_LOADER, _ATTR_SLOW)
# A usual span's fields but its heads: trace id (18), span id (10), parent id (10),
# start (9), end (9), the UNSET status and flags.
_FIXED_LEN = 18 + 38 + W.UNSET_LOCAL_LEN

# The C twin of :meth:`_Encoder.record` for the usual step (``_encode_c.c``, built at install
# where a compiler is found, as the hot path's accelerator): one call per step, about a
# quarter of this module's CPU for it (benchmarks/bench_processors.py prints both). It
# returns None for any record it does not encode (the choice is per record) and the Python
# below encodes it; OTEL_TRAIN_PURE_PYTHON=1 selects the Python alone, as it does the hot
# path's twin.
_encode_c: Any
if os.environ.get("OTEL_TRAIN_PURE_PYTHON", "").strip().lower() in ("", "0", "false", "no"):
    try:
        from otel_train.export.otlp import _encode_c  # type: ignore[attr-defined, no-redef]
        ENCODER = "C (otel_train.export.otlp._encode_c)"
    except ImportError:
        _encode_c = None
        ENCODER = ("pure Python: the C span encoder was not built at install (it needs a C "
                   "compiler and Python's headers)")
else:
    _encode_c = None
    ENCODER = "pure Python (OTEL_TRAIN_PURE_PYTHON is set)"
#: True when a step record's usual spans are encoded in C.
ACCELERATED = _encode_c is not None
if _encode_c is not None:
    _encode_c.configure(_ATTR_STEP, _ATTR_PHASE, _ATTR_KIND, _ATTR_LOADER, _ATTR_SLOW,
                        _TIMING_KEYS, W.KIND_BYTES[_INTERNAL], W.UNSET_LOCAL)


class ScopedSpanField(ForeignScope, bytes):
    """An encoded span (a ScopeSpans.spans field) of a user span's own scope."""


class _Encoder:
    """Holds the caches; one per thread that encodes (an exporter's export thread, or where
    records arrive). ``accelerated``: encode the usual step record in C (the default where
    it was built); ``records_in_c`` and ``records_in_python`` count which encoded each step
    record."""

    def __init__(self, accelerated: bool | None = None) -> None:
        if accelerated and _encode_c is None:
            raise ValueError("accelerated=True: the C span encoder (_encode_c) is not built "
                             "here, or OTEL_TRAIN_PURE_PYTHON is set")
        self._step_fields = (_encode_c.step_fields if _encode_c is not None
                             and accelerated is not False else None)
        self._steps_fields = (_encode_c.steps_fields if self._step_fields is not None
                              else None)
        self._request_body = (_encode_c.request_body if self._step_fields is not None
                              else None)
        # The ids a run of records draws, counted in C (span_fields._run_draws, the twin).
        self.run_draws_c = _encode_c.run_draws if self._step_fields is not None else None
        self.records_in_c = 0
        self.records_in_python = 0
        self._kv: dict[bytes, KeyValueCache[bytes]] = {}  # per field tag
        self._names: dict[str, bytes] = {}
        self._resources: IdentityCache[bytes] = IdentityCache()
        self._scopes: IdentityCache[bytes] = IdentityCache()
        self._trace: tuple[int, bytes] = (-1, b"")
        # (name and kind fields, attribute fields, their length in all)
        self._phase_heads: dict[tuple[Any, ...], tuple[bytes, bytes, int]] = {}
        self._root_heads: dict[tuple[Any, ...], tuple[bytes, bytes, int]] = {}
        # (mapping, (items, keys, block), whether no key is named like a phase attribute)
        self._last_constants: tuple[Any, ...] | None = None
        self._timings: dict[tuple[Any, ...], bytes] = {}  # a phase's timing pairs, encoded

    def attributes(self, tag: bytes, attrs: Mapping[str, Any] | None) -> list[bytes]:
        """The KeyValue fields (under ``tag``) of ``attrs``."""
        if not attrs:
            return []
        return self._items(tag, attrs.items())

    def _items(self, tag: bytes, items: Any) -> list[bytes]:
        kv = self._kv.get(tag)
        if kv is None:
            kv = self._kv[tag] = KeyValueCache(lambda k, v: W.ld(tag, W.key_value(k, v)))
        return kv.encode(items)

    def resource(self, resource: Any) -> bytes:
        """A Resource message's bytes (made once per resource object)."""
        return self._resources.get(resource, lambda r: b"".join(
            self.attributes(b"\x0a", r.attributes)))

    def scope(self, scope: Any) -> bytes:
        """An InstrumentationScope message's bytes (made once per scope object)."""
        return self._scopes.get(scope, self._scope_bytes)

    def _scope_bytes(self, scope: Any) -> bytes:
        if scope is None:
            return b""
        parts = []
        if scope.name:
            parts.append(W.ld(b"\x0a", scope.name.encode("utf-8")))
        if scope.version:
            parts.append(W.ld(b"\x12", scope.version.encode("utf-8")))
        parts.extend(self.attributes(b"\x1a", scope.attributes))
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
            enc = W.ld(b"\x2a", name.encode("utf-8"))
            if len(self._names) >= _MAX_CACHED:
                self._names.clear()
            self._names[name] = enc
        return enc

    def _event(self, name: str, time_ns: int, attrs: Mapping[str, Any] | None) -> bytes:
        """A Span.events field of a row's ``(name, timestamp, attributes)``."""
        ev = []
        if time_ns:
            ev.append(b"\x09" + W.pack_q(time_ns))
        if name:
            ev.append(W.ld(b"\x12", name.encode("utf-8")))
        ev.extend(self.attributes(b"\x1a", attrs))
        return W.ld(b"\x5a", b"".join(ev))

    def row(self, row: tuple[Any, ...], constants: tuple[tuple[str, Any], ...],
            constant_keys: frozenset[str], block: bytes) -> bytes:
        """One Span message's bytes from a span row (span_rows.py), without the span.

        The same bytes as the SDK encodes ``RowSpanFactory.span(row)`` to: the run's
        constants head an otel-train span's attributes as one cached block; a row that sets a
        constant's key gets its own value in the constant's place, as a dict ``update`` would.
        """
        (name, trace_id, span_id, _flags, parent_id, remote, start, end, attrs, status,
         events, kind, scope, links) = row
        parts = [self._trace_id(trace_id), b"\x12\x08" + span_id.to_bytes(8, "big")]
        if parent_id:
            parts.append(b"\x22\x08" + parent_id.to_bytes(8, "big"))
        if name:
            parts.append(self._name(name))
        parts.append(W.KIND_BYTES.get(kind, b"\x30\x01"))
        if start:
            parts.append(b"\x39" + W.pack_q(start))
        if end:
            parts.append(b"\x41" + W.pack_q(end))
        if scope is None:
            if not attrs or constant_keys.isdisjoint(attrs):
                parts.append(block)
                if attrs:
                    parts.extend(self._items(b"\x4a", attrs.items()))
            else:  # the row sets a constant's key: its value, in the constant's place
                merged = dict(constants)
                merged.update(attrs)
                parts.extend(self._items(b"\x4a", merged.items()))
        elif attrs:
            parts.extend(self._items(b"\x4a", attrs.items()))
        for ev_name, ev_time, ev_attrs in events or ():
            parts.append(self._event(ev_name, ev_time, ev_attrs))
        for l_trace, l_span, _l_flags, l_attrs in links or ():
            parts.append(W.link_field(l_trace, l_span,
                                      b"".join(self.attributes(b"\x22", l_attrs))))
        parts.append(W.UNSET_STATUS if status is None else W.status_field(*status))
        parts.append(W.FLAGS_REMOTE if parent_id and remote else W.FLAGS_LOCAL)
        return b"".join(parts)

    def _constants(self, constants: Mapping[str, Any]
                   ) -> tuple[tuple[tuple[str, Any], ...], frozenset[str], bytes]:
        """The run's constants as items, keys and their attribute block, kept for the last
        mapping seen (a run hands the same one every time; its values never change)."""
        last = self._last_constants
        if last is not None and last[0] is constants:
            return last[1]  # type: ignore[no-any-return]
        consts = tuple(constants.items())
        keys, block = frozenset(constants), b"".join(self._items(b"\x4a", consts))
        self._last_constants = (constants, (consts, keys, block), keys.isdisjoint(_PHASE_KEYS))
        return consts, keys, block

    def frame_parts(self, constants: Mapping[str, Any]) -> tuple[frozenset[str], bytes, Any]:
        """What encoding a frame of records (``span_fields.encode_frame``) reads of this
        encoder for ``constants``: their keys, their attribute block, and the C encoder of a
        frame's usual steps (None where the Python encodes them, or where a run constant is
        named like a phase attribute and the rows' rules apply)."""
        last = self._last_constants  # the run's one mapping, every frame: no call for it
        if last is None or last[0] is not constants:
            self._constants(constants)
            last = self._last_constants
        (_, keys, block), phase_keys_free = last[1], last[2]  # type: ignore[index]
        return keys, block, self._steps_fields if phase_keys_free else None

    def record(self, rec: tuple[Any, ...], constants: Mapping[str, Any],
               span_ids: list[int] | None = None) -> list[bytes]:
        """The Span messages of one span record (span_rows.py) as ScopeSpans.spans fields
        (tag, length, message), in ``rows_from_record``'s order and with its span ids: the
        same bytes as encoding its rows, no row made.

        A step's phases share the trace id, the step attribute and, per (name, kind,
        loader), their name, kind and attribute fields: those are encoded once and joined,
        and the usual span's length is known from their lengths, so it is framed in the
        same join.
        """
        last = self._last_constants  # the run's one mapping, every record: no call for it
        if last is None or last[0] is not constants:
            self._constants(constants)
            last = self._last_constants
        const, phase_keys_free = last[1], last[2]  # type: ignore[index]
        consts, keys, block = const
        phases = rec[_C_PHASES]
        if phases is None or not phase_keys_free:
            # A monitoring operation (one root span), or a run constant named like a phase
            # attribute: the rows' own rules.
            return [W.span_field(self.row(r, consts, keys, block))
                    for r in _rows.rows_from_record(rec)]
        if span_ids is None:
            span_ids = _phase_span_ids(phases, rec[_C_IDS])
        if self._step_fields is not None:
            fields = self._step_fields(rec, span_ids, block, keys)
            if fields is not None:
                self.records_in_c += 1
                return fields  # type: ignore[no-any-return]
        self.records_in_python += 1
        tid = self._trace_id(rec[_rows.C_TRACE])
        # The run's constants then the step: the head of every phase's attributes.
        attrs_head = block + b"".join(
            self._items(b"\x4a", ((_ATTR_STEP, rec[_rows.C_ATTRS][_ATTR_STEP]),)))
        fixed = _FIXED_LEN + len(attrs_head)
        out = self._phase_fields(rec, span_ids, tid, attrs_head, fixed, const)
        out.append(self._root_field(rec, tid, attrs_head, fixed, const))
        return out

    def _phase_fields(self, rec: tuple[Any, ...], span_ids: list[int], tid: bytes,
                      attrs_head: bytes, fixed: int, const: tuple[Any, ...]) -> list[bytes]:
        """The encoded phase spans of a step record, in the order they ended."""
        root_id, phases = rec[_rows.C_ROOT_ID], rec[_rows.C_PHASES]
        heads = self._phase_heads
        # Timing pairs join the cached parts unless a run constant has their names (a run
        # whose spans all share one timing): then the rows' rules.
        timing_fast = const[1].isdisjoint(_TIMING_KEYS)
        out = []
        for i in _rows.phase_end_order(phases):
            phase = phases[i]
            (ph_name, kind, loader, _duration, _ordinal, parent_ref, ph_start, ph_end,
             ph_status, ph_events, extra, device) = phase
            parent = root_id if parent_ref == root_id else span_ids[parent_ref - 1]
            timing = (b"" if not extra else self._timing_bytes(extra) if timing_fast
                      else None)
            if timing is None or not ph_name:  # the row's own dict order and rules: its row
                out.append(W.span_field(self._phase_row(rec, i, span_ids[i], parent, const)))
                continue
            head = heads.get((ph_name, kind, loader)) or self._phase_head(ph_name, kind, loader)
            if (ph_start and ph_end and parent and device is None and not ph_events
                    and ph_status is None):  # the usual phase: one join
                out.append(b"".join((
                    W.span_field_head(fixed + head[2] + len(timing)), tid,
                    W.pack_ids(b"\x12\x08", span_ids[i], b"\x22\x08", parent), head[0],
                    W.pack_times(b"\x39", ph_start, b"\x41", ph_end), attrs_head, head[1],
                    timing, W.UNSET_LOCAL)))
            else:
                out.append(W.span_field(self._odd_phase(tid, span_ids[i], parent, head, phase,
                                                        attrs_head, timing)))
        return out

    def _timing_bytes(self, extra: Mapping[str, Any]) -> bytes | None:
        """The encoded attributes of a phase's ``extra`` when they are only its device
        timing pairs (cached, in their order); None for any other attributes (its row)."""
        if len(extra) > 2 or not all(k in _TIMING_KEYS for k in extra):
            return None
        key = tuple(extra.items())
        cached = self._timings.get(key)
        if cached is None:
            if not all(type(v) in (bool, str) for _, v in key):
                return None
            if len(self._timings) >= _MAX_CACHED:
                self._timings.clear()
            cached = self._timings[key] = b"".join(self._items(b"\x4a", key))
        return cached

    def _odd_phase(self, tid: bytes, span_id: int, parent: int, head: tuple[bytes, bytes, int],
                   phase: tuple[Any, ...], attrs_head: bytes, timing: bytes = b"") -> bytes:
        """A phase span that is not the usual one: a device time, events, a status."""
        ph_start, ph_end, ph_status, ph_events, device = (
            phase[_rows.P_START], phase[_rows.P_END], phase[_rows.P_STATUS],
            phase[_rows.P_EVENTS], phase[_rows.P_DEVICE_SECONDS])
        parts = [tid, b"\x12\x08" + span_id.to_bytes(8, "big")]
        if parent:
            parts.append(b"\x22\x08" + parent.to_bytes(8, "big"))
        parts.append(head[0])
        if ph_start:
            parts.append(b"\x39" + W.pack_q(ph_start))
        if ph_end:
            parts.append(b"\x41" + W.pack_q(ph_end))
        parts.append(attrs_head)
        parts.append(head[1])
        if device is not None:
            parts.extend(self._items(b"\x4a", ((_ATTR_DEVICE, device),)))
        parts.append(timing)  # the extra attributes come last, as in the row
        for ev_name, ev_time, ev_attrs in ph_events or ():
            parts.append(self._event(ev_name, ev_time, ev_attrs))
        parts.append(W.UNSET_STATUS if ph_status is None else W.status_field(*ph_status))
        parts.append(W.FLAGS_LOCAL)
        return b"".join(parts)

    def _root_field(self, rec: tuple[Any, ...], tid: bytes, attrs_head: bytes, fixed: int,
                    const: tuple[Any, ...]) -> bytes:
        """The encoded root span of a step record."""
        (name, trace_id, root_id, flags, start, end, attrs, status, events, _phases,
         _ids) = rec
        consts, keys, block = const
        head = None
        extra = b""
        if status is None and not events and start and end and name and _ATTR_SLOW not in keys:
            # The usual root: the step, the loader (if any) and the slow flag, in that order,
            # then what the step added (its bound, tokens, samples), encoded pair by pair
            # (cached); a run constant named like any of them goes through the rows.
            root_keys = tuple(attrs)
            usual = _ROOT_KEYS_LOADER if root_keys[1:2] == (_ATTR_LOADER,) else _ROOT_KEYS
            n = len(usual)
            if root_keys[:n] == usual and keys.isdisjoint(root_keys[n:]):
                head = self._root_head(name, attrs.get(_ATTR_LOADER) if n == 3 else None,
                                       attrs[_ATTR_SLOW])
                if head is not None and len(root_keys) > n:
                    extra = b"".join(self._items(b"\x4a", islice(attrs.items(), n, None)))
        if head is None:
            root = (name, trace_id, root_id, flags, 0, False, start, end, attrs, status,
                    events, _INTERNAL, None, ())
            return W.span_field(self.row(root, consts, keys, block))
        # A phase's fields less the parent id.
        return b"".join((W.span_field_head(fixed - 10 + head[2] + len(extra)), tid,
                         W.pack_id(b"\x12\x08", root_id), head[0],
                         W.pack_times(b"\x39", start, b"\x41", end), attrs_head, head[1],
                         extra, W.UNSET_LOCAL))

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
            head = _head(self._name(name) + W.KIND_BYTES[_INTERNAL],
                         b"".join(self._items(b"\x4a", items)))
            if len(self._root_heads) >= _MAX_CACHED:
                self._root_heads.clear()
            self._root_heads[key] = head
        return head

    def _phase_head(self, name: str, kind: str, loader: str | None
                    ) -> tuple[bytes, bytes, int]:
        """A phase's name and kind fields, its phase, kind and loader attributes, and their
        length (cached)."""
        items = [(_ATTR_PHASE, name), (_ATTR_KIND, kind)]
        if loader is not None:
            items.append((_ATTR_LOADER, loader))
        head = _head(self._name(name) + W.KIND_BYTES[_INTERNAL],
                     b"".join(self._items(b"\x4a", items)))
        if len(self._phase_heads) >= _MAX_CACHED:
            self._phase_heads.clear()
        self._phase_heads[(name, kind, loader)] = head
        return head

    def _phase_row(self, rec: tuple[Any, ...], i: int, span_id: int, parent: int,
                   const: tuple[Any, ...]) -> bytes:
        """A phase with attributes of its own, through its row (rows_from_record's dict)."""
        consts, keys, block = const
        phase = rec[_rows.C_PHASES][i]
        ph_attrs = _rows.phase_attributes(rec[_rows.C_ATTRS][_ATTR_STEP], phase)
        return self.row((phase[_rows.P_NAME], rec[_rows.C_TRACE], span_id, rec[_rows.C_FLAGS],
                         parent, False, phase[_rows.P_START], phase[_rows.P_END], ph_attrs,
                         phase[_rows.P_STATUS], phase[_rows.P_EVENTS], _INTERNAL, None, ()),
                        consts, keys, block)

    def row_field(self, row: tuple[Any, ...], constants: Mapping[str, Any]) -> bytes:
        """One row as an encoded span for :meth:`request`: a ScopeSpans.spans field, a
        :class:`ScopedSpanField` when the row has a scope of its own."""
        return ScopedSpanField.tagged(W.span_field(self.row(row, *self._constants(constants))),
                                      row[_rows.R_SCOPE])

    def request(self, fields: Sequence[bytes], resource: Any, scope: Any) -> bytes:
        """ExportTraceServiceRequest bytes for encoded spans (:meth:`record`,
        :meth:`row_field`): otel-train's under ``scope``, the others under their own."""
        joined = self._request_body
        if joined is not None and type(fields) is list:  # the usual batch, in C in one pass
            body = joined(W.ld(b"\x0a", self.resource(resource)),
                          W.ld(b"\x0a", self.scope(scope)), fields, _schema_field(scope),
                          _schema_field(resource))
            if body is not None:
                return body
        if set(map(type, fields)) <= _OWN_ONLY:  # the usual batch: joined as it is
            return self._resource_spans(resource, ((scope, fields),))
        return self._resource_spans(resource, (
            (scope if key is None else row_scope(key), group)
            for key, group in by_scope(fields).items()))

    def request_rows(self, rows: Sequence[tuple[Any, ...]], resource: Any, scope: Any,
                     constants: Mapping[str, Any]) -> bytes:
        """ExportTraceServiceRequest bytes for span rows: the bytes the SDK encodes
        ``RowSpanFactory(resource, scope, constants).spans(rows)`` to."""
        return self.request([self.row_field(row, constants) for row in rows], resource, scope)

    def _resource_spans(self, resource: Any, scopes: Any) -> bytes:
        """One ResourceSpans field: ``scopes`` is ``(scope, [ScopeSpans.spans field, ...])``
        pairs. Each message's length is summed from its parts, so a batch's spans are copied
        once, by the one join at the end (not once per nesting level)."""
        res = W.ld(b"\x0a", self.resource(resource))
        parts = [b"", res]  # the ResourceSpans head goes first, when its length is known
        size = len(res)
        for scope, fields in scopes:
            sc = W.ld(b"\x0a", self.scope(scope))
            tail = (W.ld(b"\x1a", scope.schema_url.encode("utf-8"))
                    if scope is not None and scope.schema_url else b"")
            n = len(sc) + sum(map(len, fields)) + len(tail)
            head = b"\x12" + W.varint(n)
            parts += (head, sc)
            parts += fields
            parts.append(tail)
            size += len(head) + n
        if resource.schema_url:
            tail = W.ld(b"\x1a", resource.schema_url.encode("utf-8"))
            parts.append(tail)
            size += len(tail)
        parts[0] = b"\x0a" + W.varint(size)
        return b"".join(parts)



def _schema_field(owner: Any) -> bytes:
    """A scope's or resource's schema_url field (tag 3), empty without one."""
    url = owner.schema_url if owner is not None else ""
    return W.ld(b"\x1a", url.encode("utf-8")) if url else b""


def _head(fields: bytes, attributes: bytes) -> tuple[bytes, bytes, int]:
    """A cached span head: its name and kind fields, attribute fields, and their length."""
    return fields, attributes, len(fields) + len(attributes)
