"""Two real gloo ranks govern one evaluation: rank 1's evaluation is twice as slow, and both
run it at the same steps, compared step by step; the job never hangs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ddp_support import free_port

pytestmark = pytest.mark.timeout(240)

CHILD = Path(__file__).resolve().parents[1] / "governor_ddp_child.py"
ROOT = Path(__file__).resolve().parents[2]


def test_two_ranks_evaluate_at_identical_steps_while_the_interval_is_governed(
        tmp_path: Path) -> None:
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_RANK=str(rank), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        procs.append(subprocess.Popen(
            [sys.executable, str(CHILD), "--status-dir", str(tmp_path)], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path))
    results = {}
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=200)  # a hang fails here, not forever
            assert proc.returncode == 0, err
            line = json.loads(out.strip().splitlines()[-1])
            results[line["rank"]] = line
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    zero, one = results[0], results[1]
    assert zero["evaluated"] == one["evaluated"]  # step by step
    assert zero["changes"] == one["changes"] and zero["changes"], "no interval was governed"
    first = zero["changes"][0]
    assert first[2] == 50 and first[3] > 50
    gaps = {b - a for a, b in zip(zero["evaluated"], zero["evaluated"][1:-1])}
    assert max(gaps) > 50  # stretched
    assert zero["evaluated"][-1] == 1499  # the forced last-step evaluation ran on both
