"""Bounded series: the step and phase histograms without the ``rank`` label.

With ``metrics_rank_label="gauges"`` the Prometheus endpoint serves
``otel_train_step_duration_seconds`` and ``otel_train_phase_duration_seconds`` without
``rank`` (samples that differ only by rank are added together; otlp_metrics.py records the
pushed histograms without it too); the per-rank counters and
gauges (``otel_train_steps_total``, ``otel_train_slow_steps_total``, the progress gauges,
``otel_train_run_info``, ...) keep it, and the straggler rules take a histogram's rank from
``otel_train_steps_total`` of the same target (deploy/promql.py). Where this bounds the
series a job stores, and the recording rules that do it in Prometheus: docs/scaling.md.

Usage::

    families = [without_rank(f) for f in families]   # at scrape time
"""

from __future__ import annotations

from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

RANK_LABEL = "rank"


def without_rank(family: Metric) -> Metric:
    """A histogram family with ``rank`` dropped (other families as they are)."""
    if family.type != "histogram":
        return family
    merged: dict[tuple[str, tuple[tuple[str, str], ...]], list[Any]] = {}
    for s in family.samples:
        labels = tuple((k, v) for k, v in s.labels.items() if k != RANK_LABEL)
        seen = merged.get((s.name, labels))
        if seen is None:
            merged[(s.name, labels)] = [s.value, s.exemplar]
        else:
            seen[0] += s.value
    out = Metric(family.name, family.documentation, family.type, family.unit)
    out.samples = [Sample(name, dict(labels), value, None, exemplar)
                   for (name, labels), (value, exemplar) in merged.items()]
    return out
