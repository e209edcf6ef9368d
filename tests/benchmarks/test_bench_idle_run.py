"""The idle-run benchmark runs end to end (smoke mode) and prints both arms and their difference."""

from __future__ import annotations

import re

from bench_smoke import run_mlp_smoke


def test_the_smoke_run_prints_the_blocked_time_with_no_run_and_beside_an_idle_run(
        tmp_path) -> None:
    out = run_mlp_smoke("bench_idle_run.py", tmp_path)
    assert "== mlp: 2 rounds of 20-step bare blocks" in out
    assert re.search(r"blocked per step, no run:\s+-?\d+\.\d us", out), out
    assert re.search(r"blocked per step, idle run:\s+-?\d+\.\d us", out), out
    ci = r"-?\d+\.\d+ \[-?\d+\.\d+, -?\d+\.\d+\]"
    assert re.search(rf"idle run - no run, paired:\s+{ci} us", out), out
    assert not list(tmp_path.glob("bench-idle-*")), "a run's temp dir is left behind"
