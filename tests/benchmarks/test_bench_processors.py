"""The processors benchmark runs end to end (a short run), so it cannot rot unnoticed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_run_prints_the_processors_both_ways_of_feeding_a_frame_and_both_record_twins():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_processors.py"), "--steps", "600",
         "--rounds", "1"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for label in ("processors + metrics (console off) [median]",
                  "span records' views (console off), view by view [median]",
                  "span records' views (console off), a frame at a time [median]",
                  "span records, flat phase rows in pure Python"):
        match = re.search(rf"^{re.escape(label)}\s+(\d+\.\d\d) µs$", proc.stdout, re.M)
        assert match and float(match.group(1)) > 0, proc.stdout
