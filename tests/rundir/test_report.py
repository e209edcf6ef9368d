"""``otel-train report``: the page of a real run opens offline in a real headless Chromium
with no console error; every chart, and every step's timeline, draws data (screenshots of
each plot area, with and without its series); the headline is the console's budget verdict;
times read on sane axes; no empty column or legend entry; 300 steps stay under 1.5 MB; it
reads runs in progress and every rank, with no Python plotting package."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from headless_chromium import HeadlessChromium, Page, chromium_binary
from prometheus_server import require_binary
from train_helpers import clean_env, start_in_process_run  # noqa: F401

from otel_train.cli.main import main
from otel_train.derived.costs import format_costs_table
from otel_train.rundir.report import write_report
from otel_train.rundir.report_charts import Colors, log_time_ticks, step_time_figure
from otel_train.rundir.report_data import Bucket, load_run
from otel_train.rundir.report_tables import html_table

CHARTS = ("fig-step-time", "fig-overhead", "fig-warmup", "fig-timeline", "fig-throughput")
# A chart "drew its data" when at least this many pixels of its plot area (at half scale)
# change as its series are hidden: a line is hundreds, a bar chart thousands.
MIN_DRAWN_PIXELS = 50


def _short_run(tmp_path: Path, steps: int = 40, sleep_seconds: float = 0.004,
               **options: Any) -> Path:
    """A real run: CPU sleeps as phases, an eval every 10 steps, one slow step, a checkpoint."""
    with start_in_process_run(tmp_path, spans_path=None, costs_interval_seconds=0.1,
                        run_id="report-run", **options) as run:
        for step in run.steps(range(steps), loader="train"):
            with step.phase("forward"):
                time.sleep(sleep_seconds if step.index != 25 else 0.4)  # step 25 is slow
            with step.phase("backward"):
                time.sleep(sleep_seconds / 2)
            if step.index % 10 == 0:
                with step.monitor("inference"):
                    time.sleep(0.01)
                with step.monitor("val_loss"):
                    for _ in step.iter_data([1, 2], loader="val"):
                        time.sleep(0.001)
        with run.monitor("checkpoint"):
            time.sleep(0.005)
    return tmp_path


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A real run's report (through the command), open in headless Chromium: (path, page)."""
    require_binary("chromium")
    with pytest.MonkeyPatch.context() as mp:
        for name in list(os.environ):
            if name.startswith("OTEL_"):
                mp.delenv(name)
        # Throughput counted: 512 tokens a step, 2 MFLOP a step on a 1 GFLOP/s "device".
        run_dir = _short_run(tmp_path_factory.mktemp("report"), tokens_per_step=512,
                             flops_per_step=2e6, peak_flops_per_second=1e9)
        assert main(["report", str(run_dir)]) == 0
    path = run_dir / "report.html"
    with HeadlessChromium(chromium_binary()) as browser:
        page = browser.open(path)
        yield path, page
        page.close()


def _click_timeline(page: Page, step: str) -> None:
    page.evaluate(f"document.getElementById('step-{step}').click()")
    page.evaluate("new Promise(done => requestAnimationFrame(() => done(1)))")


def test_the_report_of_a_real_run_opens_offline_in_chromium_with_no_error(report):
    path, page = report
    # Self-contained: plotly.js inline, no script fetched from anywhere.
    assert not re.search(r"<script[^>]+src=", path.read_text())
    assert page.errors == []
    assert page.requests == [path.resolve().as_uri()]  # opened offline: no other request


def test_every_chart_and_every_timeline_draws_data(report):
    _path, page = report
    drawn = {chart: page.drawn_pixels(chart) for chart in CHARTS}
    assert all(n >= MIN_DRAWN_PIXELS for n in drawn.values()), drawn
    for step in page.evaluate("Array.from(document.querySelectorAll('.timeline-picker "
                              "button')).map(b => b.dataset.step)"):
        _click_timeline(page, step)
        assert page.drawn_pixels("fig-timeline") >= MIN_DRAWN_PIXELS, step
    assert page.errors == []


