"""Sampling that keeps what matters: a tail decision per step, consistent across ranks.

At 1,000 ranks x 10 steps/s a fleet emits 70,000 spans/s. ``StepTailSampler`` sits between
the derived-metrics processors (which still see every step) and the export stage. It holds a
step's spans until its root ``train.step`` arrives — the library has the whole step before
anything is exported — then keeps the step when any of these holds:

- ``ratio``: the step's trace id passes the ``traceidratio`` rule of the OpenTelemetry SDK
  (the low 64 bits below ``ratio * 2**64``). Trace ids are derived from (run id, step)
  (identity.step_trace_id), so every rank keeps the same ordinary steps and a kept step's
  trace shows all ranks;
- ``slow``: the slow-step processor marked it (``train.slow``);
- ``error``: the step or one of its phases failed;
- ``truncated`` / ``stall``: the step was cut off at the end of the run, or the watchdog
  wrote its stacks while it stalled (a ``train.stall`` event);
- ``monitor``: it ran monitoring (a phase of kind ``monitor``), or it is monitoring done
  between steps;
- ``first``: it is among the first ``keep_first_steps`` steps (start-up, compilation).

On a rank that sends no ordinary steps (``export_ranks``, common/export_ranks.py) or sends
summaries instead (``span_mode="summary"``, step_summary.py) the sampler runs with ratio 0
and neither first nor monitoring steps: only slow, failed, truncated and stalled steps
leave the rank (``build_step_sampler``); in summary mode every record is summarized first.

The reason is written on the kept root as ``train.sample.reason``. Spans not exported because
of sampling are counted as sampled out (``otel_train_spans_sampled_out_total``), never as
drops: they don't alarm. A trace whose root never comes is exported when evicted (fail open).

With the exporter process (export/process/child.py) the decision runs there, after the
derived metrics (derived/chain.py builds the sampler with the chain): ``filter_frame`` takes each
frame's span records and user span rows, and the counts come back with the chain's state.

Usage::

    ratio = resolve_sample_ratio(options)              # pipeline/plan.py: option, else
                                                       # OTEL_TRACES_SAMPLER(_ARG)
    sampler = StepTailSampler(ratio, keep_first_steps=10, downstream=export_processor)
    worker sinks: [*derived_metrics_processors, sampler]
    recs, rows = sampler.filter_frame(recs, rows)      # in the exporter process
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.trace import StatusCode
from prometheus_client.metrics_core import CounterMetricFamily, Metric

from otel_train.common import attributes as A
from otel_train.records.span_rows import (
    C_ATTRS,
    C_EVENTS,
    C_FLAGS,
    C_PHASES,
    C_STATUS,
    C_TRACE,
    P_KIND,
    P_STATUS,
    R_ATTRS,
    R_NAME,
    R_PARENT,
    R_REMOTE,
    R_STATUS,
    R_TRACE,
    record_span_count,
)
from otel_train.derived.stall_stacks import STALL_EVENT
from otel_train.derived.step_summary import StepSummary
from otel_train.records.steps_view import set_span_attribute

_log = logging.getLogger("otel_train")

SAMPLE_REASON = "train.sample.reason"  # on kept roots: ratio | slow | error | monitor | first
METRIC_SPANS_SAMPLED_OUT = "otel_train_spans_sampled_out_total"
_TRACE_ID_LOW_64 = TraceIdRatioBased.TRACE_ID_LIMIT
_ERROR = StatusCode.ERROR


def build_step_sampler(settings: dict[str, Any],
                       downstream: SpanProcessor | None = None) -> StepTailSampler | None:
    """The chain's tail sampler from its settings; None: every step is exported. Kept user
    spans go on to ``downstream`` (the exporter process's client), if any.

    A rank that sends no ordinary steps (export_ranks) or sends summaries instead keeps
    ratio 0 and no first or monitoring steps: only slow, failed, stalled and truncated steps
    (and, in summary mode, the summaries) leave it.
    """
    s = settings
    routine = s.get("export_routine", True)
    if routine and not s.get("summary"):
        if s.get("sample_ratio") is None:
            return None
        return StepTailSampler(s["sample_ratio"], s["sample_keep_first_steps"], downstream)
    summary = (StepSummary(s["summary_every_steps"], s["summary_every_seconds"])
               if s.get("summary") else None)
    return StepTailSampler(0.0, 0, downstream, keep_monitor=False, summary=summary)


# Decisions remembered for user span rows that come after their step's record: a drain of
# the training process (0.5 s at most) of steps as fast as 0.1 ms is 5000 steps.
_DECIDED_TRACES = 8192

class StepTailSampler(SpanProcessor):
    """Holds each step's spans until its root; forwards kept steps to ``downstream``."""

    def __init__(self, ratio: float, keep_first_steps: int = 10,
                 downstream: SpanProcessor | None = None,
                 max_pending_traces: int = 256, keep_monitor: bool = True,
                 summary: StepSummary | None = None) -> None:
        self.ratio = ratio
        # False on a rank that sends no ordinary steps (export_ranks, summary mode): only
        # slow, failed, stalled and truncated steps leave it.
        self.keep_monitor = keep_monitor
        self.summary = summary  # summary mode: every step's record is summarized first
        self._bound = TraceIdRatioBased.get_bound_for_rate(ratio)
        self.keep_first_steps = keep_first_steps
        self.downstream = downstream
        self._max_pending = max_pending_traces
        # trace id -> spans waiting for their root. Steps' spans come from the build worker,
        # user spans from the training thread: one lock.
        self._pending: dict[int, list[ReadableSpan]] = {}
        # trace id -> kept? of the last steps decided from records: a user span row that
        # comes after its step was decided (the exporter process builds ring steps as they
        # end, the rows come with the training process's drains) follows that decision.
        self._decided: dict[int, bool] = {}
        self._lock = threading.Lock()
        self.kept_steps = 0
        self.sampled_out_steps = 0
        self.sampled_out_spans = 0
        self.evicted_traces = 0

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Nothing to do at start."""

    def on_end(self, span: ReadableSpan) -> None:
        """Hold a child; decide on a root; never raises into the caller."""
        try:
            ctx = span.context
            if ctx is None:
                return
            trace_id = ctx.trace_id
            parent = span.parent
            if parent is not None and not parent.is_remote:
                # fail open: a trace evicted without its root is still exported
                self._forward(self._hold(trace_id, span))
                return
            held, reason = self._root(span.name, span.attributes or {}, trace_id, span)
            if reason is None:
                return
            if span.name == A.STEP_SPAN_NAME:
                set_span_attribute(span, SAMPLE_REASON, reason)
            self._forward(held)
        except Exception as exc:  # the export stage must never break the build worker
            _log.debug("otel-train: tail sampler failed: %r", exc)

    def _hold(self, trace_id: int, span: Any) -> list[Any]:
        """Hold a span (or row) for its trace; returns the trace evicted to make room."""
        evicted: list[Any] = []
        with self._lock:
            held = self._pending.get(trace_id)
            if held is None:
                if len(self._pending) >= self._max_pending:
                    oldest = next(iter(self._pending))
                    evicted = self._pending.pop(oldest)
                    self.evicted_traces += 1
                held = self._pending[trace_id] = []
            held.append(span)
        return evicted

    def _root(self, name: str, attrs: Any, trace_id: int, root: Any
              ) -> tuple[list[Any], str | None]:
        """A root span (or row) of its own trace, with what was held for it: the trace's
        spans and why they are kept (None: counted as sampled out)."""
        held = self._take_held(trace_id)
        held.append(root)
        reason = self._decide(
            name == A.STEP_SPAN_NAME, attrs, trace_id,
            failed=lambda: any(_failed(s) for s in held),
            monitored=lambda: any(_kind(s) == A.KIND_MONITOR for s in held),
            stalled=lambda: any(e.name == STALL_EVENT for e in getattr(root, "events", ())))
        self._tally(reason, len(held))
        return held, reason

    def _tally(self, reason: str | None, spans: int) -> bool:
        """Count a decision: kept, or sampled out with its ``spans``."""
        if reason is None:
            self.sampled_out_steps += 1
            self.sampled_out_spans += spans
            return False
        self.kept_steps += 1
        return True

    def _decide(self, is_step: bool, attrs: Any, trace_id: int, failed: Any,
                monitored: Any, stalled: Any) -> str | None:
        """Why a trace is kept, or None: the one rule of both paths. ``failed``,
        ``monitored`` and ``stalled`` are asked only when the cheaper tests before them did
        not decide."""
        if attrs.get(A.PHASE_KIND) == A.KIND_ENVELOPE:
            return "envelope"  # the job's start-up: one span per run, always kept
        if not is_step:
            # Monitoring between steps, or a user's own root span: monitoring is kept (where
            # this rank sends routine spans); anything else follows the ratio.
            if self.keep_monitor and attrs.get(A.PHASE_KIND) == A.KIND_MONITOR:
                return "monitor"
            return "ratio" if self._by_ratio(trace_id) else None
        if attrs.get(A.SLOW):
            return "slow"
        if failed():
            return "error"
        if attrs.get(A.TRUNCATED):
            return A.SAMPLE_REASON_TRUNCATED
        if stalled():
            return A.SAMPLE_REASON_STALL
        if self.keep_monitor and monitored():
            return "monitor"
        step = attrs.get(A.STEP)
        if isinstance(step, int) and step < self.keep_first_steps:
            return "first"
        if self._by_ratio(trace_id):
            return "ratio"
        return None

    def keep_record(self, rec: tuple[Any, ...]) -> bool:
        """Row path (span_rows.py): decide on one step's span record, after the derived
        metrics; write the reason on the kept root, forward the user spans held for its
        trace; count what is left out. Never raises."""
        try:
            held = self._kept_with(rec)
            if held is None:
                return False
            self._forward(held)
            return True
        except Exception as exc:  # the export stage must never break the build worker
            _log.debug("otel-train: tail sampler failed: %r", exc)
            return True

    def _take_held(self, trace_id: int) -> list[Any]:
        """What was held for a trace (spans or rows), no longer held."""
        with self._lock:
            return self._pending.pop(trace_id, None) or []

    def _kept_with(self, rec: tuple[Any, ...]) -> list[Any] | None:
        """Decide on a span record: what was held for its trace when it is kept (None:
        sampled out, counted)."""
        held = self._take_held(rec[C_TRACE])
        kept = self._keep(rec, held)
        decided = self._decided
        decided[rec[C_TRACE]] = kept
        if len(decided) > _DECIDED_TRACES:
            del decided[next(iter(decided))]  # the oldest decision
        return held if kept else None

    def _keep(self, rec: tuple[Any, ...], held: list[Any]) -> bool:
        """Decide on a span record and what was held for its trace (spans or rows); write
        the reason on a kept step's root, count what is left out."""
        phases = rec[C_PHASES]
        reason = self._decide(
            phases is not None, rec[C_ATTRS], rec[C_TRACE],
            failed=lambda: (rec[C_STATUS] is not None
                            or any(ph[P_STATUS] is not None for ph in phases)
                            or any(_failed(s) for s in held)),
            monitored=lambda: any(ph[P_KIND] == A.KIND_MONITOR for ph in phases),
            stalled=lambda: any(e[0] == STALL_EVENT for e in rec[C_EVENTS] or ()))
        if self.summary is not None:
            self.summary.add(rec, reason)
        if not self._tally(reason, record_span_count(rec) + len(held)):
            return False
        if phases is not None:
            rec[C_ATTRS][SAMPLE_REASON] = reason
        return True

    # -- the exporter process's path: span records and user span rows (derived/chain.py) --
    def filter_frame(self, recs: list[tuple[Any, ...]], rows: list[tuple[Any, ...]]
                     ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """One frame's records (after the derived metrics marked them) and user span rows:
        what to export. A user span inside a step waits for its step's record and goes
        with it; a user root span is decided on its own. Rows come before the records of
        their frame: a step's user spans end before the step does. Never raises."""
        out_rows: list[tuple[Any, ...]] = []
        try:
            decided = self._decided
            for row in rows:
                if row[R_PARENT] and not row[R_REMOTE]:
                    kept = decided.get(row[R_TRACE])
                    if kept is None:  # its step is still to come: wait for it
                        out_rows.extend(self._hold(row[R_TRACE], row))  # evicted: fail open
                    elif kept:
                        out_rows.append(row)
                    else:
                        self.sampled_out_spans += 1
                    continue
                held, reason = self._root(row[R_NAME], row[R_ATTRS], row[R_TRACE], row)
                if reason is not None:
                    out_rows.extend(held)
            kept = []
            for rec in recs:
                if not rec[C_FLAGS] & 1:
                    continue
                held = self._kept_with(rec)
                if held is not None:
                    kept.append(rec)
                    out_rows.extend(held)
            kept.extend(self.take_summaries())
            return kept, out_rows
        except Exception as exc:  # fail open: the frame as it came, and what was released
            _log.debug("otel-train: tail sampler failed: %r", exc)
            here = {id(row) for row in rows}
            return recs, rows + [row for row in out_rows if id(row) not in here]

    def take_summaries(self, final: bool = False) -> list[tuple[Any, ...]]:
        """Summary mode: the summary records ready to export (``final``: the partial
        interval too, at the end of the run); [] otherwise. Never raises."""
        if self.summary is None:
            return []
        try:
            return self.summary.take_all() if final else self.summary.take_ready()
        except Exception as exc:  # the export stage must never break the build worker
            _log.debug("otel-train: step summary failed: %r", exc)
            return []

    def release_held(self) -> list[Any]:
        """What still waits for a root, to export at the end (fail open)."""
        with self._lock:
            left = [item for held in self._pending.values() for item in held]
            self._pending.clear()
        return left

    def export_state(self) -> dict[str, Any]:
        """The counts, as plain data (the training process's copy serves them)."""
        return {"kept_steps": self.kept_steps, "sampled_out_steps": self.sampled_out_steps,
                "sampled_out_spans": self.sampled_out_spans,
                "evicted_traces": self.evicted_traces}

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from ``export_state``'s counts."""
        for name in ("kept_steps", "sampled_out_steps", "sampled_out_spans", "evicted_traces"):
            if name in state:
                setattr(self, name, state[name])

    def _by_ratio(self, trace_id: int) -> bool:
        return trace_id & _TRACE_ID_LOW_64 < self._bound

    def _forward(self, spans: list[ReadableSpan]) -> None:
        target = self.downstream
        if target is None:
            return
        for s in spans:
            target.on_end(s)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Spans still waiting for a root stay held (their step is not finished)."""
        return True

    def shutdown(self) -> None:
        """Export what still waits for a root (fail open)."""
        self._forward(self.release_held())


def _failed(span: Any) -> bool:
    """A held span (or span row) that failed."""
    if type(span) is tuple:
        status = span[R_STATUS]
        return status is not None and status[0] == _ERROR.value
    return span.status.status_code is _ERROR


def _kind(span: Any) -> Any:
    """A held span's (or span row's) phase kind, if it has one."""
    attrs = span[R_ATTRS] if type(span) is tuple else span.attributes
    return (attrs or {}).get(A.PHASE_KIND)


class SampledOutCollector:
    """Prometheus collector: ``otel_train_spans_sampled_out_total`` (not a drop)."""

    def __init__(self, sampler: StepTailSampler, rank: Any) -> None:
        self._sampler = sampler
        self._rank = str(rank)

    def collect(self) -> Iterator[Metric]:
        """One counter family, read from the sampler."""
        fam = CounterMetricFamily(
            METRIC_SPANS_SAMPLED_OUT, "Spans not exported because sampling left their step "
            "out (not dropped: every step still feeds the metrics).", labels=["rank"])
        fam.add_metric([self._rank], self._sampler.sampled_out_spans)
        yield fam
