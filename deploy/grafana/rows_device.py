"""The dashboard row "Device: busy, idle and memory" (issue 27): device busy per phase and idle
as shares of the sampled steps' device time, steps by bound, peak memory per phase, host RSS.

The counters come from one step in ``device_events_every_steps`` (the sampled steps), so the
panels show shares and rates of those steps, never sums meant to equal wall time.

Usage (from dashboards_gen.py)::

    d = add_device_row(d, ids, series, q, RUN, RANK)
"""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import dashboard as db

ROW_TITLE = "Device: busy, idle and memory"
# Panels of this row; their queries need an accelerator's metrics (tests/deploy/
# test_device_row.py runs them against a fake one), so the CPU-only e2e leaves them out.
PANEL_TITLES = ("Device busy by phase, and idle", "Steps by bound", "Peak memory per phase",
                "Host RSS")


def _sampled_device_seconds(rank_selector: str) -> str:
    """Device busy + idle seconds per second of the sampled steps, per rank."""
    return (f"(sum by (rank) (rate(otel_train_phase_device_busy_seconds_total{{{rank_selector}}}"
            f"[$__rate_interval]))\n+ sum by (rank) (rate(otel_train_device_idle_seconds_total"
            f"{{{rank_selector}}}[$__rate_interval])))")


def add_device_row(d: Any, ids: Any, series: Any, q: Any, run: str, rank: str) -> Any:
    """``d`` with the row and its four panels appended."""
    total = _sampled_device_seconds(rank)
    d = d.with_row(db.Row(ROW_TITLE).id(ids(ROW_TITLE)))
    d = d.with_panel(series(
        ids, PANEL_TITLES[0],
        "Share of the sampled steps' device time each phase kept the device busy (device "
        "events between its boundaries), and the share it idled (step wall minus busy): a "
        "large idle share with a large data phase is an input-bound loop.",
        [q(f"sum by (rank, phase) (rate(otel_train_phase_device_busy_seconds_total{{{rank}}}"
           f"[$__rate_interval]))\n/ on (rank) group_left ()\n{total}", "rank {{rank}} {{phase}}",
           "A"),
         q(f"sum by (rank) (rate(otel_train_device_idle_seconds_total{{{rank}}}"
           f"[$__rate_interval]))\n/ on (rank)\n{total}", "rank {{rank}} idle", "B")],
        "percentunit", w=8, h=8, stack=True, maximum=1))
    d = d.with_panel(series(
        ids, PANEL_TITLES[1],
        "Steps per second by what bounds them (train.step.bound): input, compute, "
        "communication or host (docs/device-timing.md has the rule).",
        [q(f"sum by (bound) (rate(otel_train_steps_by_bound_total{{{rank}}}"
           "[$__rate_interval]))", "{{bound}}")], "cps", w=6, h=8, stack=True, bars=True))
    d = d.with_panel(series(
        ids, PANEL_TITLES[2],
        "The allocator's peak per phase on the last sampled step (reset at the phase's start, "
        "read at its end): which phase sets the memory high-water mark.",
        [q(f"max by (phase, pool) (otel_train_phase_memory_peak_bytes{{{rank}}})",
           "{{phase}} {{pool}}")], "bytes", w=5, h=8))
    d = d.with_panel(series(
        ids, PANEL_TITLES[3],
        "Resident set size of each training process (host memory the device allocator "
        "can't see: loader copies, pinned buffers; read every device_events_every_steps steps).",
        [q(f"max by (instance, rank) (otel_train_host_rss_bytes{{{run}}})",
           "{{instance}} rank {{rank}}")], "bytes", w=5, h=8))
    return d
