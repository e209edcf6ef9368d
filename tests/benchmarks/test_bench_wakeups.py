"""The wake-up benchmark runs end to end (smoke mode): every state's column, the training
thread's row, and how often it was put to sleep per step."""

from __future__ import annotations

import re

from bench_smoke import run_mlp_smoke


def test_the_smoke_run_prints_each_threads_wakeups_and_cpu_in_each_state(tmp_path) -> None:
    out = run_mlp_smoke("bench_wakeups.py", tmp_path)
    assert "== mlp: 1 rounds of idle / 40-step bare / 40-step otel blocks" in out, out
    cell = r"\s+\d+\.\d\s+\d+\.\d\d ms"
    assert re.search(rf"^train/MainThread\s+(-|{cell}){cell}{cell}", out, re.M), out
    assert re.search(rf"^train/otel-train-spans\s*{cell}{cell}{cell}", out, re.M), out
    assert re.search(r"^exporter/", out, re.M), out
    for state in ("bare", "otel"):
        assert re.search(rf"training thread put to sleep per step, {state}: \d+\.\d{{3}} ", out)
    assert not list(tmp_path.glob("bench-wakeups-*")), "a run's temp dir is left behind"
