"""One rank of a two-rank gloo job that governs an evaluation (tests/recording/test_due_ranks.py).

Every step all-reduces a small tensor (the gradient all-reduce of data parallelism, which
keeps the ranks within a step of each other) and sleeps ``--step-ms``; ``val_loss`` runs when
``step.due`` says so, sleeping ``--val-ms`` (twice that on rank 1) and all-reducing inside:
a rank that skipped an evaluation the other ran would hang the job. Prints one JSON line: the
steps where this rank evaluated and the changes of interval it put in force.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import otel_train
import otel_train.derived.governor as governor


def main() -> None:
    """Train, evaluate when due, report."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--step-ms", type=float, default=2.0)
    parser.add_argument("--val-ms", type=float, default=15.0)
    parser.add_argument("--status-dir", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    governor.DECIDE_EVERY_SECONDS = 0.2  # decide sooner than a real run's 1 s: a short test
    val_seconds = args.val_ms / 1000 * (2 if rank == 1 else 1)
    grad = torch.ones(16)
    evaluated = []
    with otel_train.start_run(budget_action="govern", prometheus_port=None, console=False,
                              exporter="none", report=False,
                              status_dir=f"{args.status_dir}/rank{rank}") as run:
        for step in run.steps(range(args.steps)):
            with step.phase("backward"):
                time.sleep(args.step_ms / 1000)
                dist.all_reduce(grad)
            if step.due("val_loss", every=50, force=step.index == args.steps - 1):
                with step.monitor("val_loss"):
                    time.sleep(val_seconds)
                    dist.all_reduce(torch.ones(4))  # an evaluation's own collective
                evaluated.append(step.index)
        changes = list(run._recorder.schedule.history)
    print(json.dumps({"rank": rank, "evaluated": evaluated, "changes": changes}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
