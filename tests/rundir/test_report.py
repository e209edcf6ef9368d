"""``otel-train report``: the page of a real run opens in a real headless Chromium with no
console error, every chart drawn, and the numbers of monitoring_costs.json; it reads runs in
progress and every rank, and says what to install when plotly is missing."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
from headless_chromium import HeadlessChromium, chromium_binary
from prometheus_server import require_binary
from train_helpers import clean_env, start_test_run  # noqa: F401

from otel_train.cli.main import main
from otel_train.rundir.report import MISSING_PLOTLY, write_report
from otel_train.rundir.report_data import load_run


def _short_run(tmp_path: Path, steps: int = 40, **options) -> Path:
    """A real run: CPU sleeps as phases, an eval every 10 steps, one slow step, a checkpoint."""
    with start_test_run(tmp_path, spans_path=None, costs_interval_seconds=0.1,
                        run_id="report-run", **options) as run:
        for step in run.steps(range(steps), loader="train"):
            with step.phase("forward"):
                time.sleep(0.004 if step.index != 25 else 0.4)  # step 25 is slow
            with step.phase("backward"):
                time.sleep(0.002)
            if step.index % 10 == 0:
                with step.monitor("inference"):
                    time.sleep(0.01)
                with step.monitor("val_loss"):
                    for _ in step.iter_data([1, 2], loader="val"):
                        time.sleep(0.001)
        with run.monitor("checkpoint"):
            time.sleep(0.005)
    return tmp_path


_CHARTS_JS = """Array.from(document.querySelectorAll('.plotly-graph-div')).map(d => ({
  id: d.id,
  traces: (d.data || []).length,
  drawn: d.querySelectorAll('.scatterlayer .trace path.js-line, .barlayer .point path')
          .length,
  width: d.getBoundingClientRect().width}))"""

_COSTS_JS = """Array.from(document.querySelectorAll('table.costs tr[data-operation]')).map(r => ({
  op: r.dataset.operation,
  calls: r.querySelector('.calls').textContent,
  total: r.querySelector('.total').textContent,
  share: r.querySelector('.share').textContent}))"""


def _seconds(text: str) -> float:
    value, unit = text.split()
    return float(value) / (1000.0 if unit == "ms" else 1.0)


def test_the_report_of_a_real_run_opens_in_chromium_with_every_chart_drawn(tmp_path, capsys):
    require_binary("chromium")
    run_dir = _short_run(tmp_path)
    assert main(["report", str(run_dir)]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path == run_dir / "report.html"
    # Self-contained: plotly.js inline, no script fetched from anywhere.
    assert not re.search(r"<script[^>]+src=", path.read_text())
    costs = json.loads((run_dir / "monitoring_costs.json").read_text())
    with HeadlessChromium(chromium_binary()) as browser:
        page = browser.open(path)
        charts = page.evaluate(_CHARTS_JS)
        rows = page.evaluate(_COSTS_JS)
        total = page.evaluate("document.getElementById('summary-total').textContent")
        links = page.evaluate("Array.from(document.querySelectorAll('table.slow a'))"
                              ".map(a => a.getAttribute('href'))")
        targets = page.evaluate("Array.from(document.querySelectorAll('h3[id^=step-]'))"
                                ".map(h => h.id)")
        errors, requests = page.errors, page.requests
        page.close()
    assert errors == []
    assert requests == [path.resolve().as_uri()]  # opened offline: no other request
    ids = {c["id"] for c in charts}
    assert {"fig-step-time", "fig-overhead", "fig-warmup", "fig-step-25"} <= ids
    for chart in charts:
        assert chart["traces"] > 0 and chart["drawn"] > 0 and chart["width"] > 100, chart
    # The costs table shows monitoring_costs.json's numbers.
    assert {r["op"] for r in rows} == set(costs["operations"]) == {
        "inference", "val_loss", "checkpoint"}
    for r in rows:
        op = costs["operations"][r["op"]]
        assert int(r["calls"]) == op["calls"]
        # Shown to 0.1 ms: half of that, plus float slack (0.04055 is shown as "40.6 ms").
        assert _seconds(r["total"]) == pytest.approx(op["total_seconds"], abs=5e-5 + 1e-9)
        assert float(r["share"].rstrip("%")) == pytest.approx(op["share"] * 100, abs=0.005)
    assert float(total.rstrip("%")) == pytest.approx(costs["total_share"] * 100, abs=0.005)
    # Slow steps link to their timeline, and the slowest one is step 25.
    assert links and links[0] == "#step-25"
    assert {link[1:] for link in links} <= set(targets)


def test_the_report_reads_a_run_in_progress_and_a_half_written_line(tmp_path):
    run = start_test_run(tmp_path, spans_path=None, spans_compression="none")
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
        with start_test_run(tmp_path, spans_path=None, rank=rank, world_size=2,
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


def test_without_plotly_the_report_says_which_extra_to_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "plotly", None)
    monkeypatch.setitem(sys.modules, "plotly.io", None)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert MISSING_PLOTLY in err and "otel-train[report]" in err


def test_removed_span_files_and_missing_steps_are_counted_on_the_page(tmp_path):
    _short_run(tmp_path, steps=30)
    (tmp_path / "spans.removed.json").write_text(json.dumps(
        {"removed_files": 2, "removed_bytes": 10, "removed_spans": 1234}))
    html = write_report(tmp_path).read_text()
    assert re.search(r"removed by spans_total_max_bytes.*?<td class='count'>1,234</td>", html)
    assert re.search(r"steps missing from the span files, rank 0</th><td class='count'>0<",
                     html)


def test_a_run_with_the_console_on_says_where_the_report_goes_and_writes_it(tmp_path, capsys):
    with start_test_run(tmp_path, spans_path=None, console=True) as run:
        for step in run.steps(range(3)):
            with step.phase("forward"):
                pass
    err = capsys.readouterr().err
    path = tmp_path / "report.html"
    assert f"  report  -> {path} (written at shutdown)" in err
    assert f"otel-train: report -> {path}" in err
    assert load_run(tmp_path).steps_per_rank == {0: 3} and path.exists()


def test_the_report_follows_the_console_unless_the_option_says_otherwise(tmp_path, capsys):
    with start_test_run(tmp_path / "quiet", spans_path=None, console=False):
        pass
    with start_test_run(tmp_path / "asked", spans_path=None, console=False, report=True):
        pass
    with start_test_run(tmp_path / "off", spans_path=None, console=True, report=False):
        pass
    assert not (tmp_path / "quiet" / "report.html").exists()
    assert (tmp_path / "asked" / "report.html").exists()
    assert not (tmp_path / "off" / "report.html").exists()
    err = capsys.readouterr().err
    assert "report  ->" not in err and "report ->" not in err
