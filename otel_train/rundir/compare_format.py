"""``otel-train compare`` output: a plain-text table, Markdown (for a CI comment), or JSON.

Usage::

    print(format_comparison(result, "text"))    # or "markdown", "json"
"""

from __future__ import annotations

import json

from otel_train.common.units import COMPARE, duration, percent, si
from otel_train.rundir.compare import (
    Comparison,
    Row,
    RunSide,
    excluded_text,
    throughput_note,
)

FORMATS = ("text", "json", "markdown")


def seconds_text(seconds: float) -> str:
    """A duration with a unit that suits it: '812 us', '5.12 ms', '1.30 s'."""
    return duration(seconds, COMPARE)


def _rate_text(value: float | None) -> str:
    if value is None:
        return "not recorded"
    return si(value, "/s")


def _ratio_cells(row: Row) -> tuple[str, str]:
    if row.ratio is None or row.low is None or row.high is None:
        return "-", "-"
    return f"{row.ratio:.3f}", f"[{row.low:.3f}, {row.high:.3f}]"


def _rows(result: Comparison) -> list[tuple[str, Row]]:
    rows = [(result.step.name, result.step)]
    if result.wall is not None:
        rows.append((result.wall.name, result.wall))
    rows += [(f"  {r.name}", r) for r in result.phases]
    return rows


def _side_line(side: RunSide) -> str:
    ranks = f"{len(side.ranks)} rank" + ("s" if len(side.ranks) > 1 else "")
    return (f"{side.label}: {side.path} ({ranks}, {side.steps} steps; {len(side.steady)} "
            f"steady, left out: {excluded_text(side)})")


def _extras(result: Comparison) -> list[str]:
    """Phases in one run only, overhead, throughput, per rank: one line each."""
    a, b = result.a, result.b
    lines = []
    if result.same_run is not None:
        lines.append(f"warning: A and B are one run ({result.same_run}): compare two runs")
    if result.only_a:
        lines.append(f"phases in A only (not compared): {', '.join(result.only_a)}")
    if result.only_b:
        lines.append(f"phases in B only (not compared): {', '.join(result.only_b)}")
    lines.append("monitoring overhead (monitoring / training time, every step): "
                 f"A {_pct(a.overhead_ratio)}, B {_pct(b.overhead_ratio)}")
    for what, attr in (("tokens", "tokens_per_second"), ("samples", "samples_per_second")):
        ra, rb = getattr(a, attr), getattr(b, attr)
        if ra is None and rb is None:
            continue
        ratio = f" (B/A {rb / ra:.3f})" if ra and rb is not None else ""
        lines.append(f"throughput, {what} per second of steady steps (their {what} over their "
                     f"summed time, evaluation steps left out): A {_rate_text(ra)}, "
                     f"B {_rate_text(rb)}{ratio}")
    note = throughput_note(result)
    if note is not None:
        lines.append(note)
    if result.per_rank:
        parts = [f"rank {rank} {row.change_text()}" for rank, row in result.per_rank]
        lines.append("step per rank (B vs A): " + "; ".join(parts))
    return lines


_pct = percent


def format_text(result: Comparison) -> str:
    """The plain-text comparison: runs, table, extras, verdict."""
    s = result.settings
    rank = "all ranks pooled" if s.rank is None else f"rank {s.rank}"
    lines = [_side_line(result.a), _side_line(result.b),
             f"medians of steady steps ({rank}); B/A with a bootstrap 95% interval "
             f"({s.resamples} resamples, seed {s.seed}); within noise: interval across 1 "
             f"or change under {s.min_change * 100:g}%", ""]
    table = [("", "A median", "B median", "B/A", "95% CI", "")]
    for label, row in _rows(result):
        ratio, ci = _ratio_cells(row)
        table.append((label, seconds_text(row.a_median), seconds_text(row.b_median), ratio,
                      ci, row.status))
    widths = [max(len(r[i]) for r in table) for i in range(6)]
    for r in table:
        cells = [r[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(r[1:5], widths[1:5])]
        lines.append("  ".join(cells + [r[5]]).rstrip())
    lines.append("")
    lines += _extras(result)
    lines.append(f"verdict: {result.verdict}")
    return "\n".join(lines)


def format_markdown(result: Comparison) -> str:
    """The comparison as Markdown: the verdict first, then a table (a CI comment)."""
    s = result.settings
    lines = [f"**otel-train compare**: {result.verdict}", "",
             f"- {_side_line(result.a)}", f"- {_side_line(result.b)}", "",
             "| | A median | B median | B/A | 95% CI | |", "|---|---:|---:|---:|---:|---|"]
    for label, row in _rows(result):
        ratio, ci = _ratio_cells(row)
        name = label.strip() if row is result.step or row is result.wall else (
            f"&nbsp;&nbsp;{label.strip()}")
        lines.append(f"| {name} | {seconds_text(row.a_median)} | {seconds_text(row.b_median)} "
                     f"| {ratio} | {ci} | {row.status} |")
    lines.append("")
    lines += [f"- {line}" for line in _extras(result)]
    lines.append(f"- bootstrap: {s.resamples} resamples, seed {s.seed}; steady-state steps only")
    return "\n".join(lines)


def format_comparison(result: Comparison, fmt: str) -> str:
    """``result`` in one of :data:`FORMATS`."""
    if fmt == "json":
        return json.dumps(result.as_dict(), indent=2)
    if fmt == "markdown":
        return format_markdown(result)
    if fmt == "text":
        return format_text(result)
    raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
