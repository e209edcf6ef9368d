"""bench_interference_line.py's smoke mode runs the README's loop in one run and reports."""

from __future__ import annotations

from pathlib import Path

from bench_smoke import run_mlp_smoke


def test_the_smoke_run_prints_the_runs_own_cost_and_its_intervals(tmp_path: Path) -> None:
    out = run_mlp_smoke("bench_interference_line.py", tmp_path)
    assert "== mlp: 2 x 20 steps in one run" in out
    assert "intervals:" in out and "fitted" in out
    assert "share_of_step_time" in out and "cpu_interference_us_per_step" in out
