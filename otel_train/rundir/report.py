"""``otel-train report RUN_DIR``: one self-contained HTML file that opens offline.

The page holds plotly.js inline (no network, no server) and, read from the run directory
(``report_data.py``): step time over the run as stacked phases (training, monitoring, data
per loader), the monitoring overhead ratio over time against the budget and critical lines,
the monitoring-costs table with the advisor (``monitoring_costs*.json``), the slowest steps
with their breakdowns (each links to its timeline), warm-up, a timeline of chosen steps
across every rank (a straggler's bars end late), dropped and removed spans, and GPU
utilization and memory when they were recorded. Plotly is the optional ``report`` extra.

Usage::

    path = write_report(Path("otel-train-runs/<run id>"))   # -> <run dir>/report.html
    otel-train report otel-train-runs/<run id>
"""

from __future__ import annotations

import html
import os
import statistics
import time
from pathlib import Path
from typing import Any

from otel_train.rundir.report_data import RunData, StepRecord, load_run
from otel_train.rundir.run_dirs import NothingToRead

REPORT_NAME = "report.html"
MISSING_PLOTLY = ("otel-train report needs plotly (the 'report' extra): "
                  "pip install 'otel-train[report]'  (or: pip install plotly)")
_TRAIN_COLORS = ["#1f77b4", "#2ca02c", "#17becf", "#9467bd", "#8c564b", "#7f7f7f", "#bcbd22"]
_MONITOR_COLORS = ["#ff7f0e", "#d62728", "#e377c2", "#ffbb78", "#ff9896"]
_CONFIG = {"displaylogo": False, "responsive": True}


def _plotly() -> Any:
    try:
        import plotly.io as pio
    except ImportError:
        raise ImportError(MISSING_PLOTLY) from None
    return pio


def report_path(run_dir: str | os.PathLike[str]) -> Path:
    """Where ``write_report`` writes the report of ``run_dir``."""
    return Path(run_dir) / REPORT_NAME


def plotly_available() -> bool:
    """Whether the 'report' extra (plotly) is installed."""
    import importlib.util

    return importlib.util.find_spec("plotly") is not None


def report_enabled(options: Any) -> bool:
    """Whether a run writes its report at shutdown: option ``report``, else the console's."""
    wanted = options.report if options.report is not None else options.console
    return bool(wanted)


def shutdown_banner_line(status_dir: Path) -> str:
    """The start-up banner's line for the report."""
    if not plotly_available():
        return f"  report  -> off ({MISSING_PLOTLY.split(': ', 1)[1]})"
    return f"  report  -> {report_path(status_dir)} (written at shutdown)"


def write_report_at_shutdown(status_dir: Path, time_limit_seconds: float = 60.0,
                             announce: bool = True,
                             costs: list[dict[str, Any]] | None = None) -> Path | None:
    """Write the report as a run ends and say where (stderr); log, never raise: training is
    over, it did not fail. ``costs``: see :func:`write_report`."""
    import logging
    import sys

    log = logging.getLogger("otel_train")
    if not plotly_available():
        return None
    try:
        path = write_report(status_dir, time_limit_seconds=time_limit_seconds, costs=costs)
    except Exception as exc:
        log.warning("otel-train: the report could not be written: %r (try `otel-train "
                    "report %s`)", exc, status_dir)
        return None
    if announce:
        print(f"otel-train: report -> {path}", file=sys.stderr, flush=True)
    return path


def write_report(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
                 max_buckets: int = 2000, time_limit_seconds: float | None = None,
                 allow_empty: bool = True, costs: list[dict[str, Any]] | None = None) -> Path:
    """Render the report of ``run_dir`` (finished or in progress); return its path.

    With ``allow_empty=False``, a run whose span files hold no span raises
    :class:`NothingToRead` and nothing is written. ``costs`` (``run.costs()`` of each rank)
    stand in for the costs files of a live run, which lag it by ``costs_interval_seconds``.
    """
    pio = _plotly()
    data = load_run(Path(run_dir), max_buckets=max_buckets,
                    time_limit_seconds=time_limit_seconds, costs=costs)
    if not data.spans and not allow_empty:
        raise NothingToRead(f"the span files of {run_dir} hold no span yet")
    target = Path(out) if out is not None else report_path(run_dir)
    page = _Page(data, pio).render()
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, target)  # a browser reloading it never sees half a page
    return target


class _Colors:
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


