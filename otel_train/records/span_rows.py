"""Span rows: a finished span as one flat tuple of plain values, the one currency of spans.

Making a ``ReadableSpan`` holds the GIL for its ``SpanContext``, ``Status`` and bounded
attributes, and it pickles slowly. The step record builder writes each step as a *span
record* instead: a tuple of ints, strings and plain dicts, its phases decoded. Records feed the
derived metrics directly (:func:`view_from_record` makes the ``StepView`` the processors read),
go down a pipe to the exporter process as ``marshal`` bytes, and are encoded straight to OTLP
or OTLP/JSON by the export stage. They become *rows* (one flat tuple per span,
:func:`rows_from_record`), and rows become ``ReadableSpan``s (:class:`RowSpanFactory`), only
at the edge where something outside otel-train needs SDK spans: an application's own span
processors, or a plain SDK ``SpanExporter`` such as the console exporter. User spans opened
with the OTel API come in the other way, made rows by :func:`row_from_span`. One record, the
same spans whichever way it went (the phases' span ids are drawn where the rows are made).

Layout (index constants ``R_*``)::

    (name, trace_id, span_id, flags, parent_span_id, parent_is_remote, start_ns, end_ns,
     attributes, status, events, kind, scope, links)

- times are epoch nanoseconds; ``parent_span_id`` 0 means a root span;
- ``attributes``: a plain dict. For otel-train's own spans (``scope`` None) it leaves out the
  run's constant attributes (run id, rank, world size, device), which the factory puts first;
- ``status``: None (unset) or ``(status_code_value, description)``;
- ``events``: ``((name, timestamp_ns, attributes), ...)``; ``links``: ``((trace_id, span_id,
  flags, attributes), ...)``; ``kind``: ``SpanKind`` value;
- ``scope``: None for otel-train's own spans, else ``(name, version, schema_url)``.
"""

from __future__ import annotations

import functools
import random
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from otel_train.common import attributes as A
from otel_train.records.steps_view import (
    P_DURATION,
    P_KIND,
    P_LOADER,
    P_NAME,
    P_PARENT_ID,
    P_SPAN_ID,
    StepView,
    count_monitoring,
)


(R_NAME, R_TRACE, R_SPAN, R_FLAGS, R_PARENT, R_REMOTE, R_START, R_END, R_ATTRS, R_STATUS,
 R_EVENTS, R_KIND, R_SCOPE, R_LINKS) = range(14)
# A span record: one step (or monitoring operation) before its rows are made.
(C_NAME, C_TRACE, C_ROOT_ID, C_FLAGS, C_START, C_END, C_ATTRS, C_STATUS, C_EVENTS, C_PHASES,
 C_IDS) = range(11)
# A record's phase (a tuple of 12): name, kind, loader, duration_ns, ordinal + 1, the
# parent's ordinal + 1 or the root's span id (these six are a StepView phase: steps_view.P_*,
# re-exported here; the real span ids of phases are drawn with the rows), start_ns, end_ns,
# status, events, extra attributes or None, device seconds or None.
P_START, P_END, P_STATUS, P_EVENTS, P_EXTRA, P_DEVICE_SECONDS = range(6, 12)
PHASE_FIELDS = 12
# Every phase position, in order (the C recorder builds the same tuple: _recorder_c_rows.c).
PHASE_LAYOUT = (P_NAME, P_KIND, P_LOADER, P_DURATION, P_SPAN_ID, P_PARENT_ID, P_START, P_END,
                P_STATUS, P_EVENTS, P_EXTRA, P_DEVICE_SECONDS)
_getrandbits = random.getrandbits
_ID_STRUCTS = [struct.Struct(f"<{n}Q") for n in range(33)]  # n span ids from one draw
INTERNAL_KIND = SpanKind.INTERNAL.value
_UNSET = Status(StatusCode.UNSET)
_KINDS = {k.value: k for k in SpanKind}
_CODES = {c.value: c for c in StatusCode}
_ROOT_NAME, _STEP, _KIND_ATTR, _LOADER = A.STEP_SPAN_NAME, A.STEP, A.PHASE_KIND, A.DATALOADER
_MONITOR, _PHASE, _DEVICE_DURATION = A.KIND_MONITOR, A.PHASE, A.DEVICE_DURATION
_ENVELOPE = A.KIND_ENVELOPE
_new_view = object.__new__


