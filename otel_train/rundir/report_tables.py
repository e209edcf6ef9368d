"""The report's text and tables: the summary, the costs with their verdict, the slowest steps,
dropped and removed spans.

The monitoring headline is the budget verdict the console and ``otel-train costs`` print
(``costs_verdict``: the steady-state figure that drives the status first, labelled, then
recent and total, with the reason when one sits on the other side of the threshold), read
from each ``monitoring_costs*.json``. Every table goes through :func:`html_table`, which
leaves out a column no row has a value in (no empty "flag" column when nothing was flagged).

Usage::

    html_table(["step", "flag"], [["25", ""], ["30", ""]], "slow")  # the flag column dropped
    verdict_text(costs)          # "CRITICAL: 11.36% of training time in steady state (...)..."
"""

from __future__ import annotations

from functools import partial
import html
import time
from collections.abc import Mapping
from typing import Any

from otel_train.common.units import REPORT_TABLE, duration, percent
from otel_train.derived.costs import costs_verdict
from otel_train.derived.costs import verdict_text as costs_verdict_text
from otel_train.rundir.report_data import RunData
from otel_train.rundir.report_governing import governing_html

# A cell: its HTML, or (its td class, its HTML). An empty HTML string is "no value".
Cell = str | tuple[str, str]

MAX_SLOW_ROWS = 20


def html_table(headers: list[str], rows: list[list[Cell]], cls: str,
               row_attrs: list[str] | None = None) -> str:
    """A table without the columns that no row has a value in."""
    def body(cell: Cell) -> str:
        return cell[1] if isinstance(cell, tuple) else cell

    keep = [i for i in range(len(headers)) if any(body(r[i]) for r in rows)]
    out = [f"<table class='{cls}'><tr>"
           + "".join(f"<th>{html.escape(headers[i])}</th>" for i in keep) + "</tr>"]
    for n, row in enumerate(rows):
        attrs = f" {row_attrs[n]}" if row_attrs else ""
        cells = []
        for i in keep:
            cell = row[i]
            if isinstance(cell, tuple):
                cells.append(f"<td class='{cell[0]}'>{cell[1]}</td>")
            else:
                cells.append(f"<td>{cell}</td>")
        out.append(f"<tr{attrs}>" + "".join(cells) + "</tr>")
    return "".join(out) + "</table>"


def verdict_text(costs: Mapping[str, Any]) -> str:
    """The budget verdict of one costs report, worded as the console words it."""
    return costs_verdict_text(costs)


