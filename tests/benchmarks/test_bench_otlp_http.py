"""The OTLP/HTTP request benchmark runs end to end (one short round), so it cannot rot."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_otlp_http.py"


def test_a_short_run_prints_each_transport_and_delivers_every_span():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("OTEL_TRAIN_HTTP_LEAN_TRANSPORT", None)
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--rounds", "2", "--requests", "3", "--spans", "32"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:] + out
    figures = dict(re.findall(r"^  (\S.*?)\s+(\d+) us  \(\d+\.\d\dx\)$", out, re.M))
    assert set(figures) == {"requests, thread per request (before)", "requests, reused threads",
                            "urllib3, reused threads", "lean POST, thread per request",
                            "lean POST, reused threads (now)"}
    assert all(int(v) > 0 for v in figures.values())
    assert "spans delivered: 960/960" in out  # 5 configurations x 2 rounds x 3 x 32