class RowRoot:
    """Stands in for a step's root span in a ``StepView`` built from a span record.

    Processors that mark the root (``train.slow``, GPU attributes, the sample reason) write
    through ``steps_view.set_span_attribute``, which updates this dict in place: the record's
    root attributes, so the mark travels with the record to the exporter.
    """

    __slots__ = ("_attributes",)

    def __init__(self, attributes: dict[str, Any]) -> None:
        self._attributes = attributes


def view_from_record(rec: tuple[Any, ...], rank: Any) -> StepView | None:
    """The ``StepView`` of one span record (a step, or a monitoring operation)."""
    (name, trace_id, root_id, _flags, start, end, attrs, _status, events, phases,
     _ids) = rec
    ctx = (trace_id, root_id)
    if attrs.get(_KIND_ATTR) == _ENVELOPE:  # train.startup: the job envelope, not a step
        view = StepView(False, attrs.get(_PHASE, name), RowRoot(attrs), ctx,  # type: ignore[arg-type]
                        attrs, start, end, [])
        view.rank = rank
        view.envelope = True
        return view
    if phases is not None:
        # A record's phases start with the fields a view's phases have (steps_view.P_*).
        view = StepView(True, name, RowRoot(attrs), ctx, attrs, start, end,  # type: ignore[arg-type]
                        phases)
        view.rank = rank
        view.events = events
        if phases:
            count_monitoring(view)
        return view
    view = StepView(False, attrs.get(_PHASE, name), RowRoot(attrs), ctx,  # type: ignore[arg-type]
                    attrs, start, end, [])
    view.rank = rank
    view.operations.append((view.name, view.duration_ns))
    view.monitor_ns = view.duration_ns
    return view


def views_from_records(recs: Sequence[tuple[Any, ...]], rank: Any,
                       failed: Callable[[Exception], None]) -> list[StepView]:
    """The ``StepView`` of each record (:func:`view_from_record`), a frame at once; a
    record whose view cannot be made goes to ``failed``, the others go on.

    A step's view is made here with no call: ``StepView.__init__``'s fields each set once
    (no context tuple, no rank read from the attributes), and its monitoring counted in
    one pass over the phases when every monitor is a child of the root (the usual step;
    else ``count_monitoring`` walks the tree). tests/records/test_span_rows.py compares
    these views with ``view_from_record``'s."""
    out: list[StepView] = []
    append = out.append
    for rec in recs:
        try:
            attrs, phases = rec[6], rec[9]  # C_ATTRS, C_PHASES
            if phases is None or attrs.get(_KIND_ATTR) == _ENVELOPE:
                view = view_from_record(rec, rank)
                if view is not None:
                    append(view)
                continue
            view = _new_view(StepView)
            view.is_step = True
            view.name = rec[0]
            view.trace_id = rec[1]
            view.root_span_id = root = rec[2]
            view.step = attrs.get(_STEP, -1)
            view.rank = rank
            view.loader = attrs.get(_LOADER)
            view.start_ns = start = rec[4]
            view.end_ns = end = rec[5]
            view.duration_ns = end - start if end > start else 0
            view.phases = phases
            view.operations = ops = []
            view.span = RowRoot(attrs)
            view.slow = view.slow_explained = view.envelope = False
            view.events = rec[8]  # C_EVENTS
            view.monitor_ns = total = 0
            for ph in phases:
                if ph[P_KIND] == _MONITOR:
                    if ph[P_PARENT_ID] != root:  # a nested monitor: walk the tree
                        view.operations = []
                        count_monitoring(view)
                        break
                    total += ph[P_DURATION]
                    ops.append((ph[P_NAME], ph[P_DURATION]))
            else:
                view.monitor_ns = total
            append(view)
        except Exception as exc:
            failed(exc)
    return out


