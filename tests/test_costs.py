"""The costs report, its atomic file, the table and `otel-train costs`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from span_trees import feed, monitor_span, train_step

from otel_train.costs import (
    CostsFileWriter,
    build_costs,
    format_costs_table,
    main_costs,
    write_json_atomic,
)
from otel_train.overhead import OverheadSpanProcessor

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
    inf = data["operations"]["inference"]
    assert inf["calls"] == 2
    assert inf["total_seconds"] == pytest.approx(0.04)
    assert inf["mean_seconds"] == pytest.approx(0.02)
    assert inf["max_seconds"] == pytest.approx(0.02)
    assert inf["share"] == pytest.approx(0.04 / 2.05)
    assert data["total_share"] == pytest.approx(0.09 / 2.05)
    assert data["total_percentage"] == pytest.approx(100 * 0.09 / 2.05, abs=1e-3)
    assert data["budget_status"] == "ok"
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
    assert "budget 5.0%: OK" in lines[1]
    header = next(ln for ln in lines if ln.startswith("operation"))
    assert header.split() == ["operation", "calls", "total", "mean", "max", "share"]
    inference = next(ln for ln in lines if ln.startswith("inference"))
    assert inference.split() == ["inference", "2", "40.0ms", "20.0ms", "20.0ms", "1.95%"]
    assert any(ln.startswith("TOTAL") and ln.endswith("4.39%") for ln in lines)
    assert "advisor:" in text and "calls over slow_operation_seconds: inference x1" in text


def test_main_costs_prints_a_file_or_a_directory(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    write_json_atomic(tmp_path / "monitoring_costs.json", report())
    assert main_costs([str(tmp_path)]) == 0
    assert "inference" in capsys.readouterr().out
    assert main_costs([str(tmp_path / "monitoring_costs.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["run_id"] == "r1"
    assert main_costs([str(tmp_path / "missing.json")]) == 1
    assert main_costs([]) == 2
