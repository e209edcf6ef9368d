"""The step-interference benchmark runs end to end (smoke mode) and prints both block kinds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_step_interference.py"
_SIGNED = r"\s+[+-]\d+\.\d"


def test_the_smoke_run_prints_each_block_kinds_steps_beside_otel_train_and_their_extra_cpu(
        tmp_path) -> None:
    if not Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists():
        pytest.skip("no per-thread schedstat here")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, str(BENCH), "--smoke"], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "== mlp: 1 rounds of 800-step blocks" in out, out
    for kind in ("idle", "active"):
        # CPU per step, otel-train's CPU per step, share of steps beside, median/mean/per step
        line = rf"^{kind}\s+\d+\s+\d+\.\d\s+\d+\.\d%(?:(?:{_SIGNED}){{3}}|  \(no [a-z ]+\))$"
        assert re.search(line, out, re.M), out
    active_bg = float(re.search(r"^active\s+\d+\s+(\d+\.\d)", out, re.M).group(1))
    idle_bg = float(re.search(r"^idle\s+\d+\s+(\d+\.\d)", out, re.M).group(1))
    assert active_bg > idle_bg  # the active blocks are the ones otel-train exports from
    assert re.search(rf"^active - idle:{_SIGNED} us of training-thread CPU per step", out, re.M)
    assert not list(tmp_path.glob("bench-interference-*")), "the run's temp dir is left behind"
