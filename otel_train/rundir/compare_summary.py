"""``otel-train compare`` when a run holds ``train.summary`` spans (summary mode).

A summary-mode run exports, per interval, one ``train.summary`` span with count and sum (and
min, max, p50, p99) of the step and of each phase, and only its slow or failed steps in full:
there are no per-step times to take medians of, nor steady steps to pick. What can be
compared is the mean over every summarized step (``sum_seconds / count``: warm-up and eval
steps included), for the step and each phase, without an interval. A run with per-step spans
compared with one in summary mode gives the same means from its own steps, every step
counted. Attribute names: docs/telemetry.md (``train.summary.step.*``,
``train.summary.phase.<phase>.*``).

Usage::

    if has_summaries(run_a) or has_summaries(run_b):
        rows = compare_means(run_a, run_b, rank=None)
        print(format_means(rows, run_a, run_b, "text"))
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

from otel_train.rundir.compare_read import RunSteps

_STEP_KEYS = {"train.summary.step.sum_seconds": 0, "train.summary.step.count": 1}
_PHASE_KEY = re.compile(r"train\.summary\.phase\.(.+)\.(sum_seconds|count)$")


@dataclass(frozen=True)
class MeanRow:
    """The mean seconds of the step or one phase in each run, and B / A."""

    name: str
    a_mean_seconds: float
    b_mean_seconds: float
    ratio: float | None


def has_summaries(run: RunSteps) -> bool:
    """Whether the run exported ``train.summary`` spans (summary mode)."""
    return bool(run.summaries)


def _summary_totals(run: RunSteps, rank: int | None) -> dict[str, list[float]]:
    """'step' and each phase -> [sum of seconds, count] over the run's summaries."""
    totals: dict[str, list[float]] = {}
    for attrs in run.summaries:
        if rank is not None and attrs.get("train.rank", 0) != rank:
            continue
        for key, value in attrs.items():
            if key in _STEP_KEYS:
                name, slot = "step", _STEP_KEYS[key]
            else:
                m = _PHASE_KEY.match(key)
                if m is None:
                    continue
                name, slot = m.group(1), 0 if m.group(2) == "sum_seconds" else 1
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                totals.setdefault(name, [0.0, 0.0])[slot] += float(value)
    return totals


def _step_totals(run: RunSteps, rank: int | None) -> dict[str, list[float]]:
    """The same totals from a run's per-step spans, every step counted."""
    totals: dict[str, list[float]] = {}
    for s in run.steps:
        if rank is not None and s.rank != rank:
            continue
        for name, seconds in [("step", s.seconds), *s.phases.items()]:
            total = totals.setdefault(name, [0.0, 0.0])
            total[0] += seconds
            total[1] += 1
    return totals


def compare_means(run_a: RunSteps, run_b: RunSteps, rank: int | None) -> list[MeanRow]:
    """The step and each phase both runs have: mean seconds and B / A."""
    sides = [_summary_totals(r, rank) if has_summaries(r) else _step_totals(r, rank)
             for r in (run_a, run_b)]
    rows = []
    for name in sides[0]:
        if name not in sides[1] or not sides[0][name][1] or not sides[1][name][1]:
            continue
        a = sides[0][name][0] / sides[0][name][1]
        b = sides[1][name][0] / sides[1][name][1]
        rows.append(MeanRow(name, a, b, b / a if a > 0 else None))
    rows.sort(key=lambda r: r.name != "step")  # the step first, phases in the runs' order
    return rows


def _how(run: RunSteps) -> str:
    if has_summaries(run):
        return f"{len(run.summaries)} train.summary spans (summary mode)"
    return f"{len(run.steps)} per-step spans"


def format_means(rows: list[MeanRow], run_a: RunSteps, run_b: RunSteps, fmt: str) -> str:
    """The means comparison as text, markdown or JSON; it says why there is no interval."""
    note = ("no per-step times in a summary-mode run: means over every summarized step "
            "(warm-up and eval steps included), no interval, no verdict")
    if fmt == "json":
        return json.dumps({"a": {"path": str(run_a.run_dir), "holds": _how(run_a)},
                           "b": {"path": str(run_b.run_dir), "holds": _how(run_b)},
                           "summary_mode": True, "note": note,
                           "rows": [asdict(r) for r in rows]}, indent=2)
    cells = [(r.name, f"{r.a_mean_seconds * 1e3:.3f} ms", f"{r.b_mean_seconds * 1e3:.3f} ms",
              "-" if r.ratio is None else f"{r.ratio:.3f}") for r in rows]
    head = [f"A: {run_a.run_dir} ({_how(run_a)})", f"B: {run_b.run_dir} ({_how(run_b)})",
            note]
    if fmt == "markdown":
        lines = [f"**otel-train compare**: {note}", "", *[f"- {h}" for h in head[:2]], "",
                 "| | A mean | B mean | B/A |", "|---|---:|---:|---:|"]
        return "\n".join(lines + [f"| {' | '.join(c)} |" for c in cells])
    table = [("", "A mean", "B mean", "B/A"), *cells]
    widths = [max(len(line[i]) for line in table) for i in range(4)]
    lines = head + [""]
    for line in table:
        lines.append("  ".join([line[0].ljust(widths[0])]
                               + [c.rjust(w) for c, w in zip(line[1:], widths[1:])]))
    return "\n".join(lines)
