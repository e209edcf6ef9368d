"""``otel-train demo``: trains, prints where everything goes even with --quiet (the banner
stays), and writes the HTML report at the end."""

from __future__ import annotations

import json

from train_helpers import clean_env  # noqa: F401

from otel_train.cli.main import main


def test_a_quiet_demo_still_prints_the_banner_and_where_the_report_went(tmp_path, capsys):
    code = main(["demo", "--steps", "6", "--eval-every", "5", "--quiet",
                 "--prometheus-port", "none", "--status-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0
    assert "otel-train: run " in err
    assert f"spans   -> span file {tmp_path / 'spans.jsonl.gz'}" in err
    assert f"report  -> {tmp_path / 'report.html'} (written at the end)" in err
    assert f"otel-train: report -> {tmp_path / 'report.html'}" in err
    assert (tmp_path / "report.html").stat().st_size > 1_000_000  # plotly.js inlined
    assert "[demo] step" not in out  # quiet: no console timing report
    costs = json.loads((tmp_path / "monitoring_costs.json").read_text())
    assert set(costs["operations"]) == {"inference", "val_loss"}
    assert "inference" in out  # the costs table


def test_no_report_turns_the_report_off(tmp_path, capsys):
    assert main(["demo", "--steps", "2", "--eval-every", "0", "--quiet", "--no-report",
                 "--prometheus-port", "none", "--status-dir", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "report  ->" not in err and "report ->" not in err
    assert not (tmp_path / "report.html").exists()