def test_the_drawn_data_check_reads_an_emptied_chart_as_empty(report):
    _path, page = report
    assert page.drawn_pixels("fig-warmup") >= MIN_DRAWN_PIXELS
    # The same chart with its series emptied (axes, reference lines and legend kept).
    page.evaluate("(() => { const gd = document.getElementById('fig-warmup'); "
                  "window.keptData = gd.data; return Plotly.react(gd, gd.data.map(t => "
                  "Object.assign({}, t, {x: [], y: []})), gd.layout).then(() => 1); })()")
    try:
        assert page.drawn_pixels("fig-warmup") == 0
    finally:  # the other tests read the same page
        page.evaluate("Plotly.react('fig-warmup', window.keptData, document.getElementById("
                      "'fig-warmup').layout).then(() => 1)")


def test_the_throughput_figure_is_the_counted_tokens_over_the_counted_steps_time(report):
    path, page = report
    data = load_run(path.parent)
    tokens = sum(b.tokens for b in data.buckets.values())
    seconds = sum(b.counted_seconds for b in data.buckets.values())
    assert tokens == 512 * 40
    shown = page.evaluate("document.getElementById('throughput-figure').textContent")
    rate = tokens / seconds
    assert shown.startswith(f"{rate / 1e3:.1f}k tokens/s per rank" if rate >= 1e3
                            else f"{rate:.1f} tokens/s per rank"), shown
    assert "MFU" in shown
    # It says which time it counts: whole steps, against the job table's steps without
    # the monitoring inside them (counted there as evaluation).
    assert f"in {seconds:.1f} s of steps (whole steps, the monitoring inside them included; " \
        "the job's time by part counts that monitoring apart, as evaluation)" in shown
    envelope = json.loads((path.parent / "monitoring_costs.json").read_text())["envelope"]
    assert envelope["parts_seconds"]["steps"] < seconds
    traces = page.evaluate("document.getElementById('fig-throughput').data.map(t => t.name)")
    assert traces == ["tokens/s per rank", "MFU"]


def test_the_headline_is_the_budget_verdict_the_console_prints(report):
    path, page = report
    costs = json.loads((path.parent / "monitoring_costs.json").read_text())
    console = format_costs_table(costs).splitlines()[1]  # "monitoring STATUS: x% ..."
    headline = page.evaluate("document.getElementById('summary-verdict').textContent")
    costs_line = page.evaluate("document.querySelector('#what-monitoring-costs .verdict')"
                               ".textContent")
    assert f"monitoring {headline}" == costs_line == console
    # The figure that drives the status comes first, labelled; recent and total after.
    steady = f"{costs['steady_share']:.2%} of training time in steady state"
    assert headline.startswith(f"{costs['budget_status'].upper()}: {steady}")
    assert headline.index("steady state") < headline.index("total")


def test_the_costs_table_shows_the_numbers_of_monitoring_costs_json(report):
    path, page = report
    costs = json.loads((path.parent / "monitoring_costs.json").read_text())
    rows = page.evaluate("""Array.from(document.querySelectorAll(
      'table.costs tr[data-operation]')).map(r => ({op: r.dataset.operation,
      calls: r.querySelector('.calls').textContent, total: r.querySelector('.total')
      .textContent, share: r.querySelector('.share').textContent}))""")
    assert {r["op"] for r in rows} == set(costs["operations"]) == {
        "inference", "val_loss", "checkpoint"}
    for r in rows:
        op = costs["operations"][r["op"]]
        assert int(r["calls"]) == op["calls"]
        # Shown to 0.1 ms: half of that, plus float slack (0.04055 is shown as "40.6 ms").
        value, unit = r["total"].split()
        seconds = float(value) / (1000.0 if unit == "ms" else 1.0)
        assert seconds == pytest.approx(op["total_seconds"], abs=5e-5 + 1e-9)
        assert float(r["share"].rstrip("%")) == pytest.approx(op["share"] * 100, abs=0.005)


def test_the_warmup_chart_has_1_2_5_log_ticks_labelled_with_their_unit(report):
    _path, page = report
    ticks = page.evaluate("Array.from(document.querySelectorAll('#fig-warmup .ytick text'))"
                          ".map(t => t.textContent)")
    assert len(ticks) >= 3
    seconds = []
    for tick in ticks:
        m = re.fullmatch(r"([125])(0*) (µs|ms|s)", tick)
        assert m, ticks
        seconds.append(int(m[1] + m[2]) * {"µs": 1e-6, "ms": 1e-3, "s": 1.0}[m[3]])
    assert seconds == sorted(seconds)  # in order up the axis, not "2, 0.1, 5, 2, 0.01, 5"


