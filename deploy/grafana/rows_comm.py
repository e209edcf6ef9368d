"""The dashboard's "Communication" row: collectives per rank (time, bytes, exposed share).

From the counters of otel_train/derived/comm_metrics.py, which exist where a run times its
collectives (``otel_train.instrument_ddp`` / ``instrument_collectives``); the panels are
empty otherwise. The building blocks (``series``, ``q``, ``per_step``) are dashboards_gen's,
passed in so this module does not import it back.

Usage (in dashboards_gen.build_dashboard)::

    d = add_communication_row(d, ids, series, q, per_step, RANK)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grafana_foundation_sdk.builders import dashboard as db

ROW = "Communication"
TIME_TITLE = "Collective seconds per step"
COUNT_TITLE = "Collectives per step"
BYTES_TITLE = "Collective bytes per second"
EXPOSED_TITLE = "Exposed communication share of step time"
PANEL_TITLES = (TIME_TITLE, COUNT_TITLE, BYTES_TITLE, EXPOSED_TITLE)


def add_communication_row(d: Any, ids: Callable[[str], int], series: Callable[..., Any],
                          q: Callable[..., Any], per_step: Callable[[str], str],
                          rank: str) -> Any:
    """The row and its four panels, appended to the dashboard builder ``d``."""
    d = d.with_row(db.Row(ROW).id(ids(ROW)))
    seconds = ("sum by (job, instance, rank, op) (rate(otel_train_collective_seconds_total"
               f"{{{rank}}}[$__rate_interval]))")
    d = d.with_panel(series(
        ids, TIME_TITLE,
        "Issue-to-completion seconds of each rank's collectives per step, by op (DDP's "
        "gradient all-reduce, explicit torch.distributed calls). Overlapped time counts "
        "in full, so this can exceed the step; the exposed share (right) is what the step "
        "waited for.",
        [q(per_step(seconds), "rank {{rank}} {{op}}")], "s", w=6, h=8))
    count = ("sum by (job, instance, rank, op) (rate(otel_train_collectives_total"
             f"{{{rank}}}[$__rate_interval]))")
    d = d.with_panel(series(
        ids, COUNT_TITLE,
        "Collectives each rank issues per step, by op (under DDP: one per gradient bucket).",
        [q(per_step(count), "rank {{rank}} {{op}}")], "none", w=6, h=8))
    d = d.with_panel(series(
        ids, BYTES_TITLE,
        "Payload bytes each rank sends in collectives per second, by op (under DDP: the "
        "gradient buckets).",
        [q("sum by (rank, op) (rate(otel_train_collective_bytes_total"
           f"{{{rank}}}[$__rate_interval]))", "rank {{rank}} {{op}}")], "Bps", w=6, h=8))
    d = d.with_panel(series(
        ids, EXPOSED_TITLE,
        "Share of each rank's step time spent waiting for collectives (not overlapped with "
        "compute). Under DDP the fast ranks wait for the slowest: a rank with a low share "
        "while the others' is high is the straggler (Stragglers row).",
        [q("sum by (rank) (rate(otel_train_collective_exposed_seconds_total"
           f"{{{rank}}}[$__rate_interval]))\n/ on (rank)\n(sum by (rank) (rate("
           f"otel_train_step_duration_seconds_sum{{{rank}}}[$__rate_interval])) > 0)",
           "rank {{rank}}")], "percentunit", w=6, h=8, maximum=1))
    return d
