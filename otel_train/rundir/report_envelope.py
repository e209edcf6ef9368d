"""The report's "Where the job's time went": goodput and the job envelope, per rank.

Read from the ``envelope`` of each ``monitoring_costs*.json`` (``derived/goodput.py``): one
stacked bar of the parts (plain HTML, no chart library needed) and a table of seconds and
shares of the job's wall time.

Usage::

    envelope_section(run_data)    # HTML; a sentence when no costs file has an envelope
"""

from __future__ import annotations

import html
from typing import Any

from otel_train.common.attributes import JOB_PARTS
from otel_train.rundir.report_data import RunData
from otel_train.rundir.report_tables import html_table

# One color per part, steps (the goodput) first in green.
PART_COLORS = {"steps": "#2ca02c", "startup": "#1f77b4", "checkpoint": "#9467bd",
               "evaluation": "#ff7f0e", "restart_lost": "#d62728", "other": "#7f7f7f"}
ENVELOPE_CSS = (".envelope-bar{display:flex;height:22px;width:100%;max-width:900px;"
                "border-radius:3px;overflow:hidden;margin:6px 0}"
                ".envelope-bar div{height:100%}")


def envelope_section(data: RunData) -> str:
    """Goodput and the parts of the job's time, for each costs file that has them."""
    found = [c for c in data.costs if c.get("envelope")]
    if not found:
        return ("<p class='empty'>No job envelope in the costs files (written by otel-train "
                "from the first step on).</p>")
    return f"<style>{ENVELOPE_CSS}</style>" + "".join(_one_rank(c) for c in found)


def _one_rank(costs: dict[str, Any]) -> str:
    env = costs["envelope"]
    job = float(env.get("job_seconds") or 0.0)
    parts = env.get("parts_seconds") or {}
    ratio = env.get("goodput_ratio")
    rank = html.escape(str(costs.get("rank", "?")))
    attempt = int(env.get("attempt") or 1)
    head = (f"<h3 data-goodput='{'' if ratio is None else f'{ratio:.6f}'}'>rank {rank}: "
            f"goodput {'-' if ratio is None else f'{ratio * 100:.1f}%'} of {job:.1f} s of "
            f"job wall time{f', attempt {attempt}' if attempt > 1 else ''}</h3>")
    bar, rows = [], []
    for part in JOB_PARTS:
        secs = float(parts.get(part) or 0.0)
        share = secs / job if job > 0 else 0.0
        if share > 0:
            bar.append(f"<div title='{part} {share * 100:.1f}%' style='width:{share * 100:.3f}%;"
                       f"background:{PART_COLORS[part]}'></div>")
        rows.append([html.escape(part), ("num", f"{secs:.3f} s"),
                     ("num", f"{share * 100:.1f}%")])
    return (head + f"<div class='envelope-bar'>{''.join(bar)}</div>"
            + html_table(["part", "seconds", "share of the job"], rows, "envelope",
                         [f"data-part='{p}'" for p in JOB_PARTS]))
