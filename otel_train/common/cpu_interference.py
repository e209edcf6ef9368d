"""How much slower the training thread computes while otel-train's background runs beside it.

The training thread's wait (GIL, run queue) is measured from its schedstat; what that misses is
the *on-CPU* slowdown: a thread that shares a physical core (SMT siblings, the 2 vCPUs of a small
VM), caches and memory bandwidth with the exporter process or the span worker executes the same
step in more CPU time while they run. A paired A/B sees it; wait accounting does not.

``CpuInterferenceRegression`` estimates it inside the run. Each interval between the span
worker's own-cost samples gives one point: ``busy`` = the share of the interval the exporter
process was on a CPU (its CPU / wall; the span worker's own share is charged apart, at a
measured factor: ``SHARED_INTERPRETER_FACTOR`` in self_cost.py) and ``cpu_per_step`` = the
training thread's on-CPU time per step begun in it. The background works in bursts (a drain,
then the exporter encoding and sending that frame), so ``busy`` swings between ~0 and ~1
from one interval to the next while the steps stay the same. The machine's own speed drifts
too (a shared host moves a step's CPU by ~20% over seconds), slowly next to the intervals:
the line is fitted on the *differences* between consecutive fitted intervals (``Δcpu_per_step
= slope x Δbusy``, weighted least squares through the origin, each difference weighted by the
harmonic mean of the two intervals' steps), where the drift cancels and the background's
bursts remain. The slope is the extra training-thread CPU per step at full background
activity; the charge for the run so far is ``slope x sum(steps_i x busy_i)``: the training
CPU the background cost, step by step. Only intervals that trained at full pace fit the line
(``fit=False`` for the rest, SelfCostMeter decides: an evaluation or a script's own work
between steps would read as slowdown); every interval's busy steps are charged. A slope that
is not clearly positive (fewer than ``min_points`` points, no spread in ``busy``, or a slope
below its standard error) charges nothing: where the background's bursts do not slow the
training thread the slope is ~0 and so is the charge.

Usage::

    reg = CpuInterferenceRegression()
    reg.add(busy=0.4, cpu_per_step_ns=560_000.0, steps=90)   # one sample interval
    reg.charge_ns()                                          # training CPU lost so far
"""

from __future__ import annotations

import math


class CpuInterferenceRegression:
    """Weighted least squares of training CPU per step on background busy share, fitted on
    consecutive intervals' differences, O(1) memory."""

    def __init__(self, min_points: int = 30) -> None:
        self.min_points = min_points
        self.points = 0
        self._busy_steps = 0.0  # sum(steps_i x busy_i) over every interval, fitted or not
        self._last: tuple[float, float, float] | None = None  # the last fitted (w, x, y)
        self._w = self._wy = 0.0  # steps and training CPU over the fitted intervals
        # Over the differences: weight d, Δx (busy), Δy (training CPU ns per step).
        self._d = self._dxx = self._dxy = self._dyy = 0.0

    def add(self, busy: float, cpu_per_step_ns: float, steps: int, fit: bool = True) -> None:
        """One interval: the background's busy share, the training CPU per step, the steps;
        ``fit=False``: charged, but not a point of the line."""
        if steps <= 0 or not math.isfinite(busy) or not math.isfinite(cpu_per_step_ns):
            return
        w, x, y = float(steps), min(max(busy, 0.0), 1.0), cpu_per_step_ns
        self._busy_steps += w * x
        if not fit:
            return
        self.points += 1
        self._w += w
        self._wy += w * y
        last, self._last = self._last, (w, x, y)
        if last is None:
            return
        d = w * last[0] / (w + last[0])
        dx, dy = x - last[1], y - last[2]
        self._d += d
        self._dxx += d * dx * dx
        self._dxy += d * dx * dy
        self._dyy += d * dy * dy

    @property
    def busy_steps(self) -> float:
        """sum(steps_i x busy_i): steps weighted by how busy the background was."""
        return self._busy_steps

    def line_ns(self) -> tuple[float, float] | None:
        """(slope, its standard error) in ns per busy step as fitted so far, however unclear;
        None before ``min_points`` points or without spread in ``busy``."""
        if self.points < self.min_points or self._d <= 0:
            return None
        sxx = self._dxx / self._d
        if sxx <= 1e-6:  # the background never varied: nothing to compare
            return None
        slope = self._dxy / self._dxx
        # Standard error of the slope with the differences as the sample size (weights only
        # shape the line): the residual variance over the spread of Δbusy.
        resid = max(0.0, self._dyy - slope * self._dxy) / self._d
        return slope, math.sqrt(resid / (sxx * max(1, self.points - 2)))

    def slope_ns(self) -> float | None:
        """Extra training CPU per step at full background activity, None until it is clear."""
        line = self.line_ns()
        if line is None or line[0] <= 0 or line[0] < line[1]:
            return None
        # Never more than the whole step's CPU: a line through a few outliers must not charge
        # the run more than it computed.
        return min(line[0], self._wy / self._w)

    def charge_ns(self, busy_steps: float | None = None) -> float:
        """Training CPU the background cost over ``busy_steps`` (default: the whole run)."""
        slope = self.slope_ns()
        if slope is None:
            return 0.0
        return slope * (self._busy_steps if busy_steps is None else busy_steps)