def check_row(row: tuple[Any, ...]) -> None:
    """Refuse a row that could not be encoded (ValueError), before it can fail a batch."""
    if (type(row) is not tuple or len(row) != 14 or type(row[R_TRACE]) is not int
            or type(row[R_SPAN]) is not int or type(row[R_START]) is not int
            or type(row[R_END]) is not int or not isinstance(row[R_ATTRS], dict)):
        raise ValueError(f"not a span row: {row!r:.200}")


def record_span_count(rec: tuple[Any, ...]) -> int:
    """Spans of one record: the root and its phases."""
    return 1 + len(rec[C_PHASES] or ())


def phase_attributes(step: Any, phase: tuple[Any, ...]) -> dict[str, Any]:
    """A record phase's span attributes, in their order (extra attributes last, winning)."""
    ph_name, kind, loader = phase[P_NAME], phase[P_KIND], phase[P_LOADER]
    extra, device = phase[P_EXTRA], phase[P_DEVICE_SECONDS]
    attrs: dict[str, Any] = {_STEP: step, _PHASE: ph_name, _KIND_ATTR: kind}
    if loader is not None:
        attrs[_LOADER] = loader
    if device is not None:
        attrs[_DEVICE_DURATION] = device
    if extra:
        attrs.update(extra)
    return attrs


def phase_span_ids(phases: Sequence[tuple[Any, ...]], ids: dict[int, int] | None
                   ) -> list[int]:
    """The span ids of a record's phases: those user spans asked for, the rest drawn."""
    n = len(phases)
    if not ids and 0 < n < len(_ID_STRUCTS):
        # One draw for all (half the CPU): ``random`` fills a long draw 32 bits at a time,
        # least significant first, so these are the ids of n 64-bit draws, state included.
        drawn = list(_ID_STRUCTS[n].unpack(_getrandbits(64 * n).to_bytes(8 * n, "little")))
        return [i or 1 for i in drawn] if 0 in drawn else drawn
    rand = _getrandbits
    return [(ids and ids.get(i)) or rand(64) or 1 for i in range(n)]


_MANY_ID_STRUCTS = [struct.Struct(f"<{n}Q") for n in range(1025)]


def draw_span_ids(n: int) -> list[int]:
    """``n`` span ids from one draw: the ids of ``n`` draws of ``getrandbits(64) or 1``, the
    generator's state after them included (see :func:`phase_span_ids`)."""
    if n <= 0:
        return []
    if n >= len(_MANY_ID_STRUCTS):
        return [_getrandbits(64) or 1 for _ in range(n)]
    drawn = list(_MANY_ID_STRUCTS[n].unpack(_getrandbits(64 * n).to_bytes(8 * n, "little")))
    return [i or 1 for i in drawn] if 0 in drawn else drawn


def phase_end_order(phases: Sequence[tuple[Any, ...]]) -> Sequence[int]:
    """A record's phase indices in the order their spans ended (a nested phase ends
    before its parent; ties keep their order). Flat steps are in that order already."""
    for i in range(1, len(phases)):
        if phases[i][P_END] < phases[i - 1][P_END]:
            return sorted(range(len(phases)), key=lambda i: phases[i][P_END])
    return range(len(phases))


