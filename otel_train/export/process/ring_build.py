"""The step ring's steps built into span records in the exporter process, a batch at a time,
with the counts the training process's own cost reads of them.

``ChildRingFeed`` (ring_feed.py) reads the ring in batches of up to 512 records; each run of
steps between two markers is built here in one call (``StepRecordBuilder.step_records``: the
same records as one ``record`` call a step, the root span ids drawn at once), and counted in
one pass: steps, spans of warm and of cold steps (``self_cost.is_cold_step``, what the
training process's ``SelfCostMeter`` would have counted), the last step's end. A step that
cannot be built is counted dropped (``build_error``) and settled at once; the others go on.

Usage::

    builds = RingRecordBuilds(builder, drops, settlement, warn)
    records = builds.build(ring_steps)     # in order, the failed ones left out
    builds.steps, builds.warm_spans, builds.cold_spans, builds.last_end_ns
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.common.self_cost import is_cold_step
from otel_train.records.span_rows import C_END, C_PHASES, C_START
from otel_train.records.step_records import StepRecordBuilder

__all__ = ["RingRecordBuilds"]


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
        warm = cold = 0
        last_end = self.last_end_ns
        if len(recs) == len(steps):  # none failed: each record is its step's
            for step, rec in zip(steps, recs):
                spans = 1 + len(rec[C_PHASES] or ())
                end = step.end_ns
                if is_cold_step(end - step.start_ns, spans):
                    cold += spans
                else:
                    warm += spans
                if end > last_end:
                    last_end = end
        else:  # a step failed: its record's own times (epoch ns, less the builder's offset)
            off = self.builder.offset_ns
            for rec in recs:
                spans = 1 + len(rec[C_PHASES] or ())
                start, end = rec[C_START] - off, rec[C_END] - off
                if is_cold_step(end - start, spans):
                    cold += spans
                else:
                    warm += spans
                if end > last_end:
                    last_end = end
        self.steps += len(recs)
        self.warm_spans += warm
        self.cold_spans += cold
        self.last_end_ns = last_end
        return recs

    def _failed(self, step: Any, exc: Exception) -> None:
        spans = step.span_count()
        self._drops.add("build_error", spans)
        self._settlement.stage_in += spans  # settled at once: counted dropped
        self._warn.warning("build", "otel-train: could not build spans: %r", exc)