class _Page:
    def __init__(self, data: RunData, pio: Any, window_steps: int = 100) -> None:
        self.data = data
        self.window_steps = window_steps
        self.pio = pio
        self.colors = _Colors()
        self.figures = 0
        self._template: dict[str, Any] | None = None
        costs = data.costs[0] if data.costs else {}
        self.budget = float(costs.get("budget") or 0.05)
        self.critical = float(costs.get("critical") or 0.10)

    def figure(self, fig: dict[str, Any], div_id: str, height: int = 360) -> str:
        layout = fig.setdefault("layout", {})
        layout.setdefault("height", height)
        layout.setdefault("margin", {"l": 60, "r": 20, "t": 40, "b": 50})
        if self._template is None:
            self._template = self.pio.templates["plotly_white"].to_plotly_json()
        layout.setdefault("template", self._template)
        # plotly.js goes in once, inline, with the first figure: the file opens offline.
        first = self.figures == 0
        self.figures += 1
        return self.pio.to_html(fig, include_plotlyjs=True if first else False,
                                full_html=False, div_id=div_id, config=_CONFIG,
                                validate=False)

    def render(self) -> str:
        d = self.data
        sections = [
            self._summary(),
            self._section("Step time over the run", self._step_time()),
            self._section("Monitoring overhead over time", self._overhead()),
            self._section("What monitoring costs", self._costs()),
            self._section("Slowest steps", self._slow()),
            self._section("Warm-up", self._warmup()),
            self._section("Timeline of chosen steps, every rank", self._timeline()),
            self._section("Dropped and removed spans", self._drops()),
            self._section("GPU", self._gpu()),
        ]
        title = f"otel-train report: run {html.escape(str(d.run_id))}"
        return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
                f"<title>{title}</title><style>{_CSS}</style></head><body>"
                f"<h1>{title}</h1>" + "".join(sections) + "</body></html>")

    def _section(self, title: str, body: str) -> str:
        anchor = title.lower().split(",")[0].replace(" ", "-")
        return f"<section id='{anchor}'><h2>{html.escape(title)}</h2>{body}</section>"

    # -- sections -------------------------------------------------------------------------
    def _summary(self) -> str:
        d = self.data
        steps = sum(d.steps_per_rank.values())
        files = ", ".join(p.name for p in d.files) or "none"
        costs = d.costs[0] if d.costs else {}
        status = html.escape(str(costs.get("budget_status", "unknown")))
        rows = [
            ("run directory", html.escape(str(d.run_dir))),
            ("ranks", str(len(d.ranks) or "?")),
            ("steps read (all ranks)", f"{steps:,}"),
            ("spans read", f"{d.spans:,}"),
            ("span files", html.escape(files)),
            ("monitoring", f"<span class='status-{status}' id='summary-total'>"
                           f"{_pct(costs.get('total_share'))}</span> of training time, budget "
                           f"{self.budget:.1%} ({status})" if costs else "no monitoring_costs.json"),
            ("chart resolution", "every step" if d.bucket_width == 1 else
             f"{d.bucket_width} steps per point (downsampled)"),
            ("generated", html.escape(time.strftime("%Y-%m-%d %H:%M:%S %z"))),
        ]
        if d.stopped_early:
            rows.append(("partial", f"<b>reading stopped at the time limit ("
                         f"{html.escape(d.stopped_early)})</b>: run <code>otel-train report "
                         f"{html.escape(str(d.run_dir))}</code> for the whole run"))
        return "<table class='kv'>" + "".join(
            f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"

    def _buckets(self) -> list[Any]:
        return [self.data.buckets[k] for k in sorted(self.data.buckets)]

    def _step_time(self) -> str:
        buckets = [b for b in self._buckets() if b.steps]
        if not buckets:
            return "<p class='empty'>No finished step in the span files yet.</p>"
        x = [b.first for b in buckets]
        keys: list[tuple[str, str]] = []
        for b in buckets:
            for k in b.phase_seconds:
                if k not in keys:
                    keys.append(k)
        keys.sort(key=lambda k: (k[1] == "monitor", k[0]))
        traces = []
        for label, kind in keys:
            y = [b.phase_seconds.get((label, kind), 0.0) / b.steps for b in buckets]
            name = f"{label} (monitoring)" if kind == "monitor" else label
            traces.append({"type": "bar", "x": x, "y": y, "name": name,
                           "marker": {"color": self.colors(label, kind)}})
        other = [max(0.0, b.seconds / b.steps - (sum(b.phase_seconds.values())
                                                 - b.between_seconds) / b.steps)
                 for b in buckets]
        traces.append({"type": "bar", "x": x, "y": other, "name": "other (not in a phase)",
                       "marker": {"color": "#dddddd"}})
        width = self.data.bucket_width
        return self.figure({"data": traces, "layout": {
            "barmode": "stack", "bargap": 0,
            "xaxis": {"title": {"text": "step" if width == 1 else f"step ({width} per bar)"}},
            "yaxis": {"title": {"text": "seconds per step (mean over ranks)"}},
            "legend": {"orientation": "h", "y": -0.2}}}, "fig-step-time", 420)

    def _overhead(self) -> str:
        buckets = [b for b in self._buckets() if b.steps]
        if not buckets:
            return "<p class='empty'>No step yet.</p>"
        # Over a window of ~window_steps steps, as the 'recent' gauge: one eval step on its
        # own would read as thousands of percent, which says nothing about the budget.
        points = max(1, -(-self.window_steps // self.data.bucket_width))
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
        lo, hi = x[0], x[-1] + self.data.bucket_width
        traces = [
            {"type": "scatter", "mode": "lines", "x": x, "y": ratio,
             "name": f"last {self.window_steps} steps",
             "line": {"color": "#ff7f0e", "shape": "hv"}},
            {"type": "scatter", "mode": "lines", "x": x, "y": cumulative, "name": "cumulative",
             "line": {"color": "#444", "dash": "dot"}},
            {"type": "scatter", "mode": "lines", "x": [lo, hi], "y": [self.budget] * 2,
             "name": f"budget {self.budget:.0%}", "line": {"color": "#e0a800", "dash": "dash"}},
            {"type": "scatter", "mode": "lines", "x": [lo, hi], "y": [self.critical] * 2,
             "name": f"critical {self.critical:.0%}",
             "line": {"color": "#d62728", "dash": "dash"}},
        ]
        yaxis: dict[str, Any] = {"title": {"text": "monitoring / training time"},
                                 "tickformat": ".0%", "rangemode": "tozero"}
        if len(ratio) > points:
            # The first window holds few training steps (an eval at step 0 reads as several
            # hundred percent): scale to the rest of the run, which the budget is about.
            top = max(max(ratio[points:]), max(cumulative[points:]), self.critical)
            yaxis["range"] = [0, top * 1.15]
        return self.figure({"data": traces, "layout": {
            "xaxis": {"title": {"text": "step"}}, "yaxis": yaxis}}, "fig-overhead") + (
            f"<p class='note'>Monitoring time over training time (step time minus its "
            f"monitoring phases) over the last {self.window_steps} steps at each point; "
            "monitoring between steps counts as monitoring. The dotted line accumulates from "
            "the start of the run.</p>")

    def _costs(self) -> str:
        if not self.data.costs:
            return "<p class='empty'>No monitoring_costs*.json in the run directory yet.</p>"
        out = []
        for c in self.data.costs:
            rank = html.escape(str(c.get("rank", "?")))
            status = html.escape(str(c.get("budget_status", "?")))
            out.append(f"<h3>{html.escape(c['_file'])} (rank {rank})</h3><p>monitoring "
                       f"<b class='total-share'>{_pct(c.get('total_share'))}</b> of training time"
                       + (f", steady state {_pct(c.get('steady_share'))}"
                          if c.get("steady_share") is not None else "")
                       + f" (recent {_pct(c.get('recent_share'))}) over {c.get('steps', 0)} "
                       f"steps; budget {float(c.get('budget') or 0):.1%}: "
                       f"<b class='status-{status}'>{status.upper()}</b></p>")
            rows = []
            for name, op in (c.get("operations") or {}).items():
                rows.append(
                    f"<tr data-operation='{html.escape(str(name))}'><td>{html.escape(str(name))}"
                    f"</td><td class='calls'>{int(op.get('calls', 0))}</td>"
                    f"<td class='total'>{_secs(op.get('total_seconds'))}</td>"
                    f"<td class='mean'>{_secs(op.get('mean_seconds'))}</td>"
                    f"<td class='max'>{_secs(op.get('max_seconds'))}</td>"
                    f"<td class='share'>{_pct(op.get('share'))}</td></tr>")
            if not rows:
                rows.append("<tr><td colspan='6'>no monitoring operation recorded</td></tr>")
            out.append("<table class='costs'><tr><th>operation</th><th>calls</th><th>total</th>"
                       "<th>mean</th><th>max</th><th>share of training</th></tr>"
                       + "".join(rows) + "</table>")
            advice = c.get("advisor") or []
            if advice:
                items = "".join(
                    f"<li class='{'ok' if a.get('within_budget') else 'over'}'>"
                    f"{html.escape(str(a.get('advice', '')))}</li>" for a in advice)
                out.append(f"<p>Advisor:</p><ul class='advisor'>{items}</ul>")
        return "".join(out)

    def _slow(self) -> str:
        d = self.data
        if not d.slow_steps:
            return "<p class='empty'>No step yet.</p>"
        typical = _median([r.seconds for rs in d.warmup.values() for r in rs[len(rs) // 2:]])
        rows = []
        for rec in d.slow_steps[:20]:
            parts = sorted(rec.breakdown().items(), key=lambda kv: -kv[1])
            total = rec.seconds or 1e-12
            text = ", ".join(f"{html.escape(k)} {_secs(v)} ({v / total:.0%})"
                             for k, v in parts[:5])
            link = (f"<a href='#step-{rec.step}'>timeline</a>"
                    if rec.step in d.timeline_steps else "")
            factor = f"{rec.seconds / typical:.1f}x" if typical else ""
            flag = "slow" if rec.slow else ""
            rows.append(f"<tr><td>{rec.step}</td><td>{rec.rank}</td><td>{_secs(rec.seconds)}"
                        f"</td><td>{factor}</td><td>{flag}</td><td>{text}</td><td>{link}</td>"
                        "</tr>")
        return (f"<p>{d.slow_flagged} step(s) flagged slow (<code>train.slow</code>); the "
                f"{min(20, len(d.slow_steps))} slowest, with their phases:</p>"
                "<table class='slow'><tr><th>step</th><th>rank</th><th>time</th>"
                "<th>x typical</th><th>flag</th><th>breakdown</th><th></th></tr>"
                + "".join(rows) + "</table>")

    def _warmup(self) -> str:
        d = self.data
        if not d.warmup:
            return "<p class='empty'>No step yet.</p>"
        traces = []
        for rank in sorted(d.warmup):
            recs = d.warmup[rank]
            traces.append({"type": "scatter", "mode": "lines+markers", "name": f"rank {rank}",
                           "x": [r.step for r in recs], "y": [r.seconds for r in recs]})
        steady = _median([r.seconds for rs in d.warmup.values() for r in rs[len(rs) // 2:]])
        note = ""
        if steady:
            first = [rs[0].seconds for rs in d.warmup.values() if rs]
            note = (f"<p class='note'>First step {_secs(max(first))} "
                    f"({max(first) / steady:.1f}x the typical {_secs(steady)}).</p>")
        return self.figure({"data": traces, "layout": {
            "xaxis": {"title": {"text": "step"}},
            "yaxis": {"title": {"text": "step seconds"}, "type": "log"}}},
            "fig-warmup", 300) + note

    def _timeline(self) -> str:
        d = self.data
        if not d.timeline_steps:
            return "<p class='empty'>No step yet.</p>"
        out = ["<p class='note'>The slowest steps and a typical one. Each row is a rank; bars "
               "start where the phase started, relative to the earliest rank. A rank whose "
               "bars end late is a straggler.</p>"]
        for step, recs in d.timeline_steps.items():
            out.append(f"<h3 id='step-{step}'>step {step}</h3>")
            out.append(self.figure(self._gantt(recs), f"fig-step-{step}",
                                   max(260, 160 + 40 * len(recs))))
        return "".join(out)

    def _gantt(self, recs: list[StepRecord]) -> dict[str, Any]:
        t0 = min(r.start_ns for r in recs)
        traces: dict[tuple[str, str, bool], dict[str, Any]] = {}
        rows = []
        for rec in sorted(recs, key=lambda r: r.rank):
            row = f"rank {rec.rank}"
            rows.append(row)
            key = ("step", "train", True)
            t = traces.setdefault(key, {"type": "bar", "orientation": "h", "name": "train.step",
                                        "x": [], "y": [], "base": [], "width": 0.9,
                                        "marker": {"color": "rgba(0,0,0,0.08)"}})
            t["x"].append((rec.end_ns - rec.start_ns) / 1e6)
            t["y"].append(row)
            t["base"].append((rec.start_ns - t0) / 1e6)
            for label, kind, s, e, top in rec.phases:
                key = (label, kind, top)
                t = traces.get(key)
                if t is None:
                    name = f"{label} (monitoring)" if kind == "monitor" else label
                    t = traces[key] = {
                        "type": "bar", "orientation": "h", "x": [], "y": [], "base": [],
                        "name": name if top else f"{name} (nested)", "width": 0.6 if top else 0.3,
                        "marker": {"color": self.colors(label, kind),
                                   "opacity": 1.0 if top else 0.6}}
                t["x"].append((e - s) / 1e6)
                t["y"].append(row)
                t["base"].append((s - t0) / 1e6)
        return {"data": list(traces.values()), "layout": {
            "barmode": "overlay",
            "xaxis": {"title": {"text": "milliseconds from the step's earliest start"}},
            "yaxis": {"categoryorder": "array", "categoryarray": rows[::-1]},
            "margin": {"l": 60, "r": 20, "t": 70, "b": 50},
            "legend": {"orientation": "h", "x": 0, "y": 1.02, "yanchor": "bottom"}}}

    def _drops(self) -> str:
        d = self.data
        rows = []
        for c in d.costs:
            dropped = c.get("dropped_spans")
            if isinstance(dropped, dict):
                for reason, n in sorted(dropped.items()):
                    rows.append((f"dropped ({html.escape(str(reason))}), rank "
                                 f"{c.get('rank', '?')}", int(n)))
        for r in d.removed:
            rows.append((f"removed by spans_total_max_bytes ({html.escape(r['_file'])})",
                         int(r.get("removed_spans", 0))))
        for rank, n in sorted(d.missing_steps().items()):
            rows.append((f"steps missing from the span files, rank {rank}", n))
        if d.torn_lines:
            rows.append(("unreadable lines (torn writes)", d.torn_lines))
        body = "".join(f"<tr><th>{k}</th><td class='count'>{v:,}</td></tr>" for k, v in rows)
        return ("<table class='kv drops'>" + body + "</table><p class='note'>Dropped spans "
                "are counted by reason in <code>otel_train_spans_dropped_total</code>; a step "
                "missing here was dropped, sampled out, or not written yet.</p>")

    def _gpu(self) -> str:
        buckets = [b for b in self._buckets() if b.gpu_util_n or b.gpu_mem_max]
        if not buckets:
            return ("<p class='empty'>No GPU reading in this run (no NVML or no GPU: "
                    "<code>train.gpu.*</code> attributes are set only when sampled).</p>")
        x = [b.first for b in buckets]
        traces = [
            {"type": "scatter", "mode": "lines", "x": x, "name": "utilization",
             "y": [b.gpu_util_sum / b.gpu_util_n if b.gpu_util_n else None for b in buckets]},
            {"type": "scatter", "mode": "lines", "x": x, "name": "memory used (GiB)",
             "yaxis": "y2", "y": [b.gpu_mem_max / 2**30 for b in buckets]},
        ]
        return self.figure({"data": traces, "layout": {
            "xaxis": {"title": {"text": "step"}},
            "yaxis": {"title": {"text": "utilization"}, "tickformat": ".0%", "range": [0, 1]},
            "yaxis2": {"title": {"text": "GiB"}, "overlaying": "y", "side": "right"}}},
            "fig-gpu", 300)


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def _secs(v: Any) -> str:
    if v is None:
        return "-"
    v = float(v)
    if v >= 1.0:
        return f"{v:.3f} s"
    return f"{v * 1000:.1f} ms"


def _pct(v: Any) -> str:
    return "-" if v is None else f"{float(v) * 100:.2f}%"


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;
max-width:1200px;color:#222;padding:0 16px}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ddd;padding-bottom:4px;
margin-top:32px}h3{font-size:15px;margin:16px 0 4px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
td,th{border:1px solid #e3e3e3;padding:3px 8px;text-align:left}
table.costs td:not(:first-child){text-align:right;font-variant-numeric:tabular-nums}
table.kv th{background:#fafafa;font-weight:500}
.status-ok{color:#2a7d2a}.status-warning{color:#b07d00}.status-critical{color:#c62828}
ul.advisor li.over{color:#c62828}ul.advisor li.ok{color:#2a7d2a}
.note{color:#666;font-size:12px}.empty{color:#888;font-style:italic}
"""
