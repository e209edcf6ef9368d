"""``otel-train report RUN_DIR``: one self-contained HTML file that opens offline.

The page holds the plotly.js *basic* bundle inline (``assets/plotly-basic.min.js``, MIT,
bar/scatter/pie only: no network, no server, no Python plotting package) and, read from the
run directory (``report_data.py``): the monitoring verdict as the console words it, step time
over the run as stacked phases (clipped, warm-up shaded, eval steps marked), the monitoring
overhead ratio over time against the budget and critical lines, warm-up on a log axis, the
monitoring-costs table with the advisor (``monitoring_costs*.json``), the slowest steps with
their breakdowns, a timeline of chosen steps across every rank behind a selector (each
labelled with why it is shown: ``report_steps.py``), dropped and removed spans, and GPU
utilization and memory when they were recorded. Charts: ``report_charts.py``; tables:
``report_tables.py``. A 300-step run's page is ~1.25 MB, almost all of it plotly.js.

Usage::

    path = write_report(Path("otel-train-runs/<run id>"))   # -> <run dir>/report.html
    otel-train report otel-train-runs/<run id>
"""

from __future__ import annotations

import html
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any

from otel_train.rundir.report_charts import (
    Colors,
    compact,
    format_duration,
    gpu_figure,
    overhead_figure,
    step_time_figure,
    timeline_figure,
    warmup_figure,
)
from otel_train.rundir.report_data import RunData, load_run
from otel_train.rundir.report_device import device_section
from otel_train.rundir.stalls import report_section as stalls_section
from otel_train.rundir.report_envelope import envelope_section
from otel_train.rundir.report_tables import (
    costs_section,
    drops_section,
    slow_section,
    summary_table,
)
from otel_train.rundir.report_throughput import throughput_section
from otel_train.rundir.run_dirs import NothingToRead
from otel_train.rundir.summaries import read_summaries, summary_section

REPORT_NAME = "report.html"
PLOTLY_ASSET = "assets/plotly-basic.min.js"
_plotly_js: str | None = None


def plotly_js() -> str:
    """The plotly.js basic bundle shipped with the package (read once per process)."""
    global _plotly_js
    if _plotly_js is None:
        _plotly_js = (resources.files("otel_train.rundir") / PLOTLY_ASSET).read_text("utf-8")
    return _plotly_js


def report_path(run_dir: str | os.PathLike[str]) -> Path:
    """Where ``write_report`` writes the report of ``run_dir``."""
    return Path(run_dir) / REPORT_NAME


def shutdown_banner_line(status_dir: Path) -> str:
    """The start-up banner's line for the report."""
    return f"  report  -> {report_path(status_dir)} (written at shutdown)"


def write_report_at_shutdown(status_dir: Path, time_limit_seconds: float = 60.0,
                             announce: bool = True,
                             costs: list[dict[str, Any]] | None = None) -> Path | None:
    """Write the report as a run ends and say where (stderr); log, never raise: training is
    over, it did not fail. ``costs``: see :func:`write_report`."""
    import logging
    import sys

    log = logging.getLogger("otel_train")
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
    data = load_run(Path(run_dir), max_buckets=max_buckets,
                    time_limit_seconds=time_limit_seconds, costs=costs)
    if not data.spans and not allow_empty:
        raise NothingToRead(f"the span files of {run_dir} hold no span yet")
    target = Path(out) if out is not None else report_path(run_dir)
    page = _Page(data).render()
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, target)  # a browser reloading it never sees half a page
    return target


