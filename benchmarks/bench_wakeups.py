"""How often each thread of a run wakes up, and the CPU it spends, beside a training loop.

Every wake-up of a thread of the training process takes the GIL; when the training thread
wants it back (after each torch op that let go of it) it waits, goes off the CPU and resumes
on cold caches. The blocked time is charged in the run's own cost (``wait_us_per_step``); the
number of times the training thread is put to sleep is the figure this bench prints, beside
every thread's wake-ups (voluntary context switches, ``/proc/<pid>/task/<tid>/sched``) and
CPU (schedstat), for the training process and its exporter process, in three states of one
live run:

- ``idle``: no training; the run has taken a few steps and sits between steps (an
  evaluation, a checkpoint);
- ``bare``: the bare training loop beside that run (the all-in A/B's bare blocks);
- ``otel``: the README's loop (``run.steps`` + phases), the run recording and exporting.

Counts, not times: they hardly move with the VM's speed, so a few rounds tell them apart.

Usage::

    python benchmarks/bench_wakeups.py                      # mlp and gpt, 3 rounds
    python benchmarks/bench_wakeups.py --workloads mlp --rounds 5
    python benchmarks/bench_wakeups.py --smoke              # seconds; the test runs it
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loop_workloads import Workload, loop_bare, loop_otel  # noqa: E402
from bench_support import ROOT, live_run, rounds_main  # noqa: E402

sys.path.insert(0, str(ROOT))
from otel_train.pipeline.span_worker import MAX_DRAIN_DELAY_SECONDS  # noqa: E402

BLOCK_STEPS = {"gpt": 200, "mlp": 1500}
STATES = ("idle", "bare", "otel")


def _threads(pid: int) -> dict[int, tuple[str, int, int]]:
    """tid -> (name, voluntary switches, on-CPU ns) of each thread of ``pid`` now."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            switches = next(int(line.split(":")[1]) for line in open(f"{base}/sched")
                            if line.startswith("nr_voluntary_switches"))
            on_cpu = int(open(f"{base}/schedstat").read().split()[0])
            name = open(f"{base}/comm").read().strip()
        except (OSError, StopIteration, ValueError, IndexError):
            continue
        out[int(tid)] = (name, switches, on_cpu)
    return out


def _measure(body: Callable[[], None], pids: dict[str, int],
             names: dict[int, str]) -> tuple[float, dict[str, tuple[float, float]]]:
    """Run ``body``; its seconds and, per thread seen before and after, (wake-ups/s, CPU
    ms/s), keyed ``process/thread``."""
    before = {p: _threads(pid) for p, pid in pids.items()}
    t0 = time.perf_counter()
    body()
    seconds = time.perf_counter() - t0
    rates: dict[str, tuple[float, float]] = {}
    for proc, pid in pids.items():
        for tid, (comm, switches, on_cpu) in _threads(pid).items():
            if tid not in before[proc]:
                continue
            _, s0, c0 = before[proc][tid]
            key = f"{proc}/{names.get(tid, comm)}"
            if key in rates:  # same-named threads (the exporter's): one row per tid
                key = f"{key}#{tid}"
            rates[key] = ((switches - s0) / seconds, (on_cpu - c0) / 1e6 / seconds)
    return seconds, rates


def run_workload(name: str, rounds: int, steps: int, endpoint: str) -> None:
    """Rounds of (idle, bare, otel) beside one live run; prints the table for one workload."""
    w = Workload(name, eval_every=50)
    got: dict[str, list[dict[str, tuple[float, float]]]] = {s: [] for s in STATES}
    step_rate: dict[str, list[float]] = {s: [] for s in STATES}
    with live_run(endpoint, "bench-wakeups") as (run, _):
        loop_otel(w, min(steps, 50), run)  # warm-up; the run has stepped
        run.flush()
        exporter = getattr(run._telemetry.export, "pid", None)
        pids = {"train": os.getpid(), **({"exporter": exporter} if exporter else {})}
        names = {t.native_id: t.name for t in threading.enumerate() if t.native_id}
        idle_seconds = max(1.0, steps * 0.0016)
        bodies = {"idle": lambda: time.sleep(idle_seconds),
                  "bare": lambda: loop_bare(w, steps),
                  "otel": lambda: loop_otel(w, steps, run)}
        for _ in range(rounds):
            for state in STATES:
                time.sleep(MAX_DRAIN_DELAY_SECONDS)  # the last step's age limit passes
                seconds, rates = _measure(bodies[state], pids, names)
                got[state].append(rates)
                step_rate[state].append(0.0 if state == "idle" else steps / seconds)
                run.flush()
    _print(name, rounds, steps, got, step_rate)


def _print(name: str, rounds: int, steps: int, got: dict[str, list[dict]],
           step_rate: dict[str, list[float]]) -> None:
    print(f"\n== {name}: {rounds} rounds of idle / {steps}-step bare / {steps}-step otel "
          f"blocks beside one run; medians per second (wake-ups, CPU ms)")
    keys = sorted({k for rows in got.values() for r in rows for k in r})
    print(f"{'thread':42}" + "".join(f"{s:>20}" for s in STATES))
    for key in keys:
        cells = []
        for state in STATES:
            vals = [r[key] for r in got[state] if key in r]
            if not vals:
                cells.append(f"{'-':>20}")
                continue
            wakes = statistics.median(v[0] for v in vals)
            cpu = statistics.median(v[1] for v in vals)
            cells.append(f"{wakes:9.1f} {cpu:7.2f} ms ")
        if all(c.strip() in ("-", "0.0    0.00 ms") for c in cells):
            continue
        print(f"{key[:42]:42}" + "".join(cells))
    for state in ("bare", "otel"):
        rate = statistics.median(step_rate[state])
        wakes = [r.get("train/MainThread", (0.0, 0.0))[0] for r in got[state]]
        per_step = statistics.median(wakes) / rate if rate else 0.0
        print(f"training thread put to sleep per step, {state}: {per_step:.3f} "
              f"({statistics.median(wakes):.1f} a second at {rate:.0f} steps a second)")


def main(argv: list[str] | None = None) -> int:
    return rounds_main(argv, __doc__, run_workload, workloads="mlp,gpt", rounds=3,
                       block_steps=BLOCK_STEPS, smoke=(1, 40), pair="(idle, bare, otel)")


if __name__ == "__main__":
    sys.exit(main())
