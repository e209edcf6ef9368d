"""The console report read beside the script's own output: in step order, on time.

Each test runs a real training script in a child interpreter, its own prints and the
console report on one stream (stderr), as a terminal shows them: the console's lines about
step N must come in step order, each warning after its step's line and before later steps'
lines, and every line within a bounded number of steps of its step's end (the README's
promise: ~0.2 s once the run is up, from the first step on; the test allows 1 s).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

STEP_SECONDS = 0.02
STEPS = 120
SLOW_STEP = 45
# Lines must come before the script's print this many steps later (1 s at 20 ms a step):
# a loose bound for a loaded CI machine; the measured lag is printed.
MAX_LAG_STEPS = 50

SCRIPT = """
import sys, time
import otel_train
with otel_train.start_run(log_every=10, prometheus_port=None, status_dir=sys.argv[1],
                          export_process=sys.argv[2] == "1", warmup_steps=2,
                          report=False, device_sync="off") as run:
    for i, step in enumerate(run.steps(range({steps}))):
        with run.phase("forward"):
            time.sleep({slow} if i == {slow_step} else {step})
        print(f"[script] after step {{i}}", file=sys.stderr, flush=True)
"""


@pytest.mark.parametrize("export_process", [True, False], ids=["exporter-process", "in-process"])
def test_console_lines_come_in_step_order_between_the_scripts_own_prints(
        tmp_path: Path, export_process: bool) -> None:
    script = SCRIPT.format(steps=STEPS, slow=0.4, slow_step=SLOW_STEP, step=STEP_SECONDS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTEL_TRAIN"))}
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "run"),
                           "1" if export_process else "0"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Positions in the text, not lines: the script's print() writes its newline apart, so a
    # line of ours may land between a print's text and its newline (a terminal shows it so).
    out = proc.stderr
    script_at = {int(m.group(1)): m.start()
                 for m in re.finditer(r"\[script\] after step (\d+)", out)}
    assert len(script_at) == STEPS
    step_lines = [(m.start(), int(m.group(1))) for m in re.finditer(r"⏱️  step (\d+)", out)]
    slow_warning = out.index(f"slow step {SLOW_STEP}:")

    # In step order, the slow step's warning right after its own line.
    assert [n for _, n in step_lines] == sorted(n for _, n in step_lines)
    assert {n for _, n in step_lines} >= {0, 10, 20, 30, 40, SLOW_STEP, 50, 100}
    assert all(i < slow_warning for i, n in step_lines if n <= SLOW_STEP)
    assert all(i > slow_warning for i, n in step_lines if n > SLOW_STEP)

    # On time: each line before the script's print a bounded number of steps later, the
    # first step's too (before the exporter process is up, the run feeds its console itself).
    lags = []
    for i, n in step_lines:
        later = [k for k, at in script_at.items() if at < i]
        lags.append(max(later) - n if later else 0)
        if n + MAX_LAG_STEPS < STEPS:
            assert i < script_at[n + MAX_LAG_STEPS], (n, out[max(0, i - 400):i + 200])
    print(f"console lag behind the script, in {STEP_SECONDS * 1000:.0f} ms steps: "
          f"max {max(lags)}, median {sorted(lags)[len(lags) // 2]}")