def test_log_time_ticks_are_1_2_5_per_decade_or_one_per_decade_when_wide():
    values, labels, axis_range = log_time_ticks(0.004, 0.255)
    assert labels == ["2 ms", "5 ms", "10 ms", "20 ms", "50 ms", "100 ms", "200 ms", "500 ms"]
    assert values[0] == 0.002 and values[-1] == 0.5
    assert axis_range == pytest.approx([-2.69897, -0.30103], abs=1e-5)
    _, wide, _ = log_time_ticks(3e-5, 4.0)
    assert wide == ["10 µs", "100 µs", "1 ms", "10 ms", "100 ms", "1 s", "10 s"]


def test_timelines_are_sorted_by_step_and_say_why_each_is_shown(report):
    path, page = report
    data = load_run(path.parent)
    labels = data.timeline_labels
    assert list(labels) == sorted(labels) == list(data.timeline_steps)
    assert labels[0][0].startswith("first step") and "slowest" in labels[25]
    evals = [s for s, why in labels.items() if "eval" in why]
    typical = [s for s, why in labels.items() if "typical (median)" in why]
    assert len(evals) == 1 and evals[0] % 10 == 0 and evals[0] > 0  # one eval stands for all
    assert len(typical) == 1 and typical[0] % 10 != 0 and typical[0] != 25
    buttons = page.evaluate("Array.from(document.querySelectorAll('.timeline-picker button'))"
                            ".map(b => [b.dataset.step, b.textContent])")
    assert [int(b[0]) for b in buttons] == list(labels)
    for (step, text), why in zip(buttons, labels.values()):
        assert text.startswith(f"step {step} {', '.join(why)} ")
    # The page opens on the slowest step.
    assert page.evaluate("document.getElementById('fig-timeline').dataset.default") == "25"
    assert "id='step-25' data-step='25' aria-pressed='true'" in path.read_text()
    # A slowest step's link picks its timeline.
    links = page.evaluate("Array.from(document.querySelectorAll('table.slow a'))"
                          ".map(a => a.getAttribute('href'))")
    assert links[0] == "#step-25"
    _click_timeline(page, str(typical[0]))
    page.evaluate("location.hash = '#step-25'; new Promise(d => setTimeout(() => d(1), 50))")
    title = page.evaluate("document.querySelector('#fig-timeline .gtitle').textContent")
    assert title.startswith("step 25: slowest")
    assert page.evaluate("document.getElementById('step-25').getAttribute('aria-pressed')") \
        == "true"


_EMPTY_COLUMNS_JS = """Array.from(document.querySelectorAll('table')).filter(t =>
  t.rows.length > 1 && t.rows[0].querySelector('th + th')).flatMap(t =>
  Array.from(t.rows[0].cells).map((th, i) => [th.textContent, Array.from(t.rows).slice(1)
    .some(r => r.cells[i] && r.cells[i].textContent.trim() !== '')]))
  .filter(c => !c[1]).map(c => c[0])"""

_EMPTY_LEGEND_JS = """Array.from(document.querySelectorAll('.js-plotly-plot')).flatMap(gd =>
  gd.data.filter(t => t.showlegend !== false && !(t.orientation === 'h' ? t.x : t.y)
    .some(v => v)).map(t => gd.id + ': ' + t.name))"""


def test_no_table_column_and_no_legend_entry_is_without_data(report):
    _path, page = report
    assert page.evaluate(_EMPTY_COLUMNS_JS) == []
    assert page.evaluate(_EMPTY_LEGEND_JS) == []
    headers = page.evaluate("Array.from(document.querySelectorAll('table.slow th'))"
                            ".map(th => th.textContent)")
    assert "rank" not in headers  # one rank: the column would say 0 on every row


