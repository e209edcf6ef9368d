"""The advisor: each monitoring operation's projected overhead and the interval that keeps it
inside the budget.

The advisor does the "estimate the cost before enabling it" arithmetic for the user: from each
operation's steady cost per call ``c``, its interval ``k`` (steps between calls) and the
steady training time per step ``s``, its projected overhead is ``c / (k*s)`` and the
smallest interval that keeps it within budget ``b`` alone is ``ceil(c / (b*s))``: a 180 s
snapshot on 3.5 s steps needs ``180 / (0.05 x 3.5)`` = 1029 steps between calls.

Usage::

    advise(overhead.snapshot(), 0.05)       # [OperationAdvice(...), ...]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from otel_train.derived.overhead import OperationCost, OverheadSnapshot


# How an operation's calls fall: the advisor speaks of each in its own terms.
PATTERN_ONCE = "once"  # one call, or every call at one step (after the loop): no period
PATTERN_PERIODIC = "periodic"  # calls spread at a whole number of steps apart on average
PATTERN_IRREGULAR = "irregular"  # 3+ calls whose mean interval is no whole number of steps


@dataclass(frozen=True)
class OperationAdvice:
    """The advisor's projection for one monitoring operation."""

    operation: str
    mean_seconds: float
    interval_steps: float | None  # measured steps between calls (None: no period)
    projected_share: float  # at the measured interval (one-off: its share so far), 0..1
    min_interval_steps: int | None  # smallest interval within budget (None: unknown)
    within_budget: bool
    advice: str
    calls: int = 0
    pattern: str = PATTERN_PERIODIC  # once | periodic | irregular

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def advise(snapshot: OverheadSnapshot, budget: float,
           intervals_in_force: Mapping[str, int] | None = None) -> list[OperationAdvice]:
    """Project each operation's overhead and the smallest interval within ``budget``.

    A one-off operation (a final evaluation after the loop) is told as what it cost once,
    ``final_eval: once, 1.2 s = 0.4% of training``; a periodic one at its interval: the one
    in force for an operation governed with ``step.due`` (``intervals_in_force``), else the
    measured one.
    """
    s = snapshot.steady_train_seconds_per_step
    out: list[OperationAdvice] = []
    governed = intervals_in_force or {}
    for op in sorted(snapshot.operations.values(), key=lambda o: -o.total_seconds):
        c = op.steady_mean_seconds
        min_k = max(1, math.ceil(c / (budget * s) - 1e-9)) if s > 0 else None
        k: float | None
        if op.name in governed and op.calls:
            k = float(governed[op.name])  # governing: the projection at the interval in force
        elif op.calls < 2 or op.last_step == op.first_step:
            out.append(_one_off_advice(op, snapshot, budget, min_k))
            continue
        else:
            k = op.steps_per_call
        if k is None:  # every call at one step, long ago: a one-off
            out.append(_one_off_advice(op, snapshot, budget, min_k))
            continue
        if k < 0:  # step indices went backwards (a restarted count): the run's mean
            k = max(1.0, snapshot.steps / op.calls)
        pattern = PATTERN_IRREGULAR if op.calls >= 3 and k != int(k) else PATTERN_PERIODIC
        projected = c / (k * s) if s > 0 else op.share
        within = projected <= budget
        first = ""
        if op.first_seconds > 2 * c and op.first_seconds - c > 1e-3:
            first = f" (first call {op.first_seconds:.3g} s: warm-up, left out)"
        if op.name in governed:
            every = f" every {k:g} steps (governed)"
        elif op.calls == 2:
            every = f", 2 calls {k:g} steps apart"
        elif pattern == PATTERN_IRREGULAR:
            every = (f", {op.calls} calls at irregular steps {op.first_step}..{op.last_step} "
                     f"(every {k:.3g} steps on average)")
        else:
            every = f" every {k:g} steps"
        if min_k is None:
            text = (f"{op.name}: {c:.3g} s per call{every}; not enough steps yet to project "
                    "its cost")
        elif within:
            text = (f"{op.name}: {c:.3g} s per call{first}{every} -> {projected:.1%} of "
                    f"training time; within the {budget:.0%} budget at every >= {min_k} steps")
        else:
            text = (f"{op.name}: {c:.3g} s per call{first}{every} -> {projected:.1%} of "
                    f"training time, over the {budget:.0%} budget: run it every >= {min_k} "
                    "steps, or make it cheaper (smaller sample, offline)")
        out.append(OperationAdvice(op.name, c, k, projected, min_k, within, text, op.calls,
                                   pattern))
    return out


def _one_off_advice(op: OperationCost, snapshot: OverheadSnapshot, budget: float,
                    min_k: int | None) -> OperationAdvice:
    """An operation with no period between its calls: what it cost, as a share of training."""
    if op.calls == 1:
        what = f"{op.name}: once, {op.total_seconds:.3g} s"
    else:
        what = f"{op.name}: {op.calls} calls at step {op.first_step}, {op.total_seconds:.3g} s"
    if snapshot.training_seconds <= 0:
        text = f"{what}; no training time yet to compare it with"
        within = True
    else:
        within = op.share <= budget
        text = f"{what} = {op.share:.1%} of training"
        if not within:
            text += (f", over the {budget:.0%} budget on its own: make it cheaper (smaller "
                     "sample) or run it offline")
    return OperationAdvice(op.name, op.steady_mean_seconds, None, op.share, min_k, within,
                           text, op.calls, PATTERN_ONCE)
