"""The report's charts as plotly.js figures (plain dicts: ``{"data": [...], "layout": {...}}``).

No Python plotting package: the page feeds these dicts to the plotly.js basic bundle it
inlines (``report.py``). What makes them readable:

- times in the unit that fits (µs, ms, s), log axes ticked 1-2-5 per decade (or one tick per
  decade over a wide range) and labelled with their unit ("2 ms", "500 µs", "1 s");
- step time on a linear axis clipped at 1.5x the 95th percentile, so a first step of 255 ms
  does not flatten 5 ms steps: each clipped bar gets a marker with its true value (orange for
  an eval step, grey for a training step), and the warm-up steps are shaded;
- no series without data (:func:`drop_empty_traces`), so no legend entry without a bar;
- numbers rounded to 6 significant digits (µs for step times in ms): the page stays small.

Usage::

    fig = step_time_figure(buckets, bucket_width=1, warmup_step_count=5, colors=Colors())
    log_time_ticks(0.004, 0.255)   # ([0.002, 0.005, 0.01, ...], ["2 ms", "5 ms", ...], [lo, hi])
"""

from __future__ import annotations

import math
from typing import Any

from otel_train.common.units import CHART, duration
from otel_train.rundir.report_data import Bucket, StepRecord

_TRAIN_COLORS = ["#1f77b4", "#2ca02c", "#17becf", "#9467bd", "#8c564b", "#7f7f7f", "#bcbd22"]
_MONITOR_COLORS = ["#ff7f0e", "#d62728", "#e377c2", "#ffbb78", "#ff9896"]
_WARMUP_SHADE = "rgba(120,120,120,0.13)"
# Step time above CLIP_FACTOR x its 95th percentile is clipped (and marked with its value).
CLIP_FACTOR = 1.5
_CLIP_PERCENTILE = 0.95
_MAX_CLIP_LABELS = 12  # more clipped bars than this: values on hover only, not printed
# Over this many decades a log axis gets one tick per decade, not 1-2-5.
_MAX_DECADES_FOR_125 = 3


class Colors:
    """One stable colour per phase label: blues/greens for training, warm for monitoring."""

    def __init__(self) -> None:
        self._map: dict[tuple[str, str], str] = {}

    def __call__(self, label: str, kind: str) -> str:
        key = (label, kind)
        if key not in self._map:
            pool = _MONITOR_COLORS if kind == "monitor" else _TRAIN_COLORS
            used = sum(1 for k in self._map if (k[1] == "monitor") == (kind == "monitor"))
            self._map[key] = pool[used % len(pool)]
        return self._map[key]


def format_duration(seconds: float) -> str:
    """A duration as people write it: ``500 µs``, ``2 ms``, ``12.5 ms``, ``1.2 s``."""
    return duration(seconds, CHART)


def time_unit(seconds: float) -> tuple[str, float]:
    """The unit for an axis whose values reach ``seconds``, and the factor from seconds."""
    if seconds >= 2.0:
        return "s", 1.0
    if seconds >= 2e-3:
        return "ms", 1e3
    return "µs", 1e6


def log_time_ticks(lo_seconds: float, hi_seconds: float) -> tuple[list[float], list[str],
                                                                  list[float]]:
    """Ticks for a log time axis covering ``lo..hi`` seconds: values, labels, axis range.

    1-2-5 per decade, or one per decade over more than three decades; the range runs from
    the tick at or below ``lo`` to the tick at or above ``hi`` (log10 units, as plotly wants).
    """
    lo = max(min(lo_seconds, hi_seconds), 1e-9)
    hi = max(hi_seconds, lo)
    decades = math.log10(hi) - math.log10(lo)
    mantissas = (1,) if decades > _MAX_DECADES_FOR_125 else (1, 2, 5)
    first = math.floor(math.log10(lo)) - 1
    candidates = [round(m * 10.0 ** k, 12) for k in range(first, math.ceil(math.log10(hi)) + 2)
                  for m in mantissas]
    below = max((v for v in candidates if v <= lo * (1 + 1e-9)), default=candidates[0])
    above = min((v for v in candidates if v >= hi * (1 - 1e-9)), default=candidates[-1])
    values = [v for v in candidates if below <= v <= above]
    if len(values) < 2:  # lo == hi on a tick: frame it with its neighbours
        i = candidates.index(values[0]) if values else 1
        values = candidates[max(0, i - 1):i + 2]
    return values, [format_duration(v) for v in values], [math.log10(values[0]),
                                                          math.log10(values[-1])]


