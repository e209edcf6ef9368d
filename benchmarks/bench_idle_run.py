"""What a live otel-train run costs the training thread when it has nothing to record.

A run keeps threads beside training: between steps the span worker looks about three times a
second (``pipeline/drain_schedule.py``: own-cost sample, exporter hand-over), the stall
watchdog every second, the Prometheus server. Each wake-up takes the GIL, and the training
thread waits for it whenever it wants it back (after every torch op that let go of it). This
bench runs the bare training loop (no ``run.steps``, no phases) in blocks, alternately with
no run in the process and beside a live run started just before the block (outside the clock)
that has taken a few steps and sits between steps, as during an evaluation or the A/B's bare
blocks, and prints the training thread's blocked time per step (schedstat: wall - on CPU -
run queue; on CPython mostly waiting for the GIL) both ways.

It also says what the all-in A/B of ``bench_training_loop.py`` cannot: its bare blocks run
beside the live run, so this cost is in both of its arms and its A/B share leaves it out,
while the run's own-cost meter charges it (it is wait in the intervals where training runs).

Usage::

    python benchmarks/bench_idle_run.py                       # gpt and mlp, 8 rounds
    python benchmarks/bench_idle_run.py --workloads gpt --rounds 20
    python benchmarks/bench_idle_run.py --smoke               # seconds; the test runs it
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loop_workloads import Workload, loop_bare, loop_otel  # noqa: E402
from bench_support import (  # noqa: E402
    ROOT,
    ThreadClock,
    _fmt_ci,
    live_run,
    rounds_main,
    timed_block,
)

sys.path.insert(0, str(ROOT))
from otel_train.pipeline.span_worker import MAX_DRAIN_DELAY_SECONDS  # noqa: E402

BLOCK_STEPS = {"gpt": 200, "mlp": 1500}


def _block(w: Workload, n: int, clock: ThreadClock) -> tuple[float, float]:
    """(blocked us per step, wall us per step) of ``n`` bare steps."""
    got = timed_block(clock, lambda: loop_bare(w, n))
    return got["blocked"] / n / 1e3, got["wall"] / n / 1e3


def run_workload(name: str, rounds: int, steps: int, endpoint: str) -> None:
    """Rounds of (no run, idle run) blocks; prints the table for one workload."""
    w = Workload(name, eval_every=50)
    clock = ThreadClock()  # the run's own schedstat reader (self_cost.py)
    loop_bare(w, min(steps, 50))  # warm-up: allocator, first-use paths
    none: list[tuple[float, float]] = []
    idle: list[tuple[float, float]] = []
    for r in range(rounds):
        none.append(_block(w, steps, clock))
        with live_run(endpoint, "bench-idle") as (run, _):
            run.flush()  # the exporter process ready before the clock starts
            loop_otel(w, 3, run)  # a run between steps, not one waiting for its first
            run.flush()
            time.sleep(MAX_DRAIN_DELAY_SECONDS)  # the last step's age limit has passed
            idle.append(_block(w, steps, clock))
        print(f"  round {r + 1}/{rounds}: blocked {none[-1][0]:.1f} -> {idle[-1][0]:.1f} us "
              f"per step", flush=True)
    diff = [i[0] - n[0] for n, i in zip(none, idle)]
    wall = statistics.median(n[1] for n in none)
    print(f"\n== {name}: {rounds} rounds of {steps}-step bare blocks ({wall:.0f} us per step "
          f"with no run)")
    print(f"training thread blocked per step, no run:       "
          f"{statistics.median(n[0] for n in none):7.1f} us (median)")
    print(f"training thread blocked per step, idle run:     "
          f"{statistics.median(i[0] for i in idle):7.1f} us (median)")
    print(f"idle run - no run, paired: {_fmt_ci(diff)} us per step, "
          f"{_fmt_ci([100 * d / wall for d in diff])} % of the step")


def main(argv: list[str] | None = None) -> int:
    return rounds_main(argv, __doc__, run_workload, workloads="gpt,mlp", rounds=8,
                       block_steps=BLOCK_STEPS, smoke=(2, 20), pair="(no run, idle run)")

if __name__ == "__main__":
    sys.exit(main())