def summary_table(data: RunData) -> str:
    """The run at a glance: what was read, and the monitoring verdict."""
    steps = sum(data.steps_per_rank.values())
    files = ", ".join(p.name for p in data.files) or "none"
    if data.costs:
        costs = data.costs[0]
        status = ("pending" if costs.get("verdict_evidence")
                  else html.escape(costs_verdict(costs).status))
        monitoring = (f"<span class='verdict status-{status}' id='summary-verdict'>"
                      f"{html.escape(verdict_text(costs))}</span>")
    else:
        monitoring = "no monitoring_costs.json"
    rows = [
        ("run directory", html.escape(str(data.run_dir))),
        ("ranks", str(len(data.ranks) or "?")),
        ("steps read (all ranks)", f"{steps:,}"),
        ("spans read", f"{data.spans:,}"),
        ("span files", html.escape(files)),
        ("monitoring", monitoring),
        ("chart resolution", "every step" if data.bucket_width == 1 else
         f"{data.bucket_width} steps per point (downsampled)"),
        ("generated", html.escape(time.strftime("%Y-%m-%d %H:%M:%S %z"))),
    ]
    if data.stopped_early:
        rows.append(("partial", f"<b>reading stopped at the time limit ("
                     f"{html.escape(data.stopped_early)})</b>: run <code>otel-train report "
                     f"{html.escape(str(data.run_dir))}</code> for the whole run"))
    return "<table class='kv'>" + "".join(
        f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def costs_section(data: RunData) -> str:
    """Per costs file: the verdict, the operations, the advisor."""
    if not data.costs:
        return "<p class='empty'>No monitoring_costs*.json in the run directory yet.</p>"
    out = []
    for c in data.costs:
        rank = html.escape(str(c.get("rank", "?")))
        status = ("pending" if c.get("verdict_evidence")
                  else html.escape(costs_verdict(c).status))
        out.append(f"<h3>{html.escape(c['_file'])} (rank {rank}), over {c.get('steps', 0)} steps"
                   f"</h3><p class='verdict status-{status}'>monitoring "
                   f"{html.escape(verdict_text(c))}</p>")
        rows: list[list[Cell]] = []
        names = []
        for name, op in (c.get("operations") or {}).items():
            names.append(f"data-operation='{html.escape(str(name))}'")
            rows.append([html.escape(str(name)), ("calls", str(int(op.get("calls", 0)))),
                         ("total", _secs(op.get("total_seconds"))),
                         ("first", _secs(op.get("first_seconds"))),
                         ("mean", _secs(op.get("mean_seconds"))),
                         ("max", _secs(op.get("max_seconds"))),
                         ("share", _pct(op.get("share")))])
        if rows:
            out.append(html_table(["operation", "calls", "total", "first", "mean", "max",
                                   "share of training"], rows, "costs", names))
        else:
            out.append("<p class='empty'>No monitoring operation recorded.</p>")
        device = (c.get("own_cost") or {}).get("device_work")
        if isinstance(device, dict):
            # On an accelerator: what of otel-train's device work its own cost includes,
            # and what no clock in the run sees.
            out.append(f"<p class='note'>otel-train's device work: included in its own cost: "
                       f"{html.escape(str(device.get('charged', '')))}; left out: "
                       f"{html.escape(str(device.get('left_out', '')))}.</p>")
        # The advisor's wording is its own (otel_train/derived/budget.py): shown as it is.
        advice = c.get("advisor") or []
        if advice:
            items = "".join(
                f"<li class='{'ok' if a.get('within_budget') else 'over'}'>"
                f"{html.escape(str(a.get('advice', '')))}</li>" for a in advice)
            out.append(f"<p>Advisor:</p><ul class='advisor'>{items}</ul>")
        out.append(governing_html(c))  # step.due's intervals, when any
    return "".join(out)


def slow_section(data: RunData) -> str:
    """The slowest steps with their phases, each linking to its timeline when shown."""
    if not data.slow_steps:
        return "<p class='empty'>No step yet.</p>"
    typical = data.typical_seconds
    rows: list[list[Cell]] = []
    for rec in data.slow_steps[:MAX_SLOW_ROWS]:
        parts = sorted(rec.breakdown().items(), key=lambda kv: -kv[1])
        total = rec.seconds or 1e-12
        text = ", ".join(f"{html.escape(k)} {_secs(v)} ({v / total:.0%})"
                         for k, v in parts[:5])
        link = (f"<a href='#step-{rec.step}'>timeline</a>"
                if rec.step in data.timeline_steps else "")
        rows.append([str(rec.step), str(rec.rank) if len(data.ranks) > 1 else "",
                     _secs(rec.seconds), f"{rec.seconds / typical:.1f}x" if typical else "",
                     "slow" if rec.slow else "", text, link])
    shown = min(MAX_SLOW_ROWS, len(data.slow_steps))
    return (f"<p>{data.slow_flagged} step(s) flagged slow (<code>train.slow</code>); the "
            f"{shown} slowest, with their phases:</p>"
            + html_table(["step", "rank", "time", "x typical", "flag", "breakdown", "timeline"],
                         rows, "slow"))


# The step ring's counts (monitoring_costs.json ``step_ring``) the drops table shows.
_RING_WORDS = (
    ("markers_unmatched", "step ring: queued records not there when their place was read "
     "(lost ones counted above by reason)"),
    ("late_records", "step ring: queued records exported after steps that ended later"),
    ("resent_spans", "spans exported again from the training process after the exporter "
     "process died"),
)


def drops_section(data: RunData) -> str:
    """Spans dropped (by reason), removed, steps missing, torn lines."""
    rows = []
    for c in data.costs:
        dropped = c.get("dropped_spans")
        if isinstance(dropped, dict):
            for reason, n in sorted(dropped.items()):
                rows.append((f"dropped ({html.escape(str(reason))}), rank "
                             f"{c.get('rank', '?')}", int(n)))
        # Device tensors given to set_attribute / count that never reached host memory.
        left_out = c.get("dropped_attributes")
        if isinstance(left_out, dict):
            for reason, n in sorted(left_out.items()):
                rows.append((f"attribute values left out ({html.escape(str(reason))}), rank "
                             f"{c.get('rank', '?')}", int(n)))
        # The step ring read by the exporter process: its records' detours (not drops).
        ring = c.get("step_ring")
        if isinstance(ring, dict):
            for key, words in _RING_WORDS:
                if ring.get(key):
                    rows.append((f"{words}, rank {c.get('rank', '?')}", int(ring[key])))
    for r in data.removed:
        rows.append((f"removed by spans_total_max_bytes ({html.escape(r['_file'])})",
                     int(r.get("removed_spans", 0))))
    for rank, n in sorted(data.missing_steps().items()):
        rows.append((f"steps missing from the span files, rank {rank}", n))
    if data.torn_lines:
        rows.append(("unreadable lines (torn writes)", data.torn_lines))
    for rank, step, reason in data.truncated:
        # A step still open when the run ended: exported with the end it was cut at.
        rows.append((f"step {step} cut off ({html.escape(reason)}, <code>train.truncated"
                     f"</code>), rank {rank}", 1))
    if not rows:
        return "<p class='empty'>No span file read yet.</p>"
    body = "".join(f"<tr><th>{k}</th><td class='count'>{v:,}</td></tr>" for k, v in rows)
    return ("<table class='kv drops'>" + body + "</table><p class='note'>Dropped spans "
            "are counted by reason in <code>otel_train_spans_dropped_total</code>; a step "
            "missing here was dropped, sampled out, or not written yet.</p>")


_secs = partial(duration, style=REPORT_TABLE)  # a table cell: "-" when unknown
_pct = partial(percent, spec=".2f")


__all__ = ["costs_section", "drops_section", "html_table", "slow_section", "summary_table",
           "verdict_text"]
