"""Monitoring overhead: the share of training wall time spent on monitoring work.

Definitions (the telemetry contract's ``otel_train_monitoring_overhead_ratio``):

- monitoring time counts only *top-level* monitor phases (a monitor nested in another
  monitor is part of its parent's time, never counted twice), plus monitoring operations
  done between steps (``run.monitor``);
- wall time is the sum of step durations (root ``train.step`` spans) plus the duration of
  the monitoring operations done between steps. Gaps between steps that belong to neither
  are not training time. This is what the histograms give too
  (``rate(phase_sum{kind="monitor"}) / rate(step_sum)``), so the gauge and PromQL agree;
- ``cumulative`` covers the whole run, ``recent`` the last ``recent_window_steps`` steps
  (operations between steps are folded into the next step's entry).

Per operation: calls, total, max, and its share of the cumulative wall time. The library's
own cost (``SelfCostMeter``) over the recent window gives the instrumentation overhead ratio.

Usage::

    overhead = OverheadSpanProcessor(recent_window_steps=100)
    provider.add_span_processor(overhead)
    overhead.snapshot().cumulative_ratio
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from otel_train.self_cost import SelfCostMeter
from otel_train.steps_view import StepView, StepViewProcessor


@dataclass(frozen=True)
class OperationCost:
    """What one monitoring operation cost so far."""

    name: str
    calls: int
    total_seconds: float
    max_seconds: float
    share: float  # of the cumulative training wall time, 0..1
    first_step: int
    last_step: int

    @property
    def mean_seconds(self) -> float:
        """Mean seconds per call."""
        return self.total_seconds / self.calls if self.calls else 0.0


@dataclass(frozen=True)
class OverheadSnapshot:
    """A consistent copy of the overhead figures."""

    rank: Any
    steps: int
    wall_seconds: float
    monitoring_seconds: float
    cumulative_ratio: float
    recent_ratio: float
    recent_steps: int
    instrumentation_ratio: float | None
    operations: dict[str, OperationCost] = field(default_factory=dict)

    @property
    def train_seconds_per_step(self) -> float:
        """Mean non-monitoring wall time per step (what the advisor projects against)."""
        if not self.steps:
            return 0.0
        return max(0.0, self.wall_seconds - self.monitoring_seconds) / self.steps


class OverheadSpanProcessor(StepViewProcessor):
    """Monitoring time / wall time: recent window, cumulative, and per operation."""

    def __init__(self, recent_window_steps: int = 100,
                 self_cost: SelfCostMeter | None = None) -> None:
        super().__init__()
        if not isinstance(recent_window_steps, int) or recent_window_steps < 1:
            raise ValueError("recent_window_steps must be an integer >= 1")
        self._self_cost = self_cost
        self.rank: Any = None
        self.steps = 0
        self._wall_ns = 0
        self._monitor_ns = 0
        self._recent: deque[tuple[int, int]] = deque()
        self._window = recent_window_steps
        self._recent_wall = 0
        self._recent_monitor = 0
        self._between_ns = 0  # operations since the last step, folded into the next entry
        # name -> [calls, total_ns, max_ns, first_step, last_step]
        self._ops: dict[str, list[int]] = {}
        # (self cost ns, cumulative wall ns) every _mark_every steps over the recent window:
        # reading the meter takes its lock, so not on every step
        self._mark_every = max(1, recent_window_steps // 16)
        self._cost_marks: deque[tuple[int, int]] = deque(
            maxlen=recent_window_steps // self._mark_every + 1)

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
        self._wall_ns += view.duration_ns
        self._monitor_ns += view.monitor_ns
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
        if self._self_cost is not None and self.steps % self._mark_every == 1 % self._mark_every:
            self._cost_marks.append((self._self_cost.total_ns, self._wall_ns))

    def on_operation(self, view: StepView) -> None:
        """Count monitoring done between steps (it is training wall time too)."""
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
                ops[name] = [1, dur, dur, step, step]
            else:
                op[0] += 1
                op[1] += dur
                if dur > op[2]:
                    op[2] = dur
                op[4] = step

    # -- reading ------------------------------------------------------------------------
    def cumulative_ratio(self) -> float:
        """Monitoring share of all training wall time so far (0 before any)."""
        wall = self._wall_ns  # two int reads: atomic enough without the lock
        return self._monitor_ns / wall if wall else 0.0

    def ratios(self) -> tuple[float, float]:
        """(recent, cumulative) ratios, cheaper than a snapshot."""
        with self._lock:
            rwall = self._recent_wall + self._between_ns
            rmon = self._recent_monitor + self._between_ns
            return (rmon / rwall if rwall else 0.0, self.cumulative_ratio())

    def snapshot(self) -> OverheadSnapshot:
        """All figures, copied under the lock."""
        with self._lock:
            wall = self._wall_ns
            rwall = self._recent_wall + self._between_ns
            rmon = self._recent_monitor + self._between_ns
            ops = {
                name: OperationCost(name, op[0], op[1] / 1e9, op[2] / 1e9,
                                    op[1] / wall if wall else 0.0, op[3], op[4])
                for name, op in self._ops.items()
            }
            return OverheadSnapshot(
                rank=self.rank, steps=self.steps, wall_seconds=wall / 1e9,
                monitoring_seconds=self._monitor_ns / 1e9,
                cumulative_ratio=self._monitor_ns / wall if wall else 0.0,
                recent_ratio=rmon / rwall if rwall else 0.0,
                recent_steps=len(self._recent),
                instrumentation_ratio=self._instrumentation_ratio(),
                operations=ops,
            )

    def _instrumentation_ratio(self) -> float | None:
        """Library CPU time / wall time over the recent window (None without a meter)."""
        if self._self_cost is None:
            return None
        marks = self._cost_marks
        cost, wall = self._self_cost.total_ns, self._wall_ns
        if marks and len(marks) == marks.maxlen:
            base_cost, base_wall = marks[0]
        else:
            base_cost, base_wall = 0, 0  # the window is not full yet: the whole run so far
        dwall = wall - base_wall
        return max(0.0, (cost - base_cost) / dwall) if dwall > 0 else 0.0
