"""A run resumed with the same run id (a second process) links to its first attempt and counts
the time the restart lost: the gap between the attempts and the steps redone since the last
checkpoint (derived/goodput.py, records/envelope_records.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from train_helpers import read_file_spans

from otel_train.common import attributes as A

pytestmark = pytest.mark.timeout(120)

ATTEMPT_SCRIPT = """
import time
T0 = time.time()  # first line: the process started just before
import json, sys
sys.modules["torch"] = None  # sleeping loops need no torch: start in a second, not ten
import otel_train

attempt = int(sys.argv[2])
run = otel_train.start_run(run_id="resumed-run", status_dir=sys.argv[1], prometheus_port=None,
                           console=False, export_interval_seconds=0.1, startup_span=True)
if attempt > 1:
    with run.checkpoint("load"):
        time.sleep(0.05)
since_save = time.time()
for i in range(150 if attempt == 1 else 50):
    with run.step() as step:
        with step.phase("forward"):
            time.sleep(0.01)
    if i == 99:
        with run.checkpoint():
            time.sleep(0.05)
        since_save = time.time()
loop_end = time.time()
run.shutdown()
print(json.dumps({"T0": T0, "loop_end": loop_end, "since_save": loop_end - since_save}))
"""


def attempt(script: Path, run_dir: Path, n: int) -> tuple[float, dict[str, Any]]:
    """Run attempt ``n``; (the time just before it started, its own clock's figures)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    before = time.time()
    proc = subprocess.run([sys.executable, str(script), str(run_dir), str(n)],
                          capture_output=True, text=True, timeout=90, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return before, json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_second_process_with_the_same_run_id_links_to_the_first_and_counts_lost_time(
        tmp_path: Path) -> None:
    script = tmp_path / "attempt.py"
    script.write_text(textwrap.dedent(ATTEMPT_SCRIPT))
    run_dir = tmp_path / "run"
    _, first = attempt(script, run_dir, 1)
    first_env = json.loads((run_dir / "monitoring_costs.json").read_text())["envelope"]
    time.sleep(0.5)  # the job is down between the attempts
    before_second, second = attempt(script, run_dir, 2)
    env = json.loads((run_dir / "monitoring_costs.json").read_text())["envelope"]

    assert (first_env["attempt"], env["attempt"]) == (1, 2)
    # Lost: the first attempt's last step -> the second process's start, and the 50 steps
    # after the first attempt's save (redone from that checkpoint).
    redone = first["since_save"]
    low = before_second - first["loop_end"] + redone
    high = second["T0"] - first["loop_end"] + redone
    print(f"restart lost {env['restart_lost_seconds']:.3f}s, truth within [{low:.3f}, "
          f"{high:.3f}]")
    assert low - 0.1 <= env["restart_lost_seconds"] <= high + 0.1
    assert env["parts_seconds"]["restart_lost"] == pytest.approx(env["restart_lost_seconds"])
    # The whole job: the first attempt's, the gap, the second's; redone steps are not goodput.
    assert env["job_seconds"] > first_env["job_seconds"] + 0.5
    steps = first_env["parts_seconds"]["steps"] - redone
    assert env["parts_seconds"]["steps"] == pytest.approx(steps + 0.5, abs=0.3)  # 50 x 10 ms
    assert env["goodput_ratio"] == pytest.approx(
        env["parts_seconds"]["steps"] / env["job_seconds"])

    spans = read_file_spans(run_dir)
    startups = sorted((s for s in spans if s.name == A.STARTUP_SPAN_NAME),
                      key=lambda s: s.start_ns)
    assert [s.attributes[A.ATTEMPT] for s in startups] == [1, 2]
    assert A.RESTART_PREVIOUS_ATTEMPT not in startups[0].attributes
    assert startups[1].attributes[A.RESTART_PREVIOUS_ATTEMPT] == f"{startups[0].trace_id:032x}"
    assert startups[1].attributes[A.RESTART_LOST_SECONDS] == pytest.approx(
        env["restart_lost_seconds"])
    # The second attempt's first step says so too (with or without the start-up span).
    firsts = sorted((s for s in spans if s.name == A.STEP_SPAN_NAME and s.attributes[A.STEP] == 0),
                    key=lambda s: s.start_ns)
    assert A.ATTEMPT not in firsts[0].attributes
    assert firsts[1].attributes[A.ATTEMPT] == 2
    assert firsts[1].attributes[A.RESTART_LOST_SECONDS] == pytest.approx(
        env["restart_lost_seconds"])
