"""The costs report (the language of hand-made cost trackers), its atomic file, the table, `otel-train
costs`, and the monitoring-cost table of a hung run replayed at two scales."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from span_trees import feed, monitor_span, step_spans, train_step

from otel_train.derived.budget import BudgetSpanProcessor
from otel_train.derived.costs import CostsFileWriter, CostsReport, build_costs, format_costs_table
from otel_train.common.files import write_json_atomic
from otel_train.rundir.costs import print_costs
from otel_train.derived.overhead import OverheadSpanProcessor
from otel_train.records.steps_view import SharedStepSpanProcessor

pytestmark = pytest.mark.timeout(30)


def report() -> dict:
    ov = OverheadSpanProcessor()
    for i in range(20):
        feed(ov, train_step(i, step_ms=100, monitor_ms=20 if i % 10 == 0 else 0))
    ov.on_end(monitor_span("checkpoint", after_step=19, duration_ms=50))
    return build_costs(ov.snapshot(), 0.05, 0.10, slow_steps=2,
                       slow_operations={"inference": 1}, run_id="r1")


def test_the_report_has_per_operation_costs_total_share_status_and_advice() -> None:
    data = report()
    # training time: 20 steps x 100 ms minus the 40 ms of inference inside them
    assert data["training_time_seconds"] == pytest.approx(1.96)
    assert data["wall_time_seconds"] == pytest.approx(2.05)
    inf = data["operations"]["inference"]
    # the names hand-made cost trackers use
    assert inf["calls"] == 2
    assert inf["total_time"] == pytest.approx(0.04)
    assert inf["mean_time"] == pytest.approx(0.02)
    assert inf["max_time"] == pytest.approx(0.02)
    assert inf["percentage"] == pytest.approx(100 * 0.04 / 1.96, abs=1e-3)
    assert inf["first_seconds"] == pytest.approx(0.02)
    # the same in base units
    assert inf["total_seconds"] == pytest.approx(0.04)
    assert inf["mean_seconds"] == inf["steady_mean_seconds"] == pytest.approx(0.02)
    assert inf["max_seconds"] == pytest.approx(0.02)
    assert inf["share"] == pytest.approx(0.04 / 1.96)
    assert data["total_share"] == pytest.approx(0.09 / 1.96)
    assert data["total_percentage"] == pytest.approx(100 * 0.09 / 1.96, abs=1e-3)
    assert data["wall_share"] == pytest.approx(0.09 / 2.05)
    assert data["budget_status"] == "ok"
    assert data["warmup"]["steps"] == 5
    assert list(data["operations"]) == ["checkpoint", "inference"]  # most expensive first
    assert {a["operation"] for a in data["advisor"]} == {"inference", "checkpoint"}
    json.dumps(data)  # JSON-ready


def test_the_file_is_replaced_atomically_and_no_temporary_is_left(tmp_path: Path) -> None:
    path = tmp_path / "status" / "monitoring_costs.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, report())
    assert json.loads(path.read_text())["run_id"] == "r1"
    assert os.listdir(path.parent) == ["monitoring_costs.json"]


def test_the_writer_writes_at_stop_even_before_its_first_interval(tmp_path: Path) -> None:
    path = tmp_path / "monitoring_costs.json"
    writer = CostsFileWriter(path, report, interval_seconds=3600)
    writer.start()
    writer.stop(1.0)
    assert writer.writes == 1 and json.loads(path.read_text())["steps"] == 20


def test_a_failing_build_is_counted_not_raised(tmp_path: Path) -> None:
    def broken() -> dict:
        raise RuntimeError("boom")
    writer = CostsFileWriter(tmp_path / "c.json", broken, interval_seconds=3600)
    assert writer.write_now() is False and writer.failures == 1


def test_the_table_lists_operations_total_budget_and_advice() -> None:
    text = format_costs_table(report())
    lines = text.splitlines()
    # the verdict first, with the figure that drives it (steady state), then the others
    assert lines[1] == ("monitoring OK: 4.56% of training time in steady state (budget 5%); "
                        "recent 4.59%, total 4.59%")
    header = next(ln for ln in lines if ln.startswith("operation"))
    assert header.split() == ["operation", "calls", "total", "first", "mean", "max", "share"]
    inference = next(ln for ln in lines if ln.startswith("inference"))
    assert inference.split() == ["inference", "2", "40.0ms", "20.0ms", "20.0ms", "20.0ms",
                                 "2.04%"]
    assert any(ln.startswith("TOTAL") and ln.endswith("4.59%") for ln in lines)
    assert lines[2].startswith("warm-up: first 5 steps")
    assert "advisor (steady state" in text
    assert "calls over slow_operation_seconds: inference x1" in text


def test_print_costs_prints_a_file_or_a_directory(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    write_json_atomic(tmp_path / "monitoring_costs.json", report())
    assert print_costs(tmp_path) == 0
    assert "inference" in capsys.readouterr().out
    assert print_costs(tmp_path / "monitoring_costs.json", as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == "r1"
    assert print_costs(tmp_path / "missing.json") == 1


def test_the_report_prints_as_the_table_and_is_still_a_mapping() -> None:
    data = report()
    assert isinstance(data, CostsReport) and isinstance(data, dict)
    assert str(data) == format_costs_table(data)
    assert data["operations"]["inference"]["calls"] == 2
    assert json.loads(json.dumps(data)) == dict(data)


def test_the_runs_root_picks_the_latest_run_and_says_which(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, new = tmp_path / "20261121-100000-aaaaaa", tmp_path / "20261121-090000-bbbbbb"
    write_json_atomic(old / "monitoring_costs.json", {**report(), "run_id": "old"})
    write_json_atomic(new / "monitoring_costs.json", {**report(), "run_id": "new"})
    os.utime(old / "monitoring_costs.json", (1_700_000_000, 1_700_000_000))  # written earlier
    (tmp_path / "no-costs-here").mkdir()
    assert print_costs(tmp_path) == 0
    out, err = capsys.readouterr()
    assert out.startswith("run new rank")
    assert f"latest run under {tmp_path}: {new}" in err
    assert print_costs(tmp_path, as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == "new"  # stdout stays JSON
    empty = tmp_path / "no-costs-here"
    assert print_costs(empty) == 1
    assert "no monitoring_costs*.json" in capsys.readouterr().err


SECOND = 1000.0  # milliseconds


def field_notes_run(setup: str, scale: float, final_eval_seconds: float = 0.0) -> CostsReport:
    """A hung run's monitoring-cost table: 1000 steps x 3.5 s of training, with their monitoring.

    ``scale`` shrinks every duration alike (1.0: the notes' seconds; 0.001: milliseconds):
    the spans are hand-built, so nothing sleeps. ``final_eval_seconds``: a ``run.monitor``
    after the loop.
    """
    ov = OverheadSpanProcessor()
    budget = BudgetSpanProcessor(ov)
    shared = SharedStepSpanProcessor([ov, budget])
    for i in range(1000):
        monitors: list[tuple[str, float]] = []
        if setup == "hung":
            if i % 500 == 499:
                monitors.append(("evolution_snapshot", 180 * SECOND))  # 2 calls x 180 s
            if i % 50 == 49:
                monitors.append(("detail_collector", 0.3 * SECOND))  # 20 calls x 0.3 s
        if i % 200 == 199:
            monitors.append(("live_inference", 3 * SECOND))  # 5 calls x 3 s = 15 s
        if setup == "acceptable" and i % 2 == 1:
            monitors.append(("status_update", 0.004 * SECOND))  # ~2 s in all
        train_ms = 3.5 * SECOND * scale
        phases: list[tuple] = [("data", "train", 0, train_ms * 0.1),
                               ("forward", "train", train_ms * 0.1, train_ms * 0.5),
                               ("backward", "train", train_ms * 0.5, train_ms)]
        t = train_ms
        for name, ms in monitors:
            phases.append((name, "monitor", t, t + ms * scale))
            t += ms * scale
        feed(shared, step_spans(i, phases, t))
    if final_eval_seconds:
        shared.on_end(monitor_span("final_eval", after_step=999,
                                   duration_ms=final_eval_seconds * SECOND * scale))
    return build_costs(ov.snapshot(), budget.budget, budget.critical, run_id=setup)


@pytest.mark.parametrize("scale", [1.0, 0.001])
def test_the_field_notes_hung_setup_is_10_9_percent_and_critical(scale: float) -> None:
    data = field_notes_run("hung", scale)
    # 381 s of monitoring over 3500 s of training, as the notes compute it
    assert data["training_time_seconds"] == pytest.approx(3500 * scale, rel=1e-6)
    assert data["monitoring_time_seconds"] == pytest.approx(381 * scale, rel=1e-6)
    assert data["total_percentage"] == pytest.approx(100 * 381 / 3500, abs=1e-3)  # 10.9%
    assert data["steady_percentage"] == pytest.approx(100 * 381 / 3500, abs=1e-3)
    assert data["budget_status"] == "critical"
    assert data["wall_share"] == pytest.approx(381 / 3881)  # 9.8%: monitoring over wall time
    evo = data["operations"]["evolution_snapshot"]
    assert (evo["calls"], evo["first_seconds"]) == (2, pytest.approx(180 * scale))
    assert evo["total_time"] == pytest.approx(360 * scale)
    assert evo["mean_time"] == evo["max_time"] == pytest.approx(180 * scale)
    assert evo["percentage"] == pytest.approx(100 * 360 / 3500, abs=1e-3)  # 10.3%
    assert data["operations"]["detail_collector"]["percentage"] == pytest.approx(
        100 * 6 / 3500, abs=1e-3)
    assert next(iter(data["operations"])) == "evolution_snapshot"
    advice = {a["operation"]: a for a in data["advisor"]}
    # safe interval: 180 s / (5% x 3.5 s) = 1028.6 -> every 1029 steps
    assert advice["evolution_snapshot"]["min_interval_steps"] == 1029
    assert not advice["evolution_snapshot"]["within_budget"]
    assert advice["detail_collector"]["within_budget"]
    assert "run it every >= 1029 steps" in str(data)
    assert str(data).splitlines()[1] == (
        "monitoring CRITICAL: 10.89% of training time in steady state (over the 10% critical "
        "level); recent 52.46%, total 10.89%")


@pytest.mark.parametrize("scale", [1.0, 0.001])
def test_the_field_notes_acceptable_setup_is_half_a_percent_and_ok(scale: float) -> None:
    data = field_notes_run("acceptable", scale)
    assert data["monitoring_time_seconds"] == pytest.approx(17 * scale, rel=1e-6)
    assert data["total_percentage"] == pytest.approx(100 * 17 / 3500, abs=1e-3)  # 0.5%
    assert data["budget_status"] == "ok"
    assert all(a["within_budget"] for a in data["advisor"])


def test_the_table_says_why_an_ok_verdict_stands_beside_a_total_over_the_budget() -> None:
    # inference every 10 steps of 100 ms: 600 ms on its first call (warm-up), 3 ms after.
    ov = OverheadSpanProcessor(warmup_steps=0)
    for i in range(100):
        monitor_ms = (600 if i == 0 else 3) if i % 10 == 0 else 0
        feed(ov, train_step(i, step_ms=100 + monitor_ms, monitor_ms=monitor_ms))
    data = build_costs(ov.snapshot(), 0.05, 0.10)
    assert data["budget_status"] == "ok" and data["total_share"] > 0.05
    line = str(data).splitlines()[1]
    assert line.startswith("monitoring OK: 0.30% of training time in steady state (budget 5%)")
    assert ("Recent and total are higher: the first calls' warm-up (0.597 s over their steady cost) "
            "counts there once.") in line


def test_a_report_without_a_steady_figure_is_judged_on_its_total_and_says_so() -> None:
    data = {"budget": 0.05, "critical": 0.10, "total_share": 0.07, "recent_share": 0.07}
    assert format_costs_table(data).splitlines()[1] == (
        "monitoring WARNING: 7.00% of training time in total (over the 5% budget); "
        "recent 7.00%")


@pytest.mark.parametrize("scale", [1.0, 0.001])
def test_a_final_evaluation_after_the_loop_is_told_as_once_not_at_an_interval(
        scale: float) -> None:
    data = field_notes_run("acceptable", scale, final_eval_seconds=14)
    advice = {a["operation"]: a for a in data["advisor"]}
    final = advice["final_eval"]
    assert (final["pattern"], final["calls"], final["interval_steps"]) == ("once", 1, None)
    assert final["within_budget"] and final["projected_share"] == pytest.approx(14 / 3500)
    line = f"  ok final_eval: once, {14 * scale:.3g} s = 0.4% of training"
    assert line in str(data).splitlines()  # the table's advisor line, as it reads
    assert advice["live_inference"]["pattern"] == "periodic"
    assert "every 200 steps" in advice["live_inference"]["advice"]


def test_a_run_too_short_for_a_verdict_says_so_in_its_costs_as_the_console_does(
        tmp_path: Path) -> None:
    import time

    import otel_train

    run = otel_train.start_run(exporter="none", prometheus_port=None, report=False,
                               status_dir=str(tmp_path), console=False)
    for step in run.steps(range(6)):
        with step.phase("forward"):
            time.sleep(0.002)
        if step.index == 0:
            with step.monitor("inference"):
                time.sleep(0.02)  # a first call over a few 2 ms steps: hundreds of percent
    costs = run.costs()
    run.shutdown(timeout=10)
    assert costs["verdict_evidence"] == "not enough steps yet (a verdict needs 10)"
    line = str(costs).splitlines()[1]
    assert line.startswith("monitoring verdict: not enough steps yet (a verdict needs 10); so "
                           "far ") and "of training time in steady state, total " in line
    assert not any(word in line for word in ("OK", "WARNING", "CRITICAL"))
    written = json.loads((tmp_path / "monitoring_costs.json").read_text())
    assert written["verdict_evidence"] == costs["verdict_evidence"]
