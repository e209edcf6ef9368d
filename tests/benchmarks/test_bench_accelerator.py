"""benchmarks/bench_accelerator.py runs in a smoke mode and prints every figure."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from otel_train.recording import recorder

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_accelerator.py"

pytestmark = pytest.mark.timeout(120)


def test_a_short_run_prints_both_twins_against_the_floor_and_each_other():
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--rounds", "2", "--steps", "20", "--step-us", "50"],
        capture_output=True, text=True, cwd=ROOT, timeout=100)
    out = proc.stdout
    if not recorder.ACCELERATED:
        assert proc.returncode == 1 and "no C accelerator" in out
        return
    assert proc.returncode == 0, proc.stderr[-2000:]
    for section in ("paced (50 us spin", "warm (no spin), 5 rounds of 20 steps"):
        block = out[out.index(section):]
        for name in ("floor", "C", "C again", "pure Python"):
            m = re.search(rf"^  {re.escape(name)} +(\d+) ns   x floor (\d+\.\d+) \[", block,
                          re.M)
            assert m and int(m.group(1)) > 0 and float(m.group(2)) > 0, (name, block)
        assert re.search(r"paired C again / C: +\d\.\d{3} \[", block)
        assert re.search(r"paired C / pure Python: +\d\.\d{3} \[", block)
