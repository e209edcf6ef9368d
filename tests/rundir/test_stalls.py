"""Two gloo ranks on CPU, rank 1 never reaching the all-reduce: each rank's stacks, and what
``otel-train stalls`` and the report make of them."""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from otel_train.cli.main import main
from otel_train.rundir.stalls import read_stall_files, report_section

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]

RANK = '''
import os, sys, time
import torch, torch.distributed as dist
import otel_train
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
# Only rank 0 stalls by its own threshold; rank 1 dumps because rank 0 asks it to.
with otel_train.start_run(stall_seconds=1.0 if rank == 0 else 60.0, run_id="gloo",
                          watchdog_interval_seconds=0.2, prometheus_port=None, console=False,
                          status_dir=sys.argv[1], export_process=False, exporter="none") as run:
    # Two steps: the stall is step 1's; a loaded machine must not add a step 2 (whose
    # all-reduce may wait over 1 s for rank 1, just back from its dump) as rank 0's last.
    for step in run.steps(range(2)):
        if step.index == 1 and rank == 1:
            with step.phase("data_wait"):
                time.sleep(5)  # RANK 1 IS HERE
        with step.phase("allreduce"):
            dist.all_reduce(torch.ones(4))  # RANK 0 WAITS HERE
dist.destroy_process_group()
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def stalled_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("gloo")
    script = tmp / "two_ranks.py"
    script.write_text(textwrap.dedent(RANK))
    run_dir = tmp / "run"
    port = str(_free_port())
    procs = []
    for rank in (0, 1):
        # TORCH_FR_BUFFER_SIZE: torch's flight recorder, which records gloo too on CPU.
        env = dict(os.environ, PYTHONPATH=str(REPO), RANK=str(rank), WORLD_SIZE="2",
                   TORCH_FR_BUFFER_SIZE="200",
                   LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, str(script), str(run_dir)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    for proc in procs:
        _, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err[-3000:]
    return run_dir, script


def _line(script: Path, marker: str) -> int:
    return next(i for i, text in enumerate(script.read_text().splitlines(), 1)
                if marker in text)


def test_rank_0_waits_in_the_all_reduce_and_rank_1_is_where_it_is(
        stalled_run: tuple[Path, Path]) -> None:
    run_dir, script = stalled_run
    files = read_stall_files(run_dir)
    by_rank = {f.rank: f for f in files}
    assert sorted(by_rank) == [0, 1]
    assert by_rank[0].step == 1 and by_rank[0].collective == "all_reduce"
    assert by_rank[0].path.name.endswith("-rank0.txt")
    assert f'File "{script}", line {_line(script, "RANK 0 WAITS")}' in by_rank[0].path.read_text()
    assert by_rank[1].collective is None
    assert by_rank[1].where == f"{script}:{_line(script, 'RANK 1 IS HERE')} <module>"
    assert by_rank[1].reason == "request from rank 0 (stalled at its step 1)"


def test_the_flight_recorder_dump_is_saved_beside_the_stalled_ranks_stacks(
        stalled_run: tuple[Path, Path]) -> None:
    run_dir, _ = stalled_run
    rank0 = [f for f in read_stall_files(run_dir) if f.rank == 0][0]
    assert rank0.flight_recorder is not None
    trace = pickle.loads(rank0.flight_recorder.read_bytes())  # torch's own format
    entries = trace["entries"]
    assert [e["profiling_name"] for e in entries] == ["gloo:all_reduce"] * len(entries)
    assert len(entries) == 2  # step 0's, and step 1's that rank 1 never joined
    status = trace["pg_status"]["0"]
    assert status["last_enqueued_collective"] > status["last_completed_collective"]


def test_otel_train_stalls_says_who_entered_the_collective_and_who_never_did(
        stalled_run: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, script = stalled_run
    assert main(["stalls", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "rank 0 entered all_reduce (step 1)" in out
    assert (f"rank 1 never entered a collective: at {script}:{_line(script, 'RANK 1 IS HERE')}"
            in out)


def test_the_report_has_a_stalls_section_only_when_there_are_stacks(
        stalled_run: tuple[Path, Path], tmp_path: Path) -> None:
    run_dir, _ = stalled_run
    assert "rank 0 entered all_reduce" in report_section(run_dir)
    assert report_section(tmp_path) == ""


def test_otel_train_stalls_says_when_there_are_none(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stalls", str(tmp_path)]) == 1
    assert "no stalls/ files" in capsys.readouterr().err
