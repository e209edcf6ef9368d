"""A finished profile capture, written: the trace file, its sidecar, and one span per step.

Runs on a background thread once the profiler has stopped (``profile_capture.py``):

- ``profiles/step-<first>-<last>.json``: the Chrome/Perfetto trace ``torch.profiler``
  writes, with each step's index, trace id and root span id under the ``otel_train``
  metadata key; each step is a ``otel_train.step#<index>`` range in it;
- ``profiles/step-<first>-<last>.steps.json``: the same ids and each step's top operators,
  for readers that do not parse traces;
- per step, a ``train.profile`` span, child of the step's root span (same trace), carrying
  ``train.profile.file`` and one ``train.profile.op`` event per top operator (name, self
  time, device self time when CUDA was profiled, calls).

Child spans, not events on the step's own span: the step has been exported by the time its
profile is parsed (the profiler can only be read once stopped), and a span record is never
changed after it leaves; a child span joins the step's trace whenever it arrives, costs one
span per profiled step, and nothing on the steps that are not profiled.
"""

from __future__ import annotations

import json
import logging
import os
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter_ns, time_ns
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from otel_train.common import attributes as A

_log = logging.getLogger("otel_train")
TOP_OPS_PER_STEP = 10
_RANGE_PREFIX = "otel_train.step#"


@dataclass
class CapturedStep:
    """One profiled step: its ids, the live Step (for its times), its top operators."""

    index: int
    trace_id: int
    root_id: int
    step: Any = None
    ops: list[tuple[str, float, float, int]] = field(default_factory=list)


def write_capture(prof: Any, steps: list[CapturedStep], path: Path, trigger: str,
                  run_dir: Path, emit: Callable[[list[CapturedStep], str, str], None] | None
                  ) -> None:
    """Write the trace and its sidecar, then emit the steps' profile spans; never raises."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        prof.export_chrome_trace(str(tmp))
        os.replace(tmp, path)
        attribute_top_ops(prof.events(), steps)
        rel = os.path.relpath(path, run_dir)
        sidecar = {"trace": path.name, "trigger": trigger, "steps": [
            {"step": s.index, "trace_id": f"{s.trace_id:032x}", "span_id": f"{s.root_id:016x}",
             "top_ops": [{"name": n, "self_seconds": c, "device_self_seconds": d, "calls": k}
                         for n, c, d, k in s.ops]} for s in steps]}
        path.with_name(path.stem + ".steps.json").write_text(json.dumps(sidecar, indent=1))
        if emit is not None:
            emit(steps, rel, trigger)
        _log.info("otel-train: profile of steps %d-%d written to %s", steps[0].index,
                  steps[-1].index, path)
    except Exception as exc:  # a background thread: log, never raise
        _log.warning("otel-train: could not write the profile %s: %r", path, exc)


def attribute_top_ops(events: Any, steps: list[CapturedStep]) -> None:
    """Each step's top operators by self time, from the profiler's events (µs), by start.

    An operator belongs to the step whose ``otel_train.step#<index>`` range its start falls
    in, whichever thread ran it (autograd's threads included).
    """
    ranges = sorted((e.time_range.start, e.time_range.end, int(e.name[len(_RANGE_PREFIX):]))
                    for e in events if e.name.startswith(_RANGE_PREFIX))
    starts = [r[0] for r in ranges]
    totals: dict[int, dict[str, list[float]]] = {}
    for e in events:
        if e.name.startswith(_RANGE_PREFIX) or e.name.startswith("ProfilerStep"):
            continue
        i = bisect_right(starts, e.time_range.start) - 1
        if i < 0 or e.time_range.start > ranges[i][1]:
            continue
        cpu = float(e.self_cpu_time_total)
        dev = float(getattr(e, "self_device_time_total", 0.0) or 0.0)
        op_totals = totals.setdefault(ranges[i][2], {}).setdefault(e.name, [0.0, 0.0, 0])
        op_totals[0] += cpu
        op_totals[1] += dev
        op_totals[2] += 1
    for s in steps:
        ops = totals.get(s.index, {})
        top = sorted(ops.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:TOP_OPS_PER_STEP]
        s.ops = [(name, v[0] / 1e6, v[1] / 1e6, int(v[2])) for name, v in top]


def span_emitter(provider: Any, is_sampled: Callable[[int], bool]
                 ) -> Callable[[list[CapturedStep], str, str], None]:
    """Emit each step's ``train.profile`` span through ``provider`` (the run's SDK one)."""
    tracer = provider.get_tracer(A.INSTRUMENTATION_SCOPE)
    offset = time_ns() - perf_counter_ns()

    def emit(steps: list[CapturedStep], rel_path: str, trigger: str) -> None:
        for s in steps:
            flags = TraceFlags(TraceFlags.SAMPLED if is_sampled(s.trace_id) else 0)
            parent = NonRecordingSpan(SpanContext(s.trace_id, s.root_id, False, flags))
            start = (s.step.start_ns if s.step is not None else perf_counter_ns()) + offset
            end = ((s.step.end_ns if s.step is not None else 0) or perf_counter_ns()) + offset
            span = tracer.start_span(
                A.PROFILE_SPAN_NAME, context=trace_api.set_span_in_context(parent),
                start_time=start, attributes={A.STEP: s.index, A.PROFILE_FILE: rel_path,
                                              A.PROFILE_TRIGGER: trigger})
            for name, cpu, dev, calls in s.ops:
                attrs: dict[str, Any] = {A.PROFILE_OP_NAME: name,
                                         A.PROFILE_OP_SELF_SECONDS: cpu,
                                         A.PROFILE_OP_CALLS: calls}
                if dev:
                    attrs[A.PROFILE_OP_DEVICE_SECONDS] = dev
                span.add_event(A.PROFILE_OP_EVENT, attrs, timestamp=start)
            span.end(end_time=max(start, end))
    return emit
