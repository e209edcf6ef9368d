"""The dashboard's "Efficiency" row: throughput and MFU per rank, goodput, the job envelope.

Built with the same blocks as the rest of the dashboard (``dashboards_gen.py`` hands them in:
``Blocks``). The dashed lines and the red area are the alerts' own thresholds, from
deploy/thresholds.yaml through deploy/promql.py.

Usage (dashboards_gen.py)::

    d = rows_efficiency.add_efficiency_row(d, ids, Blocks(q, series, single, dashed, RANK))
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from grafana_foundation_sdk.builders import dashboard as db
from promql import MFU_STEP, THROUGHPUT, T, efficiency_baseline, num  # noqa: E402

# Panels whose series come only from runs that count tokens/samples or FLOPs (options the
# throughput code reads): tests/deploy/test_efficiency_row.py runs them against a fake
# exporter; the end-to-end test's plain loops export none of them.
THROUGHPUT_PANELS = ("Throughput per rank", "MFU per rank", "Achieved FLOP/s per rank")
PANELS = THROUGHPUT_PANELS + ("Goodput", "Where the job's time went")


class Blocks(NamedTuple):
    """dashboards_gen.py's building blocks (it imports this module: no import back)."""

    q: Callable[..., Any]
    series: Callable[..., Any]
    single: Callable[..., Any]
    dashed: Callable[..., Any]
    RANK: str


def _drop_line(expr: str, drop_key: str) -> str:
    """Where the drop alert starts: (1 - drop) x the baseline."""
    return f"(1 - {num(T.deploy[drop_key])}) * {efficiency_baseline(expr)}"


def add_efficiency_row(d: Any, ids: Any, g: Blocks) -> Any:
    """The row and its five panels, appended to the dashboard builder ``d``."""
    rank = g.RANK
    d = d.with_row(db.Row("Efficiency").id(ids("Efficiency")))
    throughput = THROUGHPUT.replace('_per_second"}', f'_per_second", {rank}}}', 1)
    d = d.with_panel(g.series(
        ids, "Throughput per rank",
        "Tokens and samples per second of each rank (label throughput), and dashed where the "
        f"drop alert starts: {num(T.deploy['throughput_drop_ratio'] * 100)}% below the rank's "
        "mean over the hour that ended 10 minutes ago.",
        [g.q(throughput, "rank {{rank}} {{throughput}}/s", "A"),
         g.q(_drop_line(throughput, "throughput_drop_ratio"),
             "alert below: rank {{rank}} {{throughput}}", "B")], "none", w=12, h=8)
        .override_by_query("B", g.dashed()))
    mfu = MFU_STEP.replace("}", f", {rank}}}")
    d = d.with_panel(g.series(
        ids, "MFU per rank",
        "Model FLOPs utilization: achieved FLOP/s over the device's peak, over the whole step "
        "(basis=step) and over the step without its data wait (basis=exclude_data). Dashed: "
        "where the MFU drop alert starts for the whole-step figure.",
        [g.q(f"otel_train_mfu_ratio{{{rank}}}", "rank {{rank}} {{basis}}", "A"),
         g.q(_drop_line(mfu, "mfu_drop_ratio"), "alert below: rank {{rank}}", "B")],
        "percentunit", w=12, h=8)
        .override_by_query("B", g.dashed()))
    floor = T.deploy["goodput_floor_ratio"]
    d = d.with_panel(g.single(
        ids, "stat", "Goodput",
        "Time in training steps / the job's wall time so far (every attempt), per rank. Red "
        f"under the goodput alert's floor ({num(floor * 100)}%).",
        [g.q(f"otel_train_goodput_ratio{{{rank}}}", "rank {{rank}}", instant=True)],
        "percentunit", ((None, "red"), (floor, "green")), w=6, h=8, maximum=1))
    d = d.with_panel(g.single(
        ids, "bargauge", "Where the job's time went",
        "Share of the job's wall time so far by part (otel_train_job_seconds_total): startup, "
        "steps, checkpoint, evaluation, restart_lost (restarts), other (nothing recorded).",
        [g.q(f"sum by (part) (otel_train_job_seconds_total{{{rank}}})\n"
             f"/ ignoring (part) group_left ()\n"
             f"sum (otel_train_job_seconds_total{{{rank}}})", "{{part}}", instant=True)],
        "percentunit", ((None, "blue"),), w=10, h=8, maximum=1))
    d = d.with_panel(g.series(
        ids, "Achieved FLOP/s per rank",
        "FLOPs per step x steps per second, per rank, against the device's peak (dashed) where "
        "it is known.",
        [g.q(f"otel_train_achieved_flops_per_second{{{rank}}}", "rank {{rank}}", "A"),
         g.q(f"otel_train_peak_flops_per_second{{{rank}}}", "peak: rank {{rank}}", "B")],
        "flops", w=8, h=8)
        .override_by_query("B", g.dashed()))
    return d
