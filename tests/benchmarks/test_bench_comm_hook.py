"""benchmarks/bench_comm_hook.py: the hook's own work in a smoke run (the paired DDP figure
starts two torch processes: too slow for the suite; its command is in docs/benchmarks.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_comm_hook.py"

pytestmark = pytest.mark.timeout(60)


def test_a_short_run_prints_the_hook_s_added_nanoseconds_per_bucket() -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--calls", "500", "--skip-ddp"],
                          capture_output=True, text=True, cwd=ROOT, timeout=50)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r"inner alone (\d+) ns, timed (\d+) ns, added (-?\d+) ns; a step's summary "
                  r"in the span worker (\d+) ns", proc.stdout)
    assert m and int(m.group(2)) > int(m.group(1)) > 0 and int(m.group(4)) > 0, proc.stdout
