"""What ``step.due`` costs the training thread: paired blocks of steps, one asking
``step.due("val_loss", every=50)`` and one ``step.index % 50 == 0``, in one governed run.

Each step spins ``--step-us`` of work (a short step makes any cost show), in a phase; every
50th step runs an empty ``val_loss`` monitor. The two kinds of block alternate (which goes
first alternates too) so machine drift hits both alike; each pair gives the ratio of the
``due`` block's wall time over the modulo block's. Prints the median ratio with its 95%
bootstrap interval, and ``step.due``'s own cost per call, plain and governed, from a tight
loop. ``budget_action="govern"``: the plan-step path (every 25 steps) and the governor thread
run too (the monitor is empty: no interval changes, so every block asks the same thing).

Usage::

    PYTHONPATH=. python benchmarks/bench_due.py --pairs 40 --steps 400
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_support import _fmt_ci  # noqa: E402

import otel_train  # noqa: E402
from otel_train.recording.schedule import DueSchedule  # noqa: E402

OPTIONS = dict(exporter="none", prometheus_port=None, console=False, report=False)


def _spin(ns: int) -> None:
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        pass


def _block(run: otel_train.Run, steps: int, spin_ns: int, use_due: bool) -> float:
    t0 = time.perf_counter_ns()
    if use_due:
        for step in run.steps(range(steps)):
            with step.phase("forward"):
                _spin(spin_ns)
            if step.due("val_loss", every=50):
                with step.monitor("val_loss"):
                    pass
    else:
        for step in run.steps(range(steps)):
            with step.phase("forward"):
                _spin(spin_ns)
            if step.index % 50 == 0:
                with step.monitor("val_loss"):
                    pass
    return (time.perf_counter_ns() - t0) / 1e9


def paired_ratios(pairs: int, steps: int, step_us: float) -> list[float]:
    """due block / modulo block, per pair."""
    spin_ns = int(step_us * 1000)
    ratios = []
    with otel_train.start_run(budget_action="govern", **OPTIONS) as run:
        _block(run, steps, spin_ns, True)  # warm both paths
        _block(run, steps, spin_ns, False)
        for i in range(pairs):
            if i % 2:
                due = _block(run, steps, spin_ns, True)
                mod = _block(run, steps, spin_ns, False)
            else:
                mod = _block(run, steps, spin_ns, False)
                due = _block(run, steps, spin_ns, True)
            ratios.append(due / mod)
    return ratios


class _Step:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def due_ns_per_call(governed: bool, calls: int = 200_000) -> float:
    """``DueSchedule.due`` alone, minus the loop around it (median of 5)."""
    steps = [_Step(i) for i in range(calls)]
    out = []
    for _ in range(5):
        schedule = DueSchedule(governed=governed)
        due = schedule.due
        t0 = time.perf_counter_ns()
        for s in steps:
            due(s, "val_loss", 50)
        t1 = time.perf_counter_ns()
        for s in steps:
            pass
        t2 = time.perf_counter_ns()
        out.append(((t1 - t0) - (t2 - t1)) / calls)
    return statistics.median(out)


def main(argv: list[str] | None = None) -> int:
    """Print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pairs", type=int, default=40)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--step-us", type=float, default=500.0)
    args = parser.parse_args(argv)
    print(f"step.due per call: plain {due_ns_per_call(False):.0f} ns, governed "
          f"{due_ns_per_call(True):.0f} ns (tight loop, the loop's own cost taken out)")
    ratios = paired_ratios(args.pairs, args.steps, args.step_us)
    print(f"paired blocks ({args.pairs} pairs of {args.steps} steps of {args.step_us:g} us): "
          f"due / modulo block time, median [95% CI] {_fmt_ci(ratios)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
