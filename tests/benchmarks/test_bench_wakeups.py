"""The wake-up benchmark runs end to end (smoke mode): every state's column, the training
thread's row, and how often it was put to sleep per step."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_wakeups.py"


def test_the_smoke_run_prints_each_threads_wakeups_and_cpu_in_each_state(tmp_path) -> None:
    if not Path(f"/proc/self/task/{threading.get_native_id()}/sched").exists():
        pytest.skip("no /proc/<pid>/task/<tid>/sched here")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, str(BENCH), "--smoke", "--workloads", "mlp"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "== mlp: 1 rounds of idle / 40-step bare / 40-step otel blocks" in out, out
    cell = r"\s+\d+\.\d\s+\d+\.\d\d ms"
    assert re.search(rf"^train/MainThread\s+(-|{cell}){cell}{cell}", out, re.M), out
    assert re.search(rf"^train/otel-train-spans\s*{cell}{cell}{cell}", out, re.M), out
    assert re.search(r"^exporter/", out, re.M), out
    for state in ("bare", "otel"):
        assert re.search(rf"training thread put to sleep per step, {state}: \d+\.\d{{3}} ", out)
    assert not list(tmp_path.glob("bench-wakeups-*")), "a run's temp dir is left behind"
