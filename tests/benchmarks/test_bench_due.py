"""The step.due benchmark runs end to end (a few short pairs), so it cannot rot unnoticed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(240)


def test_a_short_run_prints_the_cost_per_call_and_the_paired_ratio() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_due.py"), "--pairs", "3",
         "--steps", "60", "--step-us", "50"],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT,
        timeout=200)
    assert proc.returncode == 0, proc.stderr
    per_call = re.search(r"step.due per call: plain (\d+) ns, governed (\d+) ns", proc.stdout)
    assert per_call and int(per_call.group(1)) > 0 and int(per_call.group(2)) > 0
    ratio = re.search(r"due / modulo block time, median \[95% CI\]\s+(\d+\.\d+) \[", proc.stdout)
    assert ratio and float(ratio.group(1)) > 0, proc.stdout
