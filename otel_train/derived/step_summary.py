"""Summary mode: one ``train.summary`` span per interval instead of each step's spans.

With ``span_mode="summary"`` the tail sampler (sampling.py) hands every step's span record to
a ``StepSummary`` before it decides, and exports only the steps that matter (slow, failed,
stalled, truncated). Every ``summary_every_steps`` steps, or once ``summary_every_seconds``
have passed since the interval began, the summary becomes one span record without phases
(one root span, exported like a monitoring operation's) carrying, for the whole step and for
each phase name, count / sum / min / max / p50 / p99 in seconds, the step range, and the
numbers of the slow and failed steps (exported in full beside it). Percentiles are exact
(nearest rank) over the interval's durations, which ``summary_every_steps`` bounds.

Attribute names (common/attributes.py, docs/telemetry.md)::

    train.summary.step.first / .last, train.summary.steps
    train.summary.step.{count,sum_seconds,min_seconds,max_seconds,p50_seconds,p99_seconds}
    train.summary.phase.<phase>.{count,sum_seconds,...}
    train.summary.slow_steps, train.summary.failed_steps

Usage::

    summary = StepSummary(every_steps=100, every_seconds=60.0)
    summary.add(rec, reason)          # each step's record, with the sampler's reason or None
    records = summary.take_ready()    # finished intervals' summary records
    records = summary.take_all()      # at the end: the partial interval too
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

from otel_train.common import attributes as A
from otel_train.records.span_rows import C_ATTRS, C_END, C_PHASES, C_START, P_DURATION, P_NAME

_STATS = ("count", "sum_seconds", "min_seconds", "max_seconds", "p50_seconds", "p99_seconds")
MAX_LISTED_STEPS = 100  # slow / failed step numbers per summary (the count is in the steps)
_FAILED_REASONS = ("error", A.SAMPLE_REASON_STALL, A.SAMPLE_REASON_TRUNCATED)


def nearest_rank(sorted_values: list[int], q: float) -> int:
    """The q-quantile of sorted values by nearest rank (an observed value)."""
    n = len(sorted_values)
    return sorted_values[min(n - 1, max(0, math.ceil(q * n) - 1))]


def duration_stats(prefix: str, durations_ns: list[int]) -> dict[str, Any]:
    """count / sum / min / max / p50 / p99 (seconds) of durations, as attributes."""
    values = sorted(durations_ns)
    figures = (len(values), sum(values) / 1e9, values[0] / 1e9, values[-1] / 1e9,
               nearest_rank(values, 0.5) / 1e9, nearest_rank(values, 0.99) / 1e9)
    return {prefix + name: value for name, value in zip(_STATS, figures)}


class StepSummary:
    """Accumulates step records into summary span records, an interval at a time."""

    def __init__(self, every_steps: int, every_seconds: float) -> None:
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.summaries = 0
        self._ready: list[tuple[Any, ...]] = []
        self._reset()

    def _reset(self) -> None:
        self._steps: list[int] = []
        self._step_ns: list[int] = []
        self._phase_ns: dict[str, list[int]] = {}
        self._slow: list[int] = []
        self._failed: list[int] = []
        self._start_ns = 0
        self._end_ns = 0
        self._began = time.monotonic()

    def add(self, rec: tuple[Any, ...], reason: str | None) -> None:
        """One step's record (monitoring between steps is not summarized)."""
        phases = rec[C_PHASES]
        if phases is None:
            return
        attrs = rec[C_ATTRS]
        if not self._steps:
            self._start_ns = rec[C_START]
            self._began = time.monotonic()
        self._end_ns = max(self._end_ns, rec[C_END])
        step = attrs.get(A.STEP, -1)
        self._steps.append(step)
        self._step_ns.append(rec[C_END] - rec[C_START])
        by_name = self._phase_ns
        for phase in phases:
            by_name.setdefault(phase[P_NAME], []).append(phase[P_DURATION])
        if reason == "slow" or attrs.get(A.SLOW):
            if len(self._slow) < MAX_LISTED_STEPS:
                self._slow.append(step)
        elif reason in _FAILED_REASONS and len(self._failed) < MAX_LISTED_STEPS:
            self._failed.append(step)
        if (len(self._steps) >= self.every_steps
                or time.monotonic() - self._began >= self.every_seconds):
            self._close()

    def _close(self) -> None:
        """The interval so far becomes a summary record (nothing when it is empty)."""
        if not self._steps:
            return
        attrs: dict[str, Any] = {
            A.SUMMARY_STEP_FIRST: min(self._steps), A.SUMMARY_STEP_LAST: max(self._steps),
            A.SUMMARY_STEPS: len(self._steps)}
        attrs.update(duration_stats(A.SUMMARY_STEP_PREFIX, self._step_ns))
        for name, durations in self._phase_ns.items():
            attrs.update(duration_stats(f"{A.SUMMARY_PHASE_PREFIX}{name}.", durations))
        attrs[A.SUMMARY_SLOW_STEPS] = list(self._slow)
        attrs[A.SUMMARY_FAILED_STEPS] = list(self._failed)
        # A record without phases: one root span of its own trace (span_rows.rows_from_record).
        self._ready.append((A.SUMMARY_SPAN_NAME, random.getrandbits(128) or 1,
                            random.getrandbits(64) or 1, 1, self._start_ns, self._end_ns,
                            attrs, None, (), None, None))
        self.summaries += 1
        self._reset()

    def take_ready(self) -> list[tuple[Any, ...]]:
        """Summary records of the intervals closed so far, no longer held."""
        ready, self._ready = self._ready, []
        return ready

    def take_all(self) -> list[tuple[Any, ...]]:
        """At the end of the run: the partial interval closed too."""
        self._close()
        return self.take_ready()