class _Page:
    """One report page: sections in reading order, every chart's figure in one JSON block."""

    def __init__(self, data: RunData, window_steps: int = 100) -> None:
        self.data = data
        self.window_steps = window_steps
        self.colors = Colors()
        self.charts: dict[str, dict[str, Any]] = {}
        self.timelines: dict[str, dict[str, Any]] = {}
        costs = data.costs[0] if data.costs else {}
        self.budget = float(costs.get("budget") or 0.05)
        self.critical = float(costs.get("critical") or 0.10)

    def chart(self, div_id: str, fig: dict[str, Any]) -> str:
        """A chart's place on the page; its figure goes into the page's JSON."""
        self.charts[div_id] = fig
        return f"<div class='chart' id='{div_id}'></div>"

    def render(self) -> str:
        """The whole HTML page."""
        d = self.data
        sections = [
            summary_table(d),
            self._section("Step time over the run", self._step_time()),
            self._section("Monitoring overhead over time", self._overhead()),
            self._section("Throughput", throughput_section(
                self, [b for b in self._buckets() if b.steps], max(1, len(d.ranks)))),
            self._section("What monitoring costs", costs_section(d)),
            self._section("Where the job's time went", envelope_section(d)),
            self._section("Slowest steps", slow_section(d)),
            self._section("Warm-up", self._warmup()),
            self._section("Timeline of chosen steps, every rank", self._timeline()),
            self._section("Dropped, removed and cut-off spans", drops_section(d)),
            self._section("GPU", self._gpu()),
        ]
        device = device_section(d)
        if device:  # runs on an accelerator: where its time went, from events
            sections.insert(-1, self._section("Device time per phase", device))
        if d.summary_spans:  # span_mode="summary": the per-phase figures of each interval
            sections.insert(1, self._section("Summaries", summary_section(
                read_summaries(d.run_dir))))
        stalls = stalls_section(d.run_dir)
        if stalls:  # only runs that stalled
            sections.insert(1, self._section("Stalls", stalls))
        figures = json.dumps(compact({"charts": self.charts, "timeline": self.timelines}),
                             separators=(",", ":")).replace("</", "<\\/")
        title = f"otel-train report: run {html.escape(str(d.run_id))}"
        return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
                f"<title>{title}</title><style>{_CSS}</style></head><body>"
                f"<h1>{title}</h1>" + "".join(sections)
                + f"<script>{plotly_js()}</script>"
                + f"<script type='application/json' id='report-figures'>{figures}</script>"
                + f"<script>{_JS}</script></body></html>")

    def _section(self, title: str, body: str) -> str:
        anchor = "".join(c for c in title.lower().split(",")[0].replace(" ", "-")
                         if c.isalnum() or c == "-")  # an id inside '...': no quote
        return f"<section id='{anchor}'><h2>{html.escape(title)}</h2>{body}</section>"

    def _buckets(self) -> list[Any]:
        return [self.data.buckets[k] for k in sorted(self.data.buckets)]

    def _step_time(self) -> str:
        buckets = [b for b in self._buckets() if b.steps]
        if not buckets:
            return "<p class='empty'>No finished step in the span files yet.</p>"
        fig = step_time_figure(buckets, self.data.bucket_width, self.data.warmup_step_count,
                               self.colors)
        clipped = "range" in fig["layout"]["yaxis"]
        return self.chart("fig-step-time", fig) + (
            "<p class='note'>Each bar is a step's phases stacked (monitoring in warm colours). "
            + ("Bars above 1.5x the 95th percentile are cut at the top of the axis; a "
               "triangle gives the true value (orange: an eval step). " if clipped else "")
            + ("The shaded band is the warm-up the costs leave out of the steady state."
               if self.data.warmup_step_count else "") + "</p>")

    def _overhead(self) -> str:
        buckets = [b for b in self._buckets() if b.steps]
        if not buckets:
            return "<p class='empty'>No step yet.</p>"
        fig = overhead_figure(buckets, self.data.bucket_width, self.window_steps,
                              self.budget, self.critical)
        return self.chart("fig-overhead", fig) + (
            f"<p class='note'>Monitoring time over training time (step time minus its "
            f"monitoring phases) over the last {self.window_steps} steps at each point; "
            "monitoring between steps counts as monitoring. The dotted line accumulates from "
            "the start of the run; the verdict above uses the steady state.</p>")

    def _warmup(self) -> str:
        d = self.data
        if not any(d.warmup.values()):
            return "<p class='empty'>No step yet.</p>"
        note = ""
        steady = d.typical_seconds
        if steady:
            first = max(rs[0].seconds for rs in d.warmup.values() if rs)
            note = (f"<p class='note'>First step {format_duration(first)} "
                    f"({first / steady:.1f}x the typical {format_duration(steady)}).</p>")
        return self.chart("fig-warmup", warmup_figure(d.warmup, d.warmup_step_count)) + note

    def _timeline(self) -> str:
        d = self.data
        if not d.timeline_steps:
            return "<p class='empty'>No step yet.</p>"
        buttons = []
        selected = next((s for s, labels in d.timeline_labels.items() if "slowest" in labels),
                        next(iter(d.timeline_steps)))
        for step, recs in d.timeline_steps.items():
            why = ", ".join(d.timeline_labels.get(step, []))
            took = format_duration(max(r.seconds for r in recs))
            self.timelines[str(step)] = timeline_figure(
                recs, self.colors, f"step {step}: {why} ({took})")
            on = "true" if step == selected else "false"
            buttons.append(f"<button type='button' id='step-{step}' data-step='{step}' "
                           f"aria-pressed='{on}'><b>step {step}</b> {html.escape(why)}"
                           f" <span class='took'>{took}</span></button>")
        return ("<p class='note'>Pick a step: each row is a rank; bars start where the phase "
                "started, relative to the earliest rank. A rank whose bars end late is a "
                "straggler.</p><div class='timeline-picker'>" + "".join(buttons) + "</div>"
                + f"<div class='chart' id='fig-timeline' data-default='{selected}'></div>")

    def _gpu(self) -> str:
        buckets = [b for b in self._buckets() if b.gpu_util_n or b.gpu_mem_max]
        if not buckets:
            return ("<p class='empty'>No GPU reading in this run (no NVML or no GPU: "
                    "<code>train.gpu.*</code> attributes are set only when sampled).</p>")
        return self.chart("fig-gpu", gpu_figure(buckets))


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
.chart{min-height:200px}.verdict{font-weight:500}
.timeline-picker{display:flex;flex-wrap:wrap;gap:6px;margin:8px 0}
.timeline-picker button{font:inherit;font-size:13px;padding:4px 10px;border:1px solid #ccc;
border-radius:4px;background:#f7f7f7;cursor:pointer}
.timeline-picker button[aria-pressed=true]{background:#1f77b4;border-color:#1f77b4;color:#fff}
.timeline-picker .took{opacity:.75}
"""

# Draws every chart from the page's JSON, and the timeline picked (a button, or #step-N).
_JS = """(function () {
var figs = JSON.parse(document.getElementById('report-figures').textContent);
var axis = {gridcolor: '#ebf0f8', linecolor: '#ebf0f8', zerolinecolor: '#ebf0f8',
            automargin: true};
var template = {layout: {paper_bgcolor: '#fff', plot_bgcolor: '#fff', xaxis: axis,
  yaxis: axis, hovermode: 'closest', font: {family: 'system-ui, sans-serif', size: 12,
  color: '#2a3f5f'}}};
var config = {displaylogo: false, responsive: true};
function draw(el, fig) {
  var layout = Object.assign({template: template, height: 360,
                              margin: {l: 60, r: 20, t: 40, b: 50}}, fig.layout);
  el.style.height = layout.height + 'px';  // the next section starts below the chart
  return Plotly.react(el, fig.data, layout, config);
}
Object.keys(figs.charts).forEach(function (id) {
  draw(document.getElementById(id), figs.charts[id]);
});
var box = document.getElementById('fig-timeline');
var buttons = Array.prototype.slice.call(document.querySelectorAll('.timeline-picker button'));
function pick(step) {
  if (!box || !figs.timeline[step]) { return false; }
  buttons.forEach(function (b) {
    b.setAttribute('aria-pressed', String(b.dataset.step === String(step)));
  });
  draw(box, figs.timeline[step]);
  return true;
}
function fromHash() {
  var m = /^#step-(\\d+)$/.exec(location.hash);
  return m ? pick(m[1]) : false;
}
buttons.forEach(function (b) {
  b.addEventListener('click', function () { pick(b.dataset.step); });
});
window.addEventListener('hashchange', fromHash);
if (box && !fromHash()) { pick(box.dataset.default); }
})();"""