def compact(obj: Any) -> Any:
    """``obj`` with every float rounded to 6 significant digits (a smaller page)."""
    if isinstance(obj, float):
        return float(f"{obj:.6g}") if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: compact(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [compact(v) for v in obj]
    return obj


def drop_empty_traces(fig: dict[str, Any]) -> dict[str, Any]:
    """Leave out the series with no value other than zero or None: no empty legend entry."""
    def has_data(trace: dict[str, Any]) -> bool:
        key = "x" if trace.get("orientation") == "h" else "y"
        return any(v for v in trace.get(key) or [])

    fig["data"] = [t for t in fig["data"] if has_data(t)]
    return fig


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _warmup_shape(first: int, warmup_step_count: int) -> tuple[list[Any], list[Any]]:
    """The shaded band over the warm-up steps and its label (none without warm-up)."""
    if warmup_step_count <= 0 or warmup_step_count <= first:
        return [], []
    x0, x1 = first - 0.5, warmup_step_count - 0.5
    shape = {"type": "rect", "xref": "x", "yref": "paper", "x0": x0, "x1": x1, "y0": 0,
             "y1": 1, "fillcolor": _WARMUP_SHADE, "line": {"width": 0}, "layer": "below"}
    note = {"text": "warm-up", "xref": "x", "yref": "paper", "x": x0, "y": 1,
            "xanchor": "left", "yanchor": "bottom", "showarrow": False,
            "font": {"size": 11, "color": "#666"}}
    return [shape], [note]


def step_time_figure(buckets: list[Bucket], bucket_width: int, warmup_step_count: int,
                     colors: Colors) -> dict[str, Any]:
    """Step time as stacked phases, clipped above 1.5x its 95th percentile, warm-up shaded."""
    x = [b.first for b in buckets]
    totals = [b.seconds / b.steps for b in buckets]
    top = CLIP_FACTOR * _percentile(totals, _CLIP_PERCENTILE)
    clip = max(totals) > top > 0
    unit, scale = time_unit(top if clip else max(totals))  # the unit of the axis shown
    keys: list[tuple[str, str]] = []
    for b in buckets:
        keys.extend(k for k in b.phase_seconds if k not in keys)
    keys.sort(key=lambda k: (k[1] == "monitor", k[0]))
    traces = []
    for label, kind in keys:
        y = [b.phase_seconds.get((label, kind), 0.0) / b.steps * scale for b in buckets]
        name = f"{label} (monitoring)" if kind == "monitor" else label
        traces.append({"type": "bar", "x": x, "y": y, "name": name,
                       "marker": {"color": colors(label, kind)},
                       "hovertemplate": f"step %{{x}}: %{{y:.3f}} {unit}"})
    other = [max(0.0, b.seconds - (sum(b.phase_seconds.values()) - b.between_seconds))
             / b.steps * scale for b in buckets]
    traces.append({"type": "bar", "x": x, "y": other, "name": "other (not in a phase)",
                   "marker": {"color": "#cccccc"},
                   "hovertemplate": f"step %{{x}}: %{{y:.3f}} {unit}"})
    yaxis: dict[str, Any] = {"title": {"text": f"{unit} per step (mean over ranks)"},
                             "rangemode": "tozero"}
    if clip:
        yaxis["range"] = [0, top * scale * 1.06]
        traces += _clip_markers(buckets, totals, top, scale)
    shapes, notes = _warmup_shape(x[0], warmup_step_count)
    title = "step" if bucket_width == 1 else f"step ({bucket_width} per bar)"
    return drop_empty_traces({"data": traces, "layout": {
        "barmode": "stack", "bargap": 0, "height": 450, "shapes": shapes, "annotations": notes,
        "xaxis": {"title": {"text": title}}, "yaxis": yaxis,
        "margin": {"l": 60, "r": 20, "t": 40, "b": 120},
        "legend": {"orientation": "h", "y": -0.3, "yanchor": "top"}}})


def _clip_markers(buckets: list[Bucket], totals: list[float], top: float,
                  scale: float) -> list[dict[str, Any]]:
    """A marker at the top of each clipped bar with its true value: eval steps, training."""
    clipped = [(b, t) for b, t in zip(buckets, totals) if t > top]
    labelled = _spaced_labels([(b.first, t) for b, t in clipped],
                              buckets[-1].first - buckets[0].first + 1)
    out = []
    for name, color, monitored in (("clipped eval step (true value)", "#ff7f0e", True),
                                   ("clipped step (true value)", "#555555", False)):
        group = [(b, t) for b, t in clipped if (b.monitor_seconds > 0) == monitored]
        if not group:
            continue
        out.append({"type": "scatter", "mode": "markers+text",
                    "x": [b.first for b, _ in group], "y": [top * scale * 1.02] * len(group),
                    "text": [format_duration(t) if b.first in labelled else ""
                             for b, t in group],
                    "hovertext": [format_duration(t) for _, t in group],
                    "textposition": "bottom right", "cliponaxis": False,
                    "textfont": {"size": 10, "color": color}, "name": name,
                    "marker": {"symbol": "triangle-up", "size": 9, "color": color},
                    "hovertemplate": "step %{x}: %{hovertext}<extra></extra>"})
    return out


def _spaced_labels(points: list[tuple[int, float]], x_span: int) -> set[int]:
    """The x of the clipped bars whose value is printed: the largest first, none closer than
    a twentieth of the axis to one already printed (the rest on hover), at most 12."""
    chosen: list[int] = []
    for x, _value in sorted(points, key=lambda p: -p[1]):
        if len(chosen) < _MAX_CLIP_LABELS and all(abs(x - c) * 20 >= x_span for c in chosen):
            chosen.append(x)
    return set(chosen)


def overhead_figure(buckets: list[Bucket], bucket_width: int, window_steps: int,
                    budget: float, critical: float) -> dict[str, Any]:
    """Monitoring over training time over the last ``window_steps`` and cumulated."""
    # Over a window of ~window_steps steps, as the 'recent' gauge: one eval step on its
    # own would read as thousands of percent, which says nothing about the budget.
    points = max(1, -(-window_steps // bucket_width))
    x, ratio, cumulative = [], [], []
    mon_total = train_total = 0.0
    recent: list[tuple[float, float]] = []
    for b in buckets:
        in_step = b.monitor_seconds - b.between_seconds
        training = max(b.seconds - in_step, 0.0)
        x.append(b.first)
        recent.append((b.monitor_seconds, training))
        if len(recent) > points:
            recent.pop(0)
        ratio.append(sum(m for m, _ in recent) / max(sum(t for _, t in recent), 1e-12))
        mon_total += b.monitor_seconds
        train_total += training
        cumulative.append(mon_total / max(train_total, 1e-12))
    lo, hi = x[0], x[-1] + bucket_width
    traces = [
        {"type": "scatter", "mode": "lines", "x": x, "y": ratio,
         "name": f"last {window_steps} steps", "line": {"color": "#ff7f0e", "shape": "hv"}},
        {"type": "scatter", "mode": "lines", "x": x, "y": cumulative, "name": "cumulative",
         "line": {"color": "#444", "dash": "dot"}},
    ]
    # No monitoring at all: no ratio series, only the reference lines.
    traces = drop_empty_traces({"data": traces})["data"] + [
        {"type": "scatter", "mode": "lines", "x": [lo, hi], "y": [budget] * 2,
         "name": f"budget {budget:.0%}", "line": {"color": "#e0a800", "dash": "dash"},
         "meta": "reference"},
        {"type": "scatter", "mode": "lines", "x": [lo, hi], "y": [critical] * 2,
         "name": f"critical {critical:.0%}", "line": {"color": "#d62728", "dash": "dash"},
         "meta": "reference"},
    ]
    yaxis: dict[str, Any] = {"title": {"text": "monitoring / training time"},
                             "tickformat": ".0%", "rangemode": "tozero"}
    if len(ratio) > points:
        # The first window holds few training steps (an eval at step 0 reads as several
        # hundred percent): scale to the rest of the run, which the budget is about.
        top = max(max(ratio[points:]), max(cumulative[points:]), critical)
        yaxis["range"] = [0, top * 1.15]
    return {"data": traces, "layout": {"xaxis": {"title": {"text": "step"}}, "yaxis": yaxis}}


def warmup_figure(warmup: dict[int, list[StepRecord]],
                  warmup_step_count: int) -> dict[str, Any]:
    """The first steps of each rank on a log time axis (1-2-5 ticks), warm-up shaded."""
    traces = []
    every = [r.seconds for recs in warmup.values() for r in recs if r.seconds > 0]
    for rank in sorted(warmup):
        recs = warmup[rank]
        traces.append({"type": "scatter", "mode": "lines+markers", "name": f"rank {rank}",
                       "x": [r.step for r in recs], "y": [r.seconds for r in recs],
                       "hovertemplate": "step %{x}: %{y:.3s}s"})
    values, labels, axis_range = log_time_ticks(min(every), max(every))
    first = min(recs[0].step for recs in warmup.values() if recs)
    shapes, notes = _warmup_shape(first, warmup_step_count)
    return drop_empty_traces({"data": traces, "layout": {
        "height": 300, "shapes": shapes, "annotations": notes, "showlegend": len(traces) > 1,
        "xaxis": {"title": {"text": "step"}},
        "yaxis": {"title": {"text": "step time"}, "type": "log", "range": axis_range,
                  "tickmode": "array", "tickvals": values, "ticktext": labels}}})


def gpu_figure(buckets: list[Bucket]) -> dict[str, Any]:
    """GPU utilization (left axis) and memory used (right axis) over the run."""
    x = [b.first for b in buckets]
    traces = [
        {"type": "scatter", "mode": "lines", "x": x, "name": "utilization",
         "y": [b.gpu_util_sum / b.gpu_util_n if b.gpu_util_n else None for b in buckets]},
        {"type": "scatter", "mode": "lines", "x": x, "name": "memory used (GiB)",
         "yaxis": "y2", "y": [b.gpu_mem_max / 2**30 for b in buckets]},
    ]
    return drop_empty_traces({"data": traces, "layout": {
        "height": 300, "xaxis": {"title": {"text": "step"}},
        "yaxis": {"title": {"text": "utilization"}, "tickformat": ".0%", "range": [0, 1]},
        "yaxis2": {"title": {"text": "GiB"}, "overlaying": "y", "side": "right"}}})


def timeline_figure(recs: list[StepRecord], colors: Colors, title: str) -> dict[str, Any]:
    """One step on every rank: a row per rank, a bar per phase from where it started."""
    t0 = min(r.start_ns for r in recs)
    span_seconds = (max(r.end_ns for r in recs) - t0) / 1e9
    unit, scale = time_unit(span_seconds)
    per_ns = scale / 1e9
    hover = f"%{{fullData.name}}: %{{x:.3f}} {unit}<extra>%{{y}}</extra>"
    traces: dict[tuple[str, str, bool], dict[str, Any]] = {}
    rows = []
    for rec in sorted(recs, key=lambda r: r.rank):
        row = f"rank {rec.rank}"
        rows.append(row)
        # The whole step, faint, behind its phases: where no phase covers it is 'other'.
        t = traces.setdefault(("step", "train", True), {
            "type": "bar", "orientation": "h", "name": "train.step", "x": [], "y": [],
            "base": [], "width": 0.9, "showlegend": False, "hovertemplate": hover,
            "marker": {"color": "rgba(0,0,0,0.08)"}})
        t["x"].append((rec.end_ns - rec.start_ns) * per_ns)
        t["y"].append(row)
        t["base"].append((rec.start_ns - t0) * per_ns)
        for label, kind, s, e, top in rec.phases:
            t = traces.get((label, kind, top))
            if t is None:
                name = f"{label} (monitoring)" if kind == "monitor" else label
                t = traces[(label, kind, top)] = {
                    "type": "bar", "orientation": "h", "x": [], "y": [], "base": [],
                    "name": name if top else f"{name} (nested)", "width": 0.6 if top else 0.3,
                    "hovertemplate": hover, "marker": {"color": colors(label, kind),
                                                       "opacity": 1.0 if top else 0.6}}
            t["x"].append((e - s) * per_ns)
            t["y"].append(row)
            t["base"].append((s - t0) * per_ns)
    # A phase too short to see at this scale keeps its hover but not a legend entry.
    visible = span_seconds * scale * 0.004
    for key, t in traces.items():
        if key != ("step", "train", True):
            t["showlegend"] = max(t["x"]) >= visible
    return drop_empty_traces({"data": list(traces.values()), "layout": {
        "title": {"text": title, "x": 0, "font": {"size": 14}},
        "barmode": "overlay", "height": max(240, 170 + 40 * len(recs)),
        "xaxis": {"title": {"text": f"{unit} from the step's start (earliest rank)"}},
        "yaxis": {"categoryorder": "array", "categoryarray": rows[::-1]},
        "margin": {"l": 60, "r": 20, "t": 90, "b": 50},
        "legend": {"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"}}})