def test_a_table_leaves_out_a_column_no_row_has_a_value_in():
    table = html_table(["step", "flag", "time"], [["1", "", "2 ms"], ["2", "", "3 ms"]], "t")
    assert "flag" not in table and "<th>time</th>" in table
    assert "slow" in html_table(["step", "flag"], [["1", ""], ["2", "slow"]], "t")


def test_step_time_is_clipped_above_the_usual_steps_with_the_true_values_marked(tmp_path):
    data = load_run(_short_run(tmp_path))
    buckets = [data.buckets[k] for k in sorted(data.buckets)]
    fig = step_time_figure(buckets, 1, warmup_step_count=5, colors=Colors())
    assert fig["layout"]["yaxis"]["range"][1] < 100  # ms: the 0.4 s step sets no scale
    marks = {t["name"]: t for t in fig["data"] if t["type"] == "scatter"}
    slow = marks["clipped step (true value)"]
    assert 25 in slow["x"] and float(slow["text"][slow["x"].index(25)].split()[0]) >= 400
    # Eval steps stand out: their monitoring phases, in their own colours, only there.
    inference = next(t for t in fig["data"] if t["name"] == "inference (monitoring)")
    assert [x for x, y in zip(inference["x"], inference["y"]) if y] == [0, 10, 20, 30]
    warmup = fig["layout"]["shapes"][0]
    assert (warmup["x0"], warmup["x1"]) == (-0.5, 4.5)


def test_a_slow_first_step_and_eval_steps_are_clipped_and_marked_apart():
    # The run: step 0 takes 255 ms, steps 5 ms, an eval every 50 steps 100 ms.
    buckets = []
    for i in range(300):
        b = Bucket(i, 1, steps=1, seconds=0.255 if i == 0 else 0.1 if i % 50 == 25 else 0.005)
        b.phase_seconds[("forward", "train")] = min(b.seconds, 0.005)
        if i % 50 == 25:
            b.phase_seconds[("inference", "monitor")] = b.monitor_seconds = 0.095
        buckets.append(b)
    fig = step_time_figure(buckets, 1, warmup_step_count=1, colors=Colors())
    assert fig["layout"]["yaxis"]["range"][1] < 10  # ms: 5 ms steps fill the chart
    marks = {t["name"]: (t["x"], t["text"]) for t in fig["data"] if t["type"] == "scatter"}
    assert marks["clipped step (true value)"] == ([0], ["255 ms"])
    assert marks["clipped eval step (true value)"][0] == [25, 75, 125, 175, 225, 275]
    assert set(marks["clipped eval step (true value)"][1]) == {"100 ms"}


def test_a_300_step_report_stays_under_1_5_mb(tmp_path):
    _short_run(tmp_path, steps=300, sleep_seconds=0.0005)
    size = write_report(tmp_path).stat().st_size
    print(f"report of 300 steps: {size / 1e6:.2f} MB")
    assert size < 1_500_000


def test_the_report_needs_no_python_plotting_package(tmp_path, monkeypatch, capsys):
    _short_run(tmp_path, steps=12)
    monkeypatch.setitem(sys.modules, "plotly", None)  # an import of it would fail
    assert main(["report", str(tmp_path)]) == 0
    assert Path(capsys.readouterr().out.strip()).stat().st_size > 0


def test_the_report_reads_a_run_in_progress_and_a_half_written_line(tmp_path):
    run = start_in_process_run(tmp_path, spans_path=None, spans_compression="none")
    try:
        for step in run.steps(range(12), loader="train"):
            with step.phase("forward"):
                pass
        run.flush()
        with open(run.spans_path, "a") as fh:
            fh.write('{"resourceSpans":[{"resource"')  # a line being written right now
        data = load_run(tmp_path)
        assert data.steps_per_rank == {0: 12}
        assert write_report(tmp_path).exists()
    finally:
        run.shutdown()


def test_every_rank_is_read_and_the_timeline_shows_each_rank(tmp_path):
    for rank in (0, 1):
        with start_in_process_run(tmp_path, spans_path=None, rank=rank, world_size=2,
                            run_id="two") as run:
            for step in run.steps(range(30), loader="train"):
                with step.phase("forward"):
                    time.sleep(0.03 if (rank, step.index) == (1, 20) else 0.001)
    data = load_run(tmp_path)
    assert data.ranks == {0, 1} and data.steps_per_rank == {0: 30, 1: 30}
    assert data.slow_steps[0].step == 20 and data.slow_steps[0].rank == 1
    # The straggler's step is on the timeline with both ranks, not only the slow one.
    assert sorted(r.rank for r in data.timeline_steps[20]) == [0, 1]
    assert all(r.phases for r in data.timeline_steps[20])
    assert data.missing_steps() == {0: 0, 1: 0}


