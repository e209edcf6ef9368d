"""benchmarks/bench_throughput.py runs in a smoke mode and prints every figure."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_throughput.py"

pytestmark = pytest.mark.timeout(120)


def test_the_smoke_run_prints_the_counting_cost_per_batch_kind_and_the_counted_step():
    proc = subprocess.run([sys.executable, str(BENCH), "--smoke"], capture_output=True,
                          text=True, cwd=ROOT, timeout=110)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    for kind in ("token ids", "(x, y) tuple", "dict input_ids", "ambiguous"):
        assert re.search(rf"{re.escape(kind)}.*counting +[+-]\d+ ns/step", out), out
    assert re.search(r"step.count\(tokens=, samples=\): \d+ ns per call", out), out
    assert re.search(r"MLP .* bare +[\d.]+ ms +counted +[\d.]+ ms .* [\d.]+ MFLOP", out), out
