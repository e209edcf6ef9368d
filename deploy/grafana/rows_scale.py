"""The dashboard's "Per job, all ranks" row: the bounded per-job recording rules
(``otel_train:*_by_job``, deploy/prometheus/rules_gen.py ``job_rules``), whose series do not
grow with the number of ranks (docs/scaling.md, "Bounded series").

Usage (dashboards_gen.py)::

    d = add_job_row(d, ids, series=series, single=single, q=q, db=db)
"""

from __future__ import annotations

from typing import Any

JOB = 'job=~"$job"'


def add_job_row(d: Any, ids: Any, *, series: Any, single: Any, q: Any, db: Any) -> Any:
    """Append the row and its three panels to dashboard builder ``d``."""
    d = d.with_row(db.Row("Per job, all ranks").id(ids("Per job, all ranks")))
    d = d.with_panel(series(
        ids, "Step time over all ranks (p50 / p99)",
        "Step time quantiles of the whole job, from every rank's histogram summed "
        "(otel_train:step_duration_seconds:*_by_job): a fixed number of series per job "
        "whatever its size.",
        [q(f"otel_train:step_duration_seconds:p50_5m_by_job{{{JOB}}}", "{{job}} p50", "A"),
         q(f"otel_train:step_duration_seconds:p99_5m_by_job{{{JOB}}}", "{{job}} p99", "B")],
        "s", w=10, h=8))
    d = d.with_panel(series(
        ids, "Seconds per step by phase, all ranks",
        "Seconds per step in each phase over all ranks of the job "
        "(otel_train:phase_duration_seconds:per_step_5m_by_job).",
        [q(f"otel_train:phase_duration_seconds:per_step_5m_by_job{{{JOB}}}",
           "{{job}} {{phase}}")], "s", w=10, h=8, stack=True))
    return d.with_panel(single(
        ids, "stat", "Ranks reporting",
        "Ranks whose metrics Prometheus scrapes, per job (otel_train:ranks:count_by_job).",
        [q(f"otel_train:ranks:count_by_job{{{JOB}}}", "{{job}}", instant=True)], "none",
        ((None, "blue"),), w=4, h=8))