def test_a_long_run_is_downsampled_to_bounded_buckets(tmp_path):
    _short_run(tmp_path, steps=60)
    data = load_run(tmp_path, max_buckets=16)
    assert len(data.buckets) <= 16 and data.bucket_width == 4
    assert sum(b.steps for b in data.buckets.values()) == 60
    html = write_report(tmp_path, max_buckets=16).read_text()
    assert "4 steps per point (downsampled)" in html


def test_removed_span_files_and_missing_steps_are_counted_on_the_page(tmp_path):
    _short_run(tmp_path, steps=30)
    (tmp_path / "spans.removed.json").write_text(json.dumps(
        {"removed_files": 2, "removed_bytes": 10, "removed_spans": 1234}))
    html = write_report(tmp_path).read_text()
    assert re.search(r"removed by spans_total_max_bytes.*?<td class='count'>1,234</td>", html)
    assert re.search(r"steps missing from the span files, rank 0</th><td class='count'>0<",
                     html)


def test_a_run_with_the_console_on_says_where_the_report_goes_and_writes_it(tmp_path, capsys):
    with start_in_process_run(tmp_path, spans_path=None, console=True) as run:
        for step in run.steps(range(3)):
            with step.phase("forward"):
                pass
    err = capsys.readouterr().err
    path = tmp_path / "report.html"
    assert f"  report  -> {path} (written at shutdown)" in err
    assert f"otel-train: report -> {path}" in err
    assert load_run(tmp_path).steps_per_rank == {0: 3} and path.exists()


def test_the_report_follows_the_console_unless_the_option_says_otherwise(tmp_path, capsys):
    with start_in_process_run(tmp_path / "quiet", spans_path=None, console=False):
        pass
    with start_in_process_run(tmp_path / "asked", spans_path=None, console=False, report=True):
        pass
    with start_in_process_run(tmp_path / "off", spans_path=None, console=True, report=False):
        pass
    assert not (tmp_path / "quiet" / "report.html").exists()
    assert (tmp_path / "asked" / "report.html").exists()
    assert not (tmp_path / "off" / "report.html").exists()
    err = capsys.readouterr().err
    assert "report  ->" not in err and "report ->" not in err


def test_device_values_left_out_and_what_the_own_cost_leaves_out_are_on_the_page(tmp_path):
    _short_run(tmp_path, steps=30)
    costs = next(tmp_path.glob("monitoring_costs*.json"))
    data = json.loads(costs.read_text())
    data["dropped_attributes"] = {"device_value_not_ready": 3}
    data["own_cost"]["device_work"] = {"charged": "sync waits at training boundaries",
                                       "left_out": "the waits at monitoring boundaries"}
    costs.write_text(json.dumps(data))
    html = write_report(tmp_path).read_text()
    assert re.search(r"attribute values left out \(device_value_not_ready\), rank 0</th>"
                     r"<td class='count'>3<", html)
    assert "left out: the waits at monitoring boundaries" in html


def test_the_step_rings_detours_are_counted_on_the_page(tmp_path):
    _short_run(tmp_path, steps=30)
    costs = next(tmp_path.glob("monitoring_costs*.json"))
    data = json.loads(costs.read_text())
    data["step_ring"] = {"steps_built_in_exporter_process": 30, "markers_unmatched": 4,
                         "late_records": 3, "resent_spans": 0, "full_dropped_spans": 0}
    costs.write_text(json.dumps(data))
    html = write_report(tmp_path).read_text()
    assert re.search(r"queued records not there when their place was read \(lost ones "
                     r"counted above by reason\), rank 0</th><td class='count'>4<", html)
    assert re.search(r"exported after steps that ended later, rank 0</th>"
                     r"<td class='count'>3<", html)
    assert "exported again from the training process" not in html  # 0: not shown
