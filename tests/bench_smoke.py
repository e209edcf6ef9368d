"""Running a benchmark's smoke mode from a test: one MLP workload, the run's temp files under
the test's own directory, skipped where there is no per-thread schedstat."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_mlp_smoke(script: str, tmp_path: Path, timeout_seconds: float = 180) -> str:
    """``python benchmarks/<script> --smoke --workloads mlp``'s stdout (exit 0 asserted)."""
    if not Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists():
        pytest.skip("no per-thread schedstat here")
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--smoke",
                           "--workloads", "mlp"], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout_seconds)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout
