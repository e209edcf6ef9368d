"""What the stall watchdog's stacks (derived/stall_stacks.py) add to each check, paired.

The watchdog checks once per ``watchdog_interval_seconds`` (1 s) on its own thread; none of
this runs on the training thread's hot path. Printed per check, in interleaved chunks
(stacks off, on, on and re-armed every check), each with the watchdog thread's CPU and its
wall time (re-arming faulthandler's timer stops and starts its C thread with the GIL held,
so that wall time is what the training thread can wait at most):

- stacks off: the check as it was (``stall_stacks=False``);
- stacks on, timer kept: a step longer than the interval, or one within the slack;
- stacks on, re-armed every check: the worst case (each check re-arms), with world_size 2
  (the request folder is looked at too).

Usage::

    python benchmarks/bench_stall_watchdog.py [--rounds 40] [--checks 200]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from otel_train.common.drop_counter import DropCounter
from otel_train.derived.stall_stacks import StallStacks
from otel_train.derived.watchdog import StallWatchdog
from otel_train.recording.recorder import Recorder, Step


def _dog(folder: Path | None, slack_zero: bool) -> StallWatchdog:
    rec = Recorder(10, DropCounter(), None)
    stacks = (StallStacks(folder, 0, 2, threading.get_ident())
              if folder is not None else None)
    if stacks is not None and slack_zero:
        arm = stacks.arm
        stacks.arm = lambda key, header, seconds, slack_seconds=0.0: arm(  # type: ignore
            key, header, seconds, 0.0)
    dog = StallWatchdog(rec, stall_seconds=300.0, stacks=stacks)
    Step(rec, 0, None).phase("forward").__enter__()
    return dog


def _chunk(dog: StallWatchdog, checks: int, fresh_step: bool) -> tuple[float, float]:
    rec = dog._recorder
    w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    for i in range(checks):
        if fresh_step:  # a later step on every check: the timer's deadline moves
            rec.current = None
            Step(rec, i + 1, None)
            time.sleep(0)
        dog.check()
    w1, c1 = time.perf_counter_ns(), time.thread_time_ns()
    return (w1 - w0) / checks / 1e3, (c1 - c0) / checks / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--checks", type=int, default=200)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    variants = {"stacks off": (_dog(None, False), False),
                "stacks on, timer kept": (_dog(tmp / "a", False), False),
                "stacks on, re-armed every check": (_dog(tmp / "b", True), True)}
    wall: dict[str, list[float]] = {k: [] for k in variants}
    cpu: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(args.rounds):
        for name, (dog, fresh) in variants.items():
            w, c = _chunk(dog, args.checks, fresh)
            wall[name].append(w)
            cpu[name].append(c)
    for dog, _ in variants.values():
        dog.stop()
    print(f"per watchdog check (one a second by default), medians of {args.rounds} "
          f"interleaved chunks of {args.checks} checks")
    for name in variants:
        print(f"  {name:<34} {statistics.median(wall[name]):8.1f} us wall "
              f"{statistics.median(cpu[name]):8.1f} us CPU")


if __name__ == "__main__":
    main()
