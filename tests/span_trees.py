"""Hand-built span trees that follow the attribute contract, with exact times (tests only).

Usage::

    from span_trees import step_spans, monitor_span

    spans = step_spans(7, [("forward", "train", 0, 80), ("inference", "monitor", 80, 100)],
                       duration_ms=100)
    for s in spans: processor.on_end(s)     # children first, root last
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, TraceFlags

from otel_train.common import attributes as A
from otel_train.common.identity import step_trace_id

MS = 1_000_000
BASE_NS = 1_700_000_000_000_000_000
RUN = "test-run"
# Made once: ReadableSpan() without a resource runs Resource.create() (detectors in a thread
# pool) on every span, which made long hand-built loops cost milliseconds per step.
RESOURCE = Resource.create({})

# A phase: (name, kind, start_ms, end_ms) with optional parent index and loader:
# (name, kind, start_ms, end_ms, parent_index, loader)
Phase = Sequence[Any]


def _ctx(trace_id: int) -> SpanContext:
    return SpanContext(trace_id, random.getrandbits(64) or 1, False, TraceFlags(1))


def step_spans(index: int, phases: Sequence[Phase], duration_ms: float, *,
               loader: str | None = "train", start_ms: float | None = None, rank: int = 0,
               attrs: dict[str, Any] | None = None) -> list[ReadableSpan]:
    """A step's spans, children in end order then the root; times relative to the step."""
    trace_id = step_trace_id(RUN, index)
    t0 = BASE_NS + int((index * 10_000 if start_ms is None else start_ms) * MS)
    root_ctx = _ctx(trace_id)
    base = {A.RUN_ID: RUN, A.STEP: index, A.RANK: rank, A.WORLD_SIZE: 1,
            A.DEVICE_SYNCED: True, A.DEVICE_TYPE: "cpu"}
    ctxs = [_ctx(trace_id) for _ in phases]
    children = []
    for i, ph in enumerate(phases):
        name, kind, s, e = ph[:4]
        parent_index = ph[4] if len(ph) > 4 and ph[4] is not None else -1
        ph_loader = ph[5] if len(ph) > 5 else loader
        a = dict(base)
        a[A.PHASE] = name
        a[A.PHASE_KIND] = kind
        if ph_loader is not None:
            a[A.DATALOADER] = ph_loader
        parent = ctxs[parent_index] if parent_index >= 0 else root_ctx
        children.append((t0 + int(e * MS), ReadableSpan(
            name=name, context=ctxs[i], parent=parent, attributes=a, resource=RESOURCE,
            start_time=t0 + int(s * MS), end_time=t0 + int(e * MS))))
    children.sort(key=lambda c: c[0])
    root_attrs = dict(base)
    if loader is not None:
        root_attrs[A.DATALOADER] = loader
    root_attrs[A.SLOW] = False
    root_attrs.update(attrs or {})
    root = ReadableSpan(name=A.STEP_SPAN_NAME, context=root_ctx, parent=None,
                        attributes=root_attrs, start_time=t0, resource=RESOURCE,
                        end_time=t0 + int(duration_ms * MS))
    return [c for _, c in children] + [root]


def monitor_span(name: str, after_step: int, duration_ms: float, *,
                 start_ms: float = 0.0, rank: int = 0) -> ReadableSpan:
    """Monitoring done between steps (run.monitor): a root span of kind monitor."""
    t0 = BASE_NS + int(start_ms * MS)
    attrs = {A.RUN_ID: RUN, A.STEP: after_step, A.RANK: rank, A.WORLD_SIZE: 1,
             A.PHASE: name, A.PHASE_KIND: A.KIND_MONITOR}
    return ReadableSpan(name=name, context=_ctx(random.getrandbits(128) or 1), parent=None,
                        attributes=attrs, start_time=t0, resource=RESOURCE,
                        end_time=t0 + int(duration_ms * MS))


def feed(processor: Any, spans: Sequence[ReadableSpan]) -> None:
    """on_end every span, in order."""
    for s in spans:
        processor.on_end(s)


def train_step(index: int, step_ms: float = 100.0, monitor_ms: float = 0.0,
               monitor: str = "inference") -> list[ReadableSpan]:
    """A step of forward/backward (and a monitor phase at its end when monitor_ms > 0)."""
    train_ms = step_ms - monitor_ms
    phases: list[Phase] = [("data", "train", 0, train_ms * 0.1),
                           ("forward", "train", train_ms * 0.1, train_ms * 0.5),
                           ("backward", "train", train_ms * 0.5, train_ms)]
    if monitor_ms:
        phases.append((monitor, "monitor", train_ms, step_ms))
    return step_spans(index, phases, step_ms)
