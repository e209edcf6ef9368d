"""The step ring's steps built into span records in the exporter process, a batch at a time,
with the counts the training process's own cost reads of them.

``ChildRingFeed`` (ring_feed.py) reads the ring in batches of up to 512 records; each run of
steps between two markers is built here in one call (``StepRecordBuilder.step_records``: the
same records as one ``record`` call a step, the root span ids drawn at once), and counted in
one pass over its records (``span_counts``, in C where the accelerator was built): steps,
spans of warm and of cold steps (``self_cost.is_cold_step``, what the training process's
``SelfCostMeter`` would have counted), the last step's end. A step that cannot be built is
counted dropped (``build_error``) and settled at once; the others go on.

Usage::

    builds = RingRecordBuilds(builder, drops, settlement, warn)
    records = builds.build(ring_steps)     # in order, the failed ones left out
    builds.steps, builds.warm_spans, builds.cold_spans, builds.last_end_ns
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.common.self_cost import COLD_STEP_NS_PER_SPAN, is_cold_step
from otel_train.recording.recorder import _recorder_c
from otel_train.records.span_rows import C_END, C_PHASES, C_START
from otel_train.records.step_records import StepRecordBuilder

__all__ = ["RingRecordBuilds", "span_counts"]

# The counts in C where the accelerator was built (``_recorder_c.ring_span_counts``), else
# (or for a record it does not read exactly) ``span_counts``, its twin.
_C_SPAN_COUNTS: Any = getattr(_recorder_c, "ring_span_counts", None)


def span_counts(recs: Sequence[tuple[Any, ...]], offset_ns: int, last_end_ns: int
                ) -> tuple[int, int, int]:
    """(spans of warm steps, spans of cold steps, the latest end) of step records built with
    an offset of ``offset_ns``, the end from ``last_end_ns`` on: each record's spans (root and
    phases) as ``is_cold_step`` charges its wall time, its own times less the offset."""
    warm = cold = 0
    for rec in recs:
        spans = 1 + len(rec[C_PHASES] or ())
        start, end = rec[C_START] - offset_ns, rec[C_END] - offset_ns
        if is_cold_step(end - start, spans):
            cold += spans
        else:
            warm += spans
        if end > last_end_ns:
            last_end_ns = end
    return warm, cold, last_end_ns


class RingRecordBuilds:
    """Builds the ring's steps and counts them (see the module docstring)."""

    def __init__(self, builder: StepRecordBuilder, drops: Any, settlement: Any,
                 warn: RateLimitedLogger) -> None:
        self.builder = builder
        self._drops = drops
        self._settlement = settlement
        self._warn = warn
        self.steps = 0
        self.warm_spans = 0
        self.cold_spans = 0
        self.last_end_ns = 0

    def build(self, steps: Sequence[Any]) -> list[tuple[Any, ...]]:
        """The records of ``steps`` (ring steps), in order; a step that fails is counted
        dropped and left out."""
        recs = self.builder.step_records(steps, self._failed)
        counts = _C_SPAN_COUNTS(recs, self.builder.offset_ns, COLD_STEP_NS_PER_SPAN,
                                self.last_end_ns) if _C_SPAN_COUNTS is not None else None
        if counts is None:  # no accelerator, or a number past int64: the twin
            counts = span_counts(recs, self.builder.offset_ns, self.last_end_ns)
        warm, cold, self.last_end_ns = counts
        self.steps += len(recs)
        self.warm_spans += warm
        self.cold_spans += cold
        return recs

    def _failed(self, step: Any, exc: Exception) -> None:
        spans = step.span_count()
        self._drops.add("build_error", spans)
        self._settlement.stage_in += spans  # settled at once: counted dropped
        self._warn.warning("build", "otel-train: could not build spans: %r", exc)
