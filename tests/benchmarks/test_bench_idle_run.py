"""The idle-run benchmark runs end to end (smoke mode) and prints both arms and their difference."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_idle_run.py"


def test_the_smoke_run_prints_the_blocked_time_with_no_run_and_beside_an_idle_run(
        tmp_path) -> None:
    if not Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists():
        pytest.skip("no per-thread schedstat here")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, str(BENCH), "--smoke", "--workloads", "mlp"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "== mlp: 2 rounds of 20-step bare blocks" in out
    assert re.search(r"blocked per step, no run:\s+-?\d+\.\d us", out), out
    assert re.search(r"blocked per step, idle run:\s+-?\d+\.\d us", out), out
    ci = r"-?\d+\.\d+ \[-?\d+\.\d+, -?\d+\.\d+\]"
    assert re.search(rf"idle run - no run, paired:\s+{ci} us", out), out
    assert not list(tmp_path.glob("bench-idle-*")), "a run's temp dir is left behind"
