"""Communication and own work per rank: counters from each step's ``train.comm.*`` data.

Per step, from the root's ``train.comm`` events (one per collective op,
``records/comm_summary.py``) and attributes:

- ``otel_train_collectives_total``, ``otel_train_collective_bytes_total``,
  ``otel_train_collective_seconds_total`` {op, rank}: count, payload bytes, summed
  issue-to-completion seconds;
- ``otel_train_collective_exposed_seconds_total`` {rank}: the time steps waited for them;
- ``otel_train_own_work_seconds_total`` {rank}: every step's training time (monitoring
  excluded) minus that wait, also set on the root as ``train.own_work_seconds`` when the step
  ran collectives. Under DDP every rank's step lasts as long as the slowest rank's (the
  all-reduce waits for it), so durations cannot tell ranks apart; own work can, and the
  straggler rules compare it (deploy/promql.py ``straggler_ratio``).

Its families go on the run's registry next to the contract's others (``register_on``).

Usage::

    comm = CommMetricsSpanProcessor()
    comm.register_on(metrics.registry)
    shared = SharedStepSpanProcessor([..., comm])
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, Metric

from otel_train.common import attributes as A
from otel_train.common.sdk_private import SPAN_ATTRIBUTES_FIELD, span_attributes
from otel_train.records.steps_view import (
    StepView,
    StepViewProcessor,
    set_span_attribute,
)

_EXPOSED = A.COMM_EXPOSED_SECONDS
_NO_RANK = object()  # no rank seen yet (on_steps)


class CommMetricsSpanProcessor(StepViewProcessor):
    """Collective counters per op and rank, exposed wait and own work per rank."""

    state_fields = ("by_op", "exposed_seconds", "own_work_seconds")

    def __init__(self) -> None:
        super().__init__()
        # rank -> op -> [collectives, bytes, seconds]
        self.by_op: dict[str, dict[str, list[float]]] = {}
        self.exposed_seconds: dict[str, float] = {}
        self.own_work_seconds: dict[str, float] = {}

    def on_steps(self, views: Sequence[StepView],
                 failed: Callable[[StepViewProcessor, StepView, Exception], None]) -> None:
        """A frame of steps: a step that timed no collective (every step of a run without
        them) adds its training time to the rank's own work inline, the rank's label made
        once while it stays the same; the others go to ``on_step``."""
        own_work, on_step = self.own_work_seconds, self.on_step
        rank_obj: Any = _NO_RANK
        rank = ""
        for view in views:
            try:
                attrs = getattr(view.span, SPAN_ATTRIBUTES_FIELD, None)  # span_attributes, inline
                if not view.is_step or attrs.get(_EXPOSED) is not None:
                    on_step(view)
                    continue
                if view.rank is not rank_obj:
                    rank_obj, rank = view.rank, str(view.rank)
                own_work[rank] = own_work.get(rank, 0.0) + max(
                    0, view.duration_ns - view.monitor_ns) / 1e9
            except Exception as exc:
                failed(self, view, exc)

    def on_step(self, view: StepView) -> None:
        """Add the step's collectives and own work to the rank's counters."""
        if not view.is_step:
            return
        rank = str(view.rank)
        training_seconds = max(0, view.duration_ns - view.monitor_ns) / 1e9
        attrs = span_attributes(view.span)  # the root's dict
        waited = attrs.get(A.COMM_EXPOSED_SECONDS)
        if waited is None:  # no collective timed: own work is the training time
            self.own_work_seconds[rank] = self.own_work_seconds.get(rank, 0.0) + training_seconds
            return
        own = max(0.0, training_seconds - waited)
        set_span_attribute(view.span, A.OWN_WORK_SECONDS, own)
        self.own_work_seconds[rank] = self.own_work_seconds.get(rank, 0.0) + own
        self.exposed_seconds[rank] = self.exposed_seconds.get(rank, 0.0) + waited
        ops = self.by_op.setdefault(rank, {})
        for name, _at, ev in view.events:
            if name != A.COMM_EVENT:
                continue
            totals = ops.get(ev[A.COMM_OP])
            if totals is None:
                totals = ops[ev[A.COMM_OP]] = [0, 0, 0.0]
            totals[0] += ev[A.COMM_COUNT]
            totals[1] += ev[A.COMM_BYTES]
            totals[2] += ev[A.COMM_SECONDS]

    def register_on(self, registry: CollectorRegistry) -> None:
        """Serve these families on ``registry`` (the run's own)."""
        registry.register(_CommCollector(self))

    def collect(self) -> Iterator[Metric]:
        """The five families, consistent with each other (one lock)."""
        count = CounterMetricFamily(A.METRIC_COLLECTIVES, "Collectives the steps issued.",
                                    labels=["op", "rank"])
        nbytes = CounterMetricFamily(A.METRIC_COLLECTIVE_BYTES,
                                     "Payload bytes of the collectives.", labels=["op", "rank"])
        seconds = CounterMetricFamily(
            A.METRIC_COLLECTIVE_SECONDS,
            "Issue-to-completion seconds of the collectives (overlapped time included).",
            labels=["op", "rank"])
        exposed = CounterMetricFamily(
            A.METRIC_COLLECTIVE_EXPOSED_SECONDS,
            "Seconds steps waited for collectives (not overlapped with compute).",
            labels=["rank"])
        own = CounterMetricFamily(
            A.METRIC_OWN_WORK_SECONDS,
            "Training seconds of the steps minus the seconds they waited for collectives.",
            labels=["rank"])
        with self._lock:
            for rank, ops in self.by_op.items():
                for op, (n, b, s) in ops.items():
                    count.add_metric([op, rank], n)
                    nbytes.add_metric([op, rank], b)
                    seconds.add_metric([op, rank], s)
            for rank, value in self.exposed_seconds.items():
                exposed.add_metric([rank], value)
            for rank, value in self.own_work_seconds.items():
                own.add_metric([rank], value)
        return iter((count, nbytes, seconds, exposed, own))

    def export_state(self) -> dict[str, Any]:
        """The counters as plain data (copies: the caller may hand them to another thread)."""
        return {"by_op": {r: {op: list(v) for op, v in ops.items()}
                          for r, ops in self.by_op.items()},
                "exposed_seconds": dict(self.exposed_seconds),
                "own_work_seconds": dict(self.own_work_seconds)}


class _CommCollector:
    """Adapter: the registry asks it; it asks ``CommMetricsSpanProcessor``."""

    def __init__(self, comm: CommMetricsSpanProcessor) -> None:
        self._comm = comm

    def collect(self) -> Iterator[Metric]:
        """Every family, at scrape time."""
        return self._comm.collect()
