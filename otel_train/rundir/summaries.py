"""Summary spans read back from a run directory (``span_mode="summary"``).

A rank in summary mode writes one ``train.summary`` span per interval instead of each step's
spans (derived/step_summary.py; attribute names in docs/telemetry.md). ``read_summaries``
finds them: only lines that name ``train.summary`` are parsed in full, so a run of per-step
spans costs one substring test per line. The report shows them when the span files hold no
per-step spans (``summary_section``); ``otel-train export`` writes each summary as a slice
over its step range and as counters (chrome_trace.py, ``summary_events``).

Usage::

    summaries = read_summaries(run_dir)          # [Summary(rank, start_ns, end_ns, attrs)]
    phase_totals(summaries)                      # {(rank, phase): {"count": .., ...}}
"""

from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from otel_train.common import attributes as A
from otel_train.rundir.span_files import _iter_lines, attributes_dict, span_files

_NEEDLE = b'"name":"' + A.SUMMARY_SPAN_NAME.encode() + b'"'
MAX_SUMMARY_ROWS = 200  # intervals listed in the report (the totals cover all of them)
_STEP = "step"  # the whole step's figures, beside each phase's


@dataclass(frozen=True)
class Summary:
    """One summary span: its rank, interval and attributes."""

    rank: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]

    def stats(self) -> dict[str, dict[str, float]]:
        """Per phase name (and ``step``): count, sum_seconds, min_seconds, ... as numbers."""
        out: dict[str, dict[str, float]] = {}
        for key, value in self.attributes.items():
            if key.startswith(A.SUMMARY_PHASE_PREFIX):
                name, _, stat = key[len(A.SUMMARY_PHASE_PREFIX):].rpartition(".")
            elif key.startswith(A.SUMMARY_STEP_PREFIX):
                name, stat = _STEP, key[len(A.SUMMARY_STEP_PREFIX):]
            else:
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out.setdefault(name, {})[stat] = float(value)
        return {name: s for name, s in out.items() if "count" in s}


def read_summaries(run_dir: str | os.PathLike[str]) -> list[Summary]:
    """Every summary span of a run directory, in rank and time order."""
    found = []
    for path in span_files(Path(run_dir)):
        for line in _iter_lines(path):
            if _NEEDLE not in line:
                continue
            try:
                request = json.loads(line)
            except ValueError:
                continue  # a torn line
            for rs in request.get("resourceSpans", ()):
                for ss in rs.get("scopeSpans", ()):
                    for span in ss.get("spans", ()):
                        if span.get("name") == A.SUMMARY_SPAN_NAME:
                            attrs = attributes_dict(span.get("attributes"))
                            found.append(Summary(int(attrs.get(A.RANK, 0) or 0),
                                                 int(span["startTimeUnixNano"]),
                                                 int(span["endTimeUnixNano"]), attrs))
    found.sort(key=lambda s: (s.rank, s.start_ns))
    return found


def phase_totals(summaries: list[Summary]) -> dict[tuple[int, str], dict[str, float]]:
    """Per (rank, phase): count and sum added up, min and max over the intervals, and the
    highest interval p50 and p99 (percentiles of intervals cannot be merged exactly)."""
    totals: dict[tuple[int, str], dict[str, float]] = {}
    for summary in summaries:
        for name, s in summary.stats().items():
            t = totals.get((summary.rank, name))
            if t is None:
                totals[(summary.rank, name)] = dict(s)
                continue
            t["count"] += s.get("count", 0.0)
            t["sum_seconds"] += s.get("sum_seconds", 0.0)
            for stat, pick in (("min_seconds", min), ("max_seconds", max),
                               ("p50_seconds", max), ("p99_seconds", max)):
                if stat in s:
                    t[stat] = pick(t.get(stat, s[stat]), s[stat])
    return totals


def summary_section(summaries: list[Summary]) -> str:
    """The report's summary tables: totals per rank and phase, then each interval."""
    def sec(v: float | None) -> str:
        return "" if v is None else f"{v:.4f}"

    rows = []
    for (rank, name), t in sorted(phase_totals(summaries).items(),
                                  key=lambda kv: (kv[0][0], kv[0][1] != _STEP, kv[0][1])):
        mean = t["sum_seconds"] / t["count"] if t.get("count") else None
        rows.append(f"<tr><td>{rank}</td><td>{html.escape(name)}</td><td>{int(t['count'])}"
                    f"</td><td>{sec(t.get('sum_seconds'))}</td><td>{sec(mean)}</td>"
                    f"<td>{sec(t.get('min_seconds'))}</td><td>{sec(t.get('p50_seconds'))}</td>"
                    f"<td>{sec(t.get('p99_seconds'))}</td><td>{sec(t.get('max_seconds'))}</td>"
                    "</tr>")
    head = ("<tr><th>rank</th><th>phase</th><th>count</th><th>total s</th><th>mean s</th>"
            "<th>min s</th><th>p50 s (worst interval)</th><th>p99 s (worst interval)</th>"
            "<th>max s</th></tr>")
    intervals = []
    for s in summaries[:MAX_SUMMARY_ROWS]:
        a, step = s.attributes, s.stats().get(_STEP, {})
        listed = [*(a.get(A.SUMMARY_SLOW_STEPS) or []), *(a.get(A.SUMMARY_FAILED_STEPS) or [])]
        intervals.append(
            f"<tr><td>{s.rank}</td><td>{a.get(A.SUMMARY_STEP_FIRST)}–{a.get(A.SUMMARY_STEP_LAST)}"
            f"</td><td>{a.get(A.SUMMARY_STEPS)}</td><td>{sec(step.get('p50_seconds'))}</td>"
            f"<td>{sec(step.get('p99_seconds'))}</td>"
            f"<td>{html.escape(', '.join(str(n) for n in listed))}</td></tr>")
    more = (f"<p class='note'>First {MAX_SUMMARY_ROWS} of {len(summaries)} intervals.</p>"
            if len(summaries) > MAX_SUMMARY_ROWS else "")
    return (f"<p class='note'>This run exported summaries (span_mode=summary): one span per "
            f"interval with per-phase figures; slow and failed steps are exported in full and "
            f"appear in the sections above.</p><table class='summary'>{head}{''.join(rows)}"
            "</table><h3>Intervals</h3><table class='summary'><tr><th>rank</th><th>steps</th>"
            "<th>count</th><th>step p50 s</th><th>step p99 s</th><th>slow / failed steps</th>"
            f"</tr>{''.join(intervals)}</table>{more}")


def summary_events(summaries: list[Summary], grid: int = 1) -> list[dict[str, Any]]:
    """Trace Event Format events: each summary as a slice over its steps (its figures in
    ``args``) and a counter of the step's p50/p99 and each phase's mean seconds."""
    events: list[dict[str, Any]] = []
    named: set[int] = set()
    for s in summaries:
        if s.rank not in named:
            named.add(s.rank)
            events.append({"name": "thread_name", "ph": "M", "pid": s.rank, "tid": 2,
                           "args": {"name": "summaries"}})
        start = s.start_ns // grid * grid
        end = max(start, s.end_ns // grid * grid)
        a, stats = s.attributes, s.stats()
        args = {k[len("train.summary."):]: v for k, v in a.items()
                if k.startswith("train.summary.")}
        events.append({"name": f"summary steps {a.get(A.SUMMARY_STEP_FIRST)}-"
                       f"{a.get(A.SUMMARY_STEP_LAST)}", "cat": "summary", "ph": "X",
                       "pid": s.rank, "tid": 2, "ts": start / 1000, "dur": (end - start) / 1000,
                       "args": args})
        step = stats.get(_STEP, {})
        events.append({"name": "step seconds (summary)", "ph": "C", "pid": s.rank,
                       "ts": end / 1000, "args": {"p50": step.get("p50_seconds", 0.0),
                                                  "p99": step.get("p99_seconds", 0.0)}})
        means = {name: st["sum_seconds"] / st["count"] for name, st in stats.items()
                 if name != _STEP and st.get("count")}
        if means:
            events.append({"name": "phase mean seconds (summary)", "ph": "C", "pid": s.rank,
                           "ts": end / 1000, "args": means})
    return events
