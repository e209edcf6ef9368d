"""What one recorded span costs the training thread, warm and cold, measured at start-up.

The step and phase context managers are timed on this machine before training, twice:

- **warm**: steps back to back with nothing between the calls (an empty-bodied loop), the
  code and data of the hot path in the core's caches;
- **cold**: steps of the README's shape (``run.steps`` + three phases) with 2 MiB copied
  between every two calls, as a training step's own work does between them: it leaves the
  hot path's code and objects out of the core's L1 and L2, and each call fetches them again.
  In a real loop that is what a span costs: on a 2-vCPU EPYC VM ~7 us against ~1.3 us warm
  (``python benchmarks/bench_hot_path_in_situ.py`` times every call of the README's loop
  around a real MLP and GPT step and prints it beside both figures).

``SelfCostMeter`` charges each drained step's spans at the cold figure when the step is long
enough for its work to have evicted the caches (``common.self_cost.COLD_STEP_NS_PER_SPAN`` of
step time per span or more), at the warm figure otherwise (empty or tiny steps).

Usage::

    cost = calibrate_hot_path()          # ~20 ms, in start_run
    cost.ns_per_span(step_wall_ns=1_750_000, spans=5)   # the cold figure: a real step
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from time import perf_counter_ns, thread_time_ns
from typing import Any

from otel_train.common.drop_counter import DropCounter
from otel_train.common.self_cost import is_cold_step
from otel_train.recording.recorder import Recorder

__all__ = ["HotPathCost", "calibrate_hot_path"]

_EVICT_BYTES = 2 << 20  # over a core's L2 (1 MiB on EPYC and most server cores)
_PHASES = ("forward", "backward", "optimizer")


@dataclass(frozen=True)
class HotPathCost:
    """The training thread's ns per recorded span: warm caches and cold."""

    warm_ns_per_span: float
    cold_ns_per_span: float

    def ns_per_span(self, step_wall_ns: int, spans: int) -> float:
        """The cost per span of a step that took ``step_wall_ns`` and recorded ``spans``."""
        return self.cold_ns_per_span if is_cold_step(step_wall_ns, spans) \
            else self.warm_ns_per_span


def _warm_ns_per_span(rounds: int) -> float:
    """CPU per span of empty steps of one phase, back to back."""
    rec = Recorder(rounds + 1, DropCounter(), None)
    t0 = thread_time_ns()
    for i in range(rounds):
        step = rec.begin_step(None, i)
        with step.phase("a"):
            pass
        rec.finish_step(step, None)
        rec.queue.clear()
    return max((thread_time_ns() - t0) / (rounds * 2), 0.0)


def _cold_ns_per_span(rounds: int) -> float:
    """Wall ns per span of ``run.steps`` steps of three phases, 2 MiB copied between calls:
    the median over rounds (a round the scheduler interrupts is an outlier, not a cost)."""
    rec = Recorder(rounds + 2, DropCounter(), None)
    src, dst = bytes(_EVICT_BYTES), bytearray(_EVICT_BYTES)
    loop: Any = iter(rec.steps(range(rounds), None))
    per_step: list[int] = []
    clock = perf_counter_ns  # a vDSO read: ~0.1 us, where thread_time_ns is a syscall
    while True:
        dst[:] = src
        t0 = clock()
        try:
            step = next(loop)  # ends the previous step, begins the next, times its data phase
        except StopIteration:
            break
        spent = clock() - t0
        for name in _PHASES:
            dst[:] = src
            t0 = clock()
            phase = step.phase(name)  # as the user's loop: the lookup, then __enter__
            phase.__enter__()
            spent += clock() - t0
            dst[:] = src  # the phase's own work
            t0 = clock()
            phase.__exit__(None, None, None)
            spent += clock() - t0
        per_step.append(spent)
    rec.queue.clear()
    # Each step records 1 + data + 3 phases; the last next() (the loop's end) is not timed.
    return statistics.median(per_step) / (2 + len(_PHASES))


def calibrate_hot_path(warm_rounds: int = 200, cold_rounds: int = 12) -> HotPathCost:
    """This machine's hot-path cost per span, warm and cold (for the own-cost figures)."""
    warm = _warm_ns_per_span(warm_rounds)
    cold = _cold_ns_per_span(cold_rounds)
    return HotPathCost(warm, max(warm, cold))
