"""Monitoring overhead: monitoring time over *training* time, as teams budget it (1000 steps x 3.5 s = 3500 s of training, 381 s of monitoring = 10.9%).

Definitions (the telemetry contract's ``otel_train_monitoring_overhead_ratio``):

- monitoring time counts only *top-level* monitor phases (a monitor nested in another
  monitor is part of its parent's time, never counted twice), plus monitoring operations
  done between steps (``run.monitor``);
- training time is the sum of step durations (root ``train.step`` spans) minus the
  monitoring inside them. Monitoring between steps is monitoring, not training. Gaps between
  steps that belong to neither are left out of both;
- overhead = monitoring / training: 1000 steps x 3.5 s = 3500 s of training and 381 s of
  monitoring is 10.9%, whatever the monitoring did to the wall clock. The share of wall
  time (monitoring / (training + monitoring), 9.6% there) is kept as ``wall_share``;
- ``cumulative`` covers the whole run, ``recent`` the last ``recent_window_steps`` steps
  (operations between steps are folded into the next step's entry);
- ``steady`` is the figure without warm-up: each operation at its cost per call *after the
  first call*, at its interval (steps between calls), over the mean training time of the
  steps after the first ``warmup_steps`` -- the advisor's projections, summed. An operation
  seen once counts at that one call over the steps so far. The budget status and the
  advisor read it; the first calls and the warm-up steps are reported on their own
  (``first_seconds``, ``warmup_*``) and ``cumulative`` still counts everything. On a run
  without warm-up and with regular operations, steady and cumulative agree (the field
  notes' table gives 10.9% both ways).

Per operation: calls, total, max, first call, and its share of the training time. The
library's own cost (``SelfCostMeter.recent_share``: what the training thread loses over the
loop's wall time, recent window) gives the instrumentation overhead ratio.

Usage::

    overhead = OverheadSpanProcessor(recent_window_steps=100, warmup_steps=5)
    provider.add_span_processor(overhead)
    snap = overhead.snapshot()
    snap.cumulative_ratio, snap.steady_ratio, snap.operations["inference"].first_seconds
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from otel_train.common.self_cost import SelfCostMeter
from otel_train.records.steps_view import StepView, StepViewProcessor

# _ops entries: [calls, total_ns, max_ns, first_step, last_step, first_call_ns, call_steps]
# (call_steps: the steps with a call; two validations after one step are two calls there)
_CALLS, _TOTAL, _MAX, _FIRST_STEP, _LAST_STEP, _FIRST_NS, _CALL_STEPS = range(7)
_duration_of = itemgetter(1)  # an operation's (name, duration_ns)


@dataclass(frozen=True)
class OperationCost:
    """What one monitoring operation cost so far."""

    name: str
    calls: int
    total_seconds: float
    max_seconds: float
    share: float  # of the cumulative training time (monitoring excluded), 0..
    first_step: int
    last_step: int
    first_seconds: float = 0.0  # the first call (often warm-up: compilation, caches)
    call_steps: int = 0  # steps with a call (0: not known, taken as one call per step)

    @property
    def steps_per_call(self) -> float | None:
        """Measured steps between calls: the span of steps with a call over the calls that
        fall in it, two calls after one step counting as two (None before two steps had a
        call)."""
        steps = self.call_steps or self.calls
        if steps < 2:
            return None
        return (self.last_step - self.first_step) / (steps - 1) * steps / self.calls

    @property
    def mean_seconds(self) -> float:
        """Mean seconds per call, every call included."""
        return self.total_seconds / self.calls if self.calls else 0.0

    @property
    def steady_mean_seconds(self) -> float:
        """Mean seconds per call after the first (the first call when it is the only one)."""
        if self.calls >= 2:
            return max(0.0, self.total_seconds - self.first_seconds) / (self.calls - 1)
        return self.total_seconds


@dataclass(frozen=True)
class OverheadSnapshot:
    """A consistent copy of the overhead figures."""

    rank: Any
    steps: int
    wall_seconds: float  # steps + monitoring between steps
    monitoring_seconds: float
    cumulative_ratio: float  # monitoring / training
    recent_ratio: float
    recent_steps: int
    instrumentation_ratio: float | None
    operations: dict[str, OperationCost] = field(default_factory=dict)
    wall_share: float = 0.0  # monitoring / wall (steps + monitoring between steps)
    recent_wall_share: float = 0.0
    steady_ratio: float = 0.0  # first calls and warm-up steps replaced by steady figures
    warmup_steps: int = 0  # warm-up steps seen so far (at most the option)
    warmup_training_seconds: float = 0.0
    steady_train_seconds_per_step: float = 0.0

    @property
    def training_seconds(self) -> float:
        """Training time: wall time minus monitoring."""
        return max(0.0, self.wall_seconds - self.monitoring_seconds)


def _ratio(part: float, whole: float) -> float:
    """part / whole, 0 when there is no whole yet (no training time: nothing to compare)."""
    return part / whole if whole > 0 else 0.0


class OverheadSpanProcessor(StepViewProcessor):
    """Monitoring time / training time: recent window, cumulative, steady, per operation."""

    view_by_view = True  # the console reads its figures as of each step
    reads_before = False  # first in its group: reads no one's figures
    state_fields = ("rank", "steps", "_last_step", "_wall_ns", "_monitor_ns", "_warmup_seen",
                    "_warmup_train_ns", "_recent", "_recent_wall", "_recent_monitor",
                    "_between_ns", "_ops")

    def __init__(self, recent_window_steps: int = 100,
                 self_cost: SelfCostMeter | None = None, warmup_steps: int = 5) -> None:
        super().__init__()
        if not isinstance(recent_window_steps, int) or recent_window_steps < 1:
            raise ValueError("recent_window_steps must be an integer >= 1")
        if not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError("warmup_steps must be an integer >= 0")
        self._self_cost = self_cost
        self.warmup_steps = warmup_steps
        self.rank: Any = None
        self.steps = 0
        self._last_step = 0  # index of the latest step (the user's numbering)
        self._wall_ns = 0
        self._monitor_ns = 0
        self._warmup_seen = 0
        self._warmup_train_ns = 0
        self._recent: deque[tuple[int, int]] = deque()
        self._window = recent_window_steps
        self._recent_wall = 0
        self._recent_monitor = 0
        self._between_ns = 0  # operations since the last step, folded into the next entry
        self._ops: dict[str, list[int]] = {}

    # -- feeding ------------------------------------------------------------------------
    def on_step(self, view: StepView) -> None:
        """Count one step."""
        if self.rank is None:
            self.rank = view.rank
        between = self._between_ns
        self._between_ns = 0
        wall = view.duration_ns + between
        mon = view.monitor_ns + between
        self.steps += 1
        self._last_step = view.step
        self._wall_ns += view.duration_ns
        self._monitor_ns += view.monitor_ns
        if self._warmup_seen < self.warmup_steps:
            self._warmup_seen += 1
            self._warmup_train_ns += max(0, view.duration_ns - view.monitor_ns)
        recent = self._recent
        if len(recent) >= self._window:
            old_wall, old_mon = recent.popleft()
            self._recent_wall -= old_wall
            self._recent_monitor -= old_mon
        recent.append((wall, mon))
        self._recent_wall += wall
        self._recent_monitor += mon
        if view.operations:
            self._count_operations(view)

    def on_steps(self, views: Sequence[StepView],
                 failed: Callable[[StepViewProcessor, StepView, Exception], None],
                 reader: Any = None) -> None:
        """A frame of steps: ``on_step`` while a step has more to do (the rank's first,
        warm-up, operations between steps to fold in), then its sums in locals over the
        rest of the frame, in ``on_step``'s order, written back once.

        ``reader``: a processor that reads these figures as of some steps (the budget,
        ``BudgetSpanProcessor.take_group``), fed each view right after this one, as its
        view-by-view group would: ``on_step`` at a view it reads at (its ``read_rule``:
        material monitoring, an operation over its slow limit, or its every-N turn, the
        figures written back first), its count of unread steps alone at the others."""
        on_step, n, i = self.on_step, len(views), 0
        while i < n and (self.rank is None or self._between_ns
                         or self._warmup_seen < self.warmup_steps):
            for proc, handle in ((self, on_step), (reader, getattr(reader, "on_step", None))):
                if handle is not None:
                    try:
                        handle(views[i])
                    except Exception as exc:
                        failed(proc, views[i], exc)
            i += 1
        if i < n:
            self._steady_steps(views, i, failed, reader)

    def _steady_steps(self, views: Sequence[StepView], first: int,
                      failed: Callable[[StepViewProcessor, StepView, Exception], None],
                      reader: Any) -> None:
        """``on_step`` on ``views[first:]`` (past warm-up, nothing between steps to fold
        in), the reader's after each (``on_steps``)."""
        between = 0  # stays 0: a frame of steps has no operation between them
        steps, last_step, wall_ns, mon_ns, rwall, rmon = (
            self.steps, self._last_step, self._wall_ns, self._monitor_ns, self._recent_wall,
            self._recent_monitor)
        recent, window = self._recent, self._window
        count_operations = self._count_operations
        material, slow_ns, every, unchecked = (reader.read_rule() if reader is not None
                                               else (0.0, 0, 0, 0))
        try:
            for k in range(first, len(views)):
                view = views[k]
                try:
                    wall = view.duration_ns + between  # fails where on_step would
                    mon = view.monitor_ns + between
                    steps += 1
                    last_step = view.step
                    wall_ns += view.duration_ns
                    mon_ns += view.monitor_ns
                    if len(recent) >= window:
                        old_wall, old_mon = recent.popleft()
                        rwall, rmon = rwall - old_wall, rmon - old_mon
                    recent.append((wall, mon))
                    rwall, rmon = rwall + wall, rmon + mon
                    if view.operations:
                        count_operations(view)
                except Exception as exc:
                    failed(self, view, exc)
                if reader is None:
                    continue
                try:
                    if unchecked + 1 < every and not (view.operations and (
                            max(map(_duration_of, view.operations)) > slow_ns
                            or view.monitor_ns * 2 >= material * view.duration_ns)):
                        unchecked += 1  # all its on_step does at this view
                        continue
                    self._put_sums(steps, last_step, wall_ns, mon_ns, rwall, rmon)
                    reader.set_unchecked(unchecked)
                    reader.on_step(view)
                except Exception as exc:
                    failed(reader, view, exc)
                unchecked = reader.unchecked()
        finally:
            self._put_sums(steps, last_step, wall_ns, mon_ns, rwall, rmon)
            if reader is not None:
                reader.set_unchecked(unchecked)

    def _put_sums(self, steps: int, last_step: int, wall_ns: int, mon_ns: int,
                  recent_wall_ns: int, recent_monitor_ns: int) -> None:
        """The running sums ``_steady_steps`` keeps in locals, written back."""
        self.steps, self._last_step, self._wall_ns, self._monitor_ns = (
            steps, last_step, wall_ns, mon_ns)
        self._recent_wall, self._recent_monitor = recent_wall_ns, recent_monitor_ns

    def on_operation(self, view: StepView) -> None:
        """Count monitoring done between steps (monitoring, not training)."""
        if self.rank is None:
            self.rank = view.rank
        d = view.duration_ns
        self._wall_ns += d
        self._monitor_ns += d
        self._between_ns += d
        self._count_operations(view)

    def _count_operations(self, view: StepView) -> None:
        ops = self._ops
        step = view.step
        for name, dur in view.operations:
            op = ops.get(name)
            if op is None:
                ops[name] = [1, dur, dur, step, step, dur, 1]
            else:
                op[_CALLS] += 1
                op[_TOTAL] += dur
                if dur > op[_MAX]:
                    op[_MAX] = dur
                if step != op[_LAST_STEP]:
                    op[_CALL_STEPS] += 1
                op[_LAST_STEP] = step

    # -- reading ------------------------------------------------------------------------
    def cumulative_ratio(self) -> float:
        """Monitoring over training time so far, everything counted (0 before any)."""
        wall, mon = self._wall_ns, self._monitor_ns  # int reads: atomic enough without the lock
        return _ratio(mon, wall - mon)

    def ratios(self) -> tuple[float, float]:
        """(recent, cumulative) ratios, cheaper than a snapshot."""
        with self._lock:
            rwall = self._recent_wall + self._between_ns
            rmon = self._recent_monitor + self._between_ns
            return (_ratio(rmon, rwall - rmon), self.cumulative_ratio())

    def steady_ratio(self, settled_only: bool = False) -> float:
        """Monitoring over training time without warm-up (what the budget status reads).

        ``settled_only`` leaves out the operations seen only once so far (their one call
        may be warm-up): what a budget *warning* waits for.
        """
        with self._lock:
            return self._steady_ratio_locked(settled_only)

    def _steady_train_per_step_locked(self) -> float:
        train = self._wall_ns - self._monitor_ns
        steady_steps = self.steps - self._warmup_seen
        if steady_steps > 0:
            return max(0, train - self._warmup_train_ns) / steady_steps
        return train / self.steps if self.steps else 0.0

    def _steady_ratio_locked(self, settled_only: bool = False) -> float:
        # Each operation at its steady cost per call (its calls after the first) and its
        # interval, over the steady training time per step: the advisor's projections,
        # summed. The interval is the measured one, or longer when the operation has not
        # run for a while (it stopped: its share decays) -- never the fencepost of
        # "2 calls in 11 steps" that would double a 10-step operation early in a run.
        s = self._steady_train_per_step_locked()
        if s <= 0 or not self.steps:
            return 0.0
        last = self._last_step
        total = 0.0
        for op in self._ops.values():
            calls = op[_CALLS]
            if calls >= 2:
                cost = (op[_TOTAL] - op[_FIRST_NS]) / (calls - 1)
                # Steps per call: the steps with a call span (last - first) in (steps - 1)
                # intervals, each step holding calls / steps of the calls.
                steps_n = op[_CALL_STEPS]
                every = ((op[_LAST_STEP] - op[_FIRST_STEP]) / (steps_n - 1) * steps_n / calls
                         if steps_n >= 2 else 0.0)
                k = max(every, (last - op[_FIRST_STEP] + 1) / calls)
                if k <= 0:  # step indices went backwards (a restarted count)
                    k = self.steps / calls
            elif settled_only:
                continue
            else:  # one call so far: over the steps so far (nothing better is known)
                cost, k = op[_TOTAL], float(self.steps)
            total += cost / (k * s)
        return total

    def evidence(self) -> tuple[int, float, list[tuple[str, int, int]]]:
        """What a verdict needs to know it has enough to go on: (steps, training seconds,
        and, while the run is younger than ``recent_window_steps`` steps, the operations
        whose calls all came at one step, with that step and their calls).

        Only a young run's: an operation's one call spread over the few steps so far reads
        as hundreds of percent; after that many steps, it is a one-off's true share."""
        with self._lock:
            once = ([(name, op[_FIRST_STEP], op[_CALLS]) for name, op in self._ops.items()
                     if op[_CALL_STEPS] == 1] if self.steps < self._window else [])
            return self.steps, max(0, self._wall_ns - self._monitor_ns) / 1e9, once

    def snapshot(self) -> OverheadSnapshot:
        """All figures, copied under the lock."""
        with self._lock:
            wall, mon = self._wall_ns, self._monitor_ns
            train = wall - mon
            rwall = self._recent_wall + self._between_ns
            rmon = self._recent_monitor + self._between_ns
            ops = {
                name: OperationCost(name, op[_CALLS], op[_TOTAL] / 1e9, op[_MAX] / 1e9,
                                    _ratio(op[_TOTAL], train), op[_FIRST_STEP],
                                    op[_LAST_STEP], op[_FIRST_NS] / 1e9, op[_CALL_STEPS])
                for name, op in self._ops.items()
            }
            return OverheadSnapshot(
                rank=self.rank, steps=self.steps, wall_seconds=wall / 1e9,
                monitoring_seconds=mon / 1e9,
                cumulative_ratio=_ratio(mon, train),
                recent_ratio=_ratio(rmon, rwall - rmon),
                recent_steps=len(self._recent),
                instrumentation_ratio=self._instrumentation_ratio(),
                operations=ops,
                wall_share=_ratio(mon, wall),
                recent_wall_share=_ratio(rmon, rwall),
                steady_ratio=self._steady_ratio_locked(),
                warmup_steps=self._warmup_seen,
                warmup_training_seconds=self._warmup_train_ns / 1e9,
                steady_train_seconds_per_step=self._steady_train_per_step_locked() / 1e9,
            )

    def _instrumentation_ratio(self) -> float | None:
        """The share of the loop's wall time otel-train takes from the training thread over
        the recent window (None without a meter, or before the first drained step)."""
        # The exporter process's copy of the chain has a stand-in meter: the training
        # process's copy answers for the gauge and the costs.
        recent_share = getattr(self._self_cost, "recent_share", None)
        return recent_share() if recent_share is not None else None
