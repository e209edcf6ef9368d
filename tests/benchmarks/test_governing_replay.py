"""The seed replay: the field notes' hung set-up is critical without governing, ok or warning
with it; the script prints the table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from governing_replay import seed_table  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_the_hung_set_up_is_critical_when_reported_and_within_warning_when_governed() -> None:
    rows = {(r["steps"], r["budget_action"]): r for r in seed_table((1000, 5000))}
    for steps in (1000, 5000):
        reported, governed = rows[steps, "report"], rows[steps, "govern"]
        assert reported["status"] == "critical"
        assert reported["steady_share"] == pytest.approx(381 / 3500, abs=1e-3)  # 10.9%
        assert governed["status"] in ("ok", "warning")
        assert governed["steady_share"] < 0.06
        # The 180 s snapshot is stretched; the cheap collector and inference are not.
        assert governed["intervals"].split("/")[1:] == ["50", "200"]
        assert int(governed["intervals"].split("/")[0]) > 1000
    assert rows[5000, "govern"]["status"] == "ok"  # a long run converges inside the budget


def test_the_replay_script_prints_the_table() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "governing_replay.py"),
                           "--steps", "1000"], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].startswith("steps | budget_action")
    assert lines[2].endswith("| critical") and lines[2].startswith("1000 | report")
    assert lines[3].startswith("1000 | govern") and lines[3].endswith("| warning")
