"""Real runs whose phases are sleeps of known length, for the tests of ``otel-train compare``:
forward dominates the step, backward and optimizer are short, a monitoring phase (an eval)
runs every ``eval_every`` steps.

Each phase is a number of short sleeps (``UNIT_SECONDS``), not one long one: on a loaded
machine every sleep wakes up late by about the same time, so a phase of 24 sleeps stays 20%
longer than one of 20, where one sleep of 24 ms would be only ~10% longer than one of 20 ms
once each woke 20 ms late.

Runs meant to be compared are started at the same time, each in a process of its own
(``start_sleep_runs``): they share whatever load the machine has, so the load does not tell
them apart. Run as a script, this file is one such process.

Usage::

    procs = start_sleep_runs([(dir_a, 20), (dir_b, 24)])   # then wait for each
    sleep_steps(run, forward_sleeps=20, steps=50)           # inside a run of your own
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

UNIT_SECONDS = 0.0005
_REPO = Path(__file__).resolve().parent.parent
_IDENTITY_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                  "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_PROCID", "SLURM_NTASKS")


def _sleeps(count: int) -> None:
    for _ in range(count):
        time.sleep(UNIT_SECONDS)


def sleep_steps(run: Any, forward_sleeps: int, steps: int, extra_phase: str | None = None,
                eval_every: int = 40) -> None:
    """``steps`` steps of the run: forward (``forward_sleeps`` sleeps), backward (2),
    optimizer (1), ``extra_phase`` (empty) when given, and a val_loss monitoring phase (8) on
    every ``eval_every``-th step."""
    for step in run.steps(range(steps), loader="train"):
        with step.phase("forward"):
            _sleeps(forward_sleeps)
        with step.phase("backward"):
            _sleeps(2)
        with step.phase("optimizer"):
            _sleeps(1)
        if extra_phase is not None:
            with step.phase(extra_phase):
                pass
        if step.index % eval_every == eval_every - 1:
            with step.monitor("val_loss"):
                _sleeps(8)


def start_sleep_runs(runs: list[tuple[Any, ...]]) -> list[subprocess.Popen[bytes]]:
    """One process per run, all started now; each run is (run dir, forward sleeps[, steps
    [, extra phase or '-'[, rank of 2]]]), its run id the directory's name."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OTEL_") and k not in _IDENTITY_VARS}
    env["PYTHONPATH"] = os.pathsep.join([str(_REPO), env.get("PYTHONPATH", "")])
    return [subprocess.Popen([sys.executable, __file__, *map(str, args)], env=env)
            for args in runs]


def _main(run_dir: str, forward: str, steps: str = "150", extra: str = "-",
          rank: str | None = None) -> None:
    import otel_train

    identity = {} if rank is None else {"rank": int(rank), "world_size": 2}
    # device_sync off: the host clock is all a sleep needs, and torch is never imported (a
    # second of start-up saved in each process).
    with otel_train.start_run(status_dir=run_dir, run_id=Path(run_dir).name,
                              prometheus_port=None, console=False, report=False,
                              exporter="jsonl", export_process=False, device_sync="off",
                              export_interval_seconds=0.1, **identity) as run:
        sleep_steps(run, int(forward), int(steps), None if extra == "-" else extra)


if __name__ == "__main__":
    _main(*sys.argv[1:])
