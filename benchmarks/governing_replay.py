"""Governing replayed on simulated time: the schedule, governor, overhead and budget of a run.

A simulated run of ``steps`` steps of ``train_seconds`` each, whose monitoring operations
cost what ``SimOperation.seconds`` says at each call, goes through the library's own
``DueSchedule`` (step.due), ``Governor``, ``OverheadSpanProcessor`` and budget status, with a
decision every ``decide_every_steps`` steps (a run decides every second in the background).
No clock is read: the same figures every time, on any machine.

The field notes' hung set-up (1000 steps x 3.5 s; an evolution snapshot of 180 s every 500
steps, a 0.3 s detail collector every 50, live inference of 3 s every 200: 381 s, 10.9% of
training time) is ``SEED_HUNG``. Run it to print the table::

    PYTHONPATH=. python benchmarks/governing_replay.py
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_train.derived.budget import budget_status
from otel_train.derived.governor import Governor
from otel_train.derived.overhead import OverheadSpanProcessor
from otel_train.recording.schedule import DueSchedule


@dataclass(frozen=True)
class SimOperation:
    """A monitoring operation of the simulated loop: ``step.due(name, every=every)``."""

    name: str
    every: int
    seconds: float | Callable[[int], float]  # a call's cost, or step -> cost
    min_every: int | None = None
    max_every: int | None = None
    scheduled: bool = True  # False: ``if step % every == 0``, not step.due (never governed)

    def cost(self, step: int) -> float:
        """Seconds of the call at ``step``."""
        return self.seconds(step) if callable(self.seconds) else float(self.seconds)


@dataclass
class SimResult:
    """What the simulated run did."""

    governed: bool
    steps: int
    status: str
    steady_share: float
    total_share: float
    calls: dict[str, list[int]] = field(default_factory=dict)  # operation -> steps it ran
    intervals: dict[str, list[int]] = field(default_factory=dict)  # operation -> per step
    changes: list[tuple[int, str, int, int, float]] = field(default_factory=list)
    governed_share: float = 0.0  # the governor's last projection at the intervals in force

    def share_between(self, first: int, last: int, train_seconds: float,
                      ops: Sequence[SimOperation]) -> float:
        """Monitoring over training time from step ``first`` to ``last`` (excluded)."""
        mon = sum(op.cost(s) for op in ops for s in self.calls[op.name] if first <= s < last)
        return mon / ((last - first) * train_seconds)


class _View:
    """The fields of a step view the overhead processor reads."""

    __slots__ = ("rank", "step", "duration_ns", "monitor_ns", "operations")

    def __init__(self, step: int, train_ns: int, operations: list[tuple[str, int]]) -> None:
        self.rank = 0
        self.step = step
        self.monitor_ns = sum(d for _, d in operations)
        self.duration_ns = train_ns + self.monitor_ns
        self.operations = operations


class _Step:
    __slots__ = ("index", "governing_events")

    def __init__(self, index: int) -> None:
        self.index = index


def simulate(steps: int, train_seconds: float | Callable[[int], float],
             ops: Sequence[SimOperation], *, govern: bool = True, budget: float = 0.05,
             critical: float = 0.10, decide_every_steps: int = 10,
             warmup_steps: int = 5) -> SimResult:
    """Run the simulated loop; see the module docstring."""
    schedule = DueSchedule(governed=govern)
    overhead = OverheadSpanProcessor(warmup_steps=warmup_steps)
    governor = Governor(budget)
    res = SimResult(govern, steps, "ok", 0.0, 0.0, {op.name: [] for op in ops},
                    {op.name: [] for op in ops})
    for i in range(steps):
        step = _Step(i)
        ran: list[tuple[str, int]] = []
        for op in ops:
            if (schedule.due(step, op.name, op.every, min_every=op.min_every,
                             max_every=op.max_every) if op.scheduled else i % op.every == 0):
                ran.append((op.name, round(op.cost(i) * 1e9)))
                res.calls[op.name].append(i)
        train = train_seconds(i) if callable(train_seconds) else train_seconds
        overhead.on_step(_View(i, round(train * 1e9), ran))  # type: ignore[arg-type]
        intervals = schedule.intervals()
        for op in ops:
            res.intervals[op.name].append(intervals.get(op.name, op.every))
        if govern and (i + 1) % decide_every_steps == 0:
            schedule.proposed = governor.decide(overhead.snapshot(), schedule.operations())
    snap = overhead.snapshot()
    res.status = budget_status(snap.steady_ratio, budget, critical)
    res.steady_share, res.total_share = snap.steady_ratio, snap.cumulative_ratio
    res.changes = list(schedule.history)
    res.governed_share = governor.last_share
    return res


# The field notes' hung set-up: 1000 steps x 3.5 s = 3500 s of training.
SEED_TRAIN_SECONDS = 3.5
SEED_HUNG = (SimOperation("evolution_snapshot", 500, 180.0),
             SimOperation("detail_collector", 50, 0.3),
             SimOperation("live_inference", 200, 3.0))


def seed_table(steps_list: Sequence[int] = (1000, 5000)) -> list[dict[str, Any]]:
    """The hung set-up replayed with governing off and on, at each run length."""
    rows = []
    for steps in steps_list:
        for govern in (False, True):
            r = simulate(steps, SEED_TRAIN_SECONDS, SEED_HUNG, govern=govern,
                         decide_every_steps=1)
            rows.append({
                "steps": steps, "budget_action": "govern" if govern else "report",
                "snapshot_calls": len(r.calls["evolution_snapshot"]),
                "intervals": "/".join(str(r.intervals[op.name][-1]) for op in SEED_HUNG),
                "steady_share": r.steady_share, "total_share": r.total_share,
                "status": r.status})
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The table as text."""
    head = ("steps", "budget_action", "snapshot calls", "intervals snap/detail/infer",
            "steady share", "total share", "status")
    lines = [" | ".join(head)]
    for r in rows:
        lines.append(" | ".join((str(r["steps"]), r["budget_action"], str(r["snapshot_calls"]),
                                 r["intervals"], f"{r['steady_share']:.2%}",
                                 f"{r['total_share']:.2%}", r["status"])))
    return "\n".join(lines)


def main() -> None:
    """Print the seed replay table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, nargs="*", default=[1000, 5000])
    args = parser.parse_args()
    print("field notes' hung set-up: 3.5 s steps; evolution_snapshot 180 s every 500, "
          "detail_collector 0.3 s every 50, live_inference 3 s every 200; budget 5%")
    print(format_table(seed_table(args.steps)))


if __name__ == "__main__":
    main()