def rows_from_record(rec: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """A record's span rows, children in the order they ended, the root last.

    Pure: it runs in the training process (in-process export) or in the exporter process,
    and gives the same rows either way except for the phases' span ids, drawn here.
    """
    (name, trace_id, root_id, flags, start, end, attrs, status, events, phases, ids) = rec
    if phases is None:  # a monitoring operation between steps: one root span
        return [(name, trace_id, root_id, flags, 0, False, start, end, attrs, status, events,
                 INTERNAL_KIND, None, ())]
    step = attrs[_STEP]
    span_ids = phase_span_ids(phases, ids)
    rows = []
    for i in phase_end_order(phases):
        (ph_name, _kind, _loader, _duration, _ordinal, parent_ref, ph_start, ph_end,
         ph_status, ph_events, _extra, _device) = phases[i]
        ph_attrs = phase_attributes(step, phases[i])
        rows.append((ph_name, trace_id, span_ids[i], flags,
                     root_id if parent_ref == root_id else span_ids[parent_ref - 1], False,
                     ph_start, ph_end,
                     ph_attrs, ph_status, ph_events, INTERNAL_KIND, None, ()))
    rows.append((name, trace_id, root_id, flags, 0, False, start, end, attrs, status, events,
                 INTERNAL_KIND, None, ()))
    return rows


@functools.lru_cache(maxsize=256)
def row_scope(scope: tuple[Any, ...]) -> InstrumentationScope:
    """The InstrumentationScope of a user span row's ``(name, version, schema_url)``, one
    object per scope (the encoders' scope caches go by identity)."""
    return InstrumentationScope(*scope)


class RowSpanFactory:
    """Rows -> ``ReadableSpan``s, sharing one Resource, scope and run-constant attributes."""

    def __init__(self, resource: Resource, scope: InstrumentationScope,
                 run_constants: Mapping[str, Any]) -> None:
        self.resource = resource
        self.scope = scope
        self._base = dict(run_constants)

    @property
    def run_constants(self) -> dict[str, Any]:
        """The run's constant attributes, first in every otel-train span."""
        return self._base

    def span(self, row: tuple[Any, ...]) -> ReadableSpan:
        """One ``ReadableSpan`` from one row."""
        (name, trace_id, span_id, flags, parent_id, remote, start, end, attrs, status, events,
         kind, scope, links) = row
        trace_flags = TraceFlags(flags)
        if scope is None:  # otel-train's own span: the run's constants first
            full = dict(self._base)
            full.update(attrs)
            attrs = full
            span_scope = self.scope
        else:
            span_scope = row_scope(scope)
        return ReadableSpan(
            name=name, context=SpanContext(trace_id, span_id, False, trace_flags),
            parent=SpanContext(trace_id, parent_id, bool(remote), trace_flags)
            if parent_id else None,
            resource=self.resource, attributes=attrs,
            events=tuple(Event(n, a, timestamp=t) for n, t, a in events) if events else (),
            links=tuple(Link(SpanContext(t, s, True, TraceFlags(f)), a)
                        for t, s, f, a in links) if links else (),
            kind=SpanKind.INTERNAL if kind == INTERNAL_KIND else _KINDS.get(kind,
                                                                          SpanKind.INTERNAL),
            status=_UNSET if status is None else Status(_CODES.get(status[0], StatusCode.UNSET),
                                                        status[1]),
            start_time=start, end_time=end, instrumentation_scope=span_scope)

    def spans(self, rows: Sequence[tuple[Any, ...]]) -> list[ReadableSpan]:
        """``ReadableSpan``s of ``rows``, in order."""
        make = self.span
        return [make(r) for r in rows]


def row_from_span(span: ReadableSpan) -> tuple[Any, ...] | None:
    """The row of any SDK span (a user's span opened with the OTel API), or None if unusable.

    Attribute values are already OTel-valid (the SDK checked them); trace state is not
    carried (the exporter process re-creates the span with an empty one).
    """
    ctx = span.context
    if ctx is None:
        return None
    parent = span.parent
    scope = span.instrumentation_scope
    status = span.status
    return (
        span.name, ctx.trace_id, ctx.span_id, int(ctx.trace_flags),
        parent.span_id if parent is not None else 0,
        bool(parent.is_remote) if parent is not None else False,
        span.start_time or 0, span.end_time or span.start_time or 0,
        dict(span.attributes or {}),
        None if status is None or status.status_code is StatusCode.UNSET
        else (status.status_code.value, status.description),
        tuple((e.name, e.timestamp, dict(e.attributes or {})) for e in span.events),
        span.kind.value,
        (scope.name, scope.version, scope.schema_url) if scope is not None else ("", None, ""),
        tuple((lk.context.trace_id, lk.context.span_id, int(lk.context.trace_flags),
               dict(lk.attributes or {})) for lk in span.links),
    )
