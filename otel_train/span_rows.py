"""Span rows: a finished span as one flat tuple of plain values, the background's currency.

A ``ReadableSpan`` costs ~7 µs of GIL-holding CPU to make (its ``SpanContext``, ``Status``,
bounded attributes...) and pickles slowly. The span builder writes each span of a step as a
*row* instead: a tuple of ints, strings and plain dicts. Rows feed the derived metrics
directly (:func:`view_from_rows` makes the ``StepView`` the processors read, no assembling),
go down a pipe to the exporter process as ``marshal`` bytes (export_process.py), and become
``ReadableSpan``s only where an SDK component needs one (:class:`RowSpanFactory`), in the
exporter process or for an application's own span processors. One row, one span: the bytes
an exporter writes are the same whichever way the row went.

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

from collections.abc import Mapping, Sequence
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

from otel_train import attributes as A
from otel_train.otlp_encoding import run_attributes_type
from otel_train.steps_view import StepView, count_monitoring

(R_NAME, R_TRACE, R_SPAN, R_FLAGS, R_PARENT, R_REMOTE, R_START, R_END, R_ATTRS, R_STATUS,
 R_EVENTS, R_KIND, R_SCOPE, R_LINKS) = range(14)
INTERNAL_KIND = SpanKind.INTERNAL.value
_UNSET = Status(StatusCode.UNSET)
_KINDS = {k.value: k for k in SpanKind}
_CODES = {c.value: c for c in StatusCode}
_ROOT_NAME, _STEP, _KIND_ATTR, _LOADER = A.STEP_SPAN_NAME, A.STEP, A.PHASE_KIND, A.DATALOADER
_MONITOR, _PHASE = A.KIND_MONITOR, A.PHASE


class RowRoot:
    """Stands in for a step's root span in a ``StepView`` built from rows.

    Processors that mark the root (``train.slow``, GPU attributes, the sample reason) write
    through ``steps_view.set_span_attribute``, which updates this dict in place: the root
    row's own attributes, so the mark travels with the row to the exporter.
    """

    __slots__ = ("_attributes",)

    def __init__(self, attributes: dict[str, Any]) -> None:
        self._attributes = attributes


def view_from_rows(rows: Sequence[tuple[Any, ...]], rank: Any) -> StepView | None:
    """The ``StepView`` of one step's rows (root last), or of one monitoring operation."""
    if not rows:
        return None
    root = rows[-1]
    attrs = root[R_ATTRS]
    ctx = (root[R_TRACE], root[R_SPAN])
    start, end = root[R_START], root[R_END]
    if root[R_NAME] == _ROOT_NAME and _STEP in attrs:
        root_id = root[R_SPAN]
        phases = [(r[R_NAME], r[R_ATTRS].get(_KIND_ATTR), r[R_ATTRS].get(_LOADER),
                   r[R_END] - r[R_START] if r[R_END] > r[R_START] else 0, r[R_SPAN],
                   r[R_PARENT] or root_id)
                  for r in rows[:-1] if r[R_SCOPE] is None]
        view = StepView(True, root[R_NAME], RowRoot(attrs), ctx, attrs, start, end,  # type: ignore[arg-type]
                        phases)
        view.rank = rank
        if phases:
            count_monitoring(view)
        return view
    if attrs.get(_KIND_ATTR) != _MONITOR:
        return None
    view = StepView(False, attrs.get(_PHASE, root[R_NAME]), RowRoot(attrs), ctx,  # type: ignore[arg-type]
                    attrs, start, end, [])
    view.rank = rank
    view.operations.append((view.name, view.duration_ns))
    view.monitor_ns = view.duration_ns
    return view


def rows_kept_flags(rows: Sequence[tuple[Any, ...]]) -> bool:
    """True if the rows' trace is sampled (the SDK sampler's flag on every row)."""
    return bool(rows and rows[-1][R_FLAGS] & 1)


class RowSpanFactory:
    """Rows -> ``ReadableSpan``s, sharing one Resource, scope and run-constant attributes."""

    def __init__(self, resource: Resource, scope: InstrumentationScope,
                 run_constants: Mapping[str, Any]) -> None:
        self.resource = resource
        self.scope = scope
        self._base = dict(run_constants)
        self._attrs_type = run_attributes_type(self._base)
        self._scopes: dict[tuple[Any, ...], InstrumentationScope] = {}

    def span(self, row: tuple[Any, ...]) -> ReadableSpan:
        """One ``ReadableSpan`` from one row."""
        (name, trace_id, span_id, flags, parent_id, remote, start, end, attrs, status, events,
         kind, scope, links) = row
        trace_flags = TraceFlags(flags)
        if scope is None:
            full = self._attrs_type(self._base)  # run constants first: one cached block
            full.update(attrs)
            attrs = full
            span_scope = self.scope
        else:
            span_scope = self._scopes.get(scope)
            if span_scope is None:
                span_scope = self._scopes[scope] = InstrumentationScope(*scope)
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
