"""How much slower the training thread computes while otel-train's background runs beside it.

The training thread's wait (GIL, run queue) is measured from its schedstat; what that misses is
the *on-CPU* slowdown: a thread that shares a physical core (SMT siblings, the 2 vCPUs of a small
VM), caches and memory bandwidth with the exporter process or the span worker executes the same
step in more CPU time while they run. A paired A/B sees it; wait accounting does not.

``CpuInterferenceRegression`` estimates it inside the run. Each interval between the span
worker's own-cost samples gives one point: ``busy`` = the share of the interval otel-train's background was on a CPU
(span worker + exporter process CPU / wall) and ``cpu_per_step`` = the training thread's on-CPU
time per step begun in it. The background works in bursts (a drain, then the exporter encoding
and sending that frame), so ``busy`` swings between ~0 and ~1 within seconds while the steps stay
the same: a weighted least-squares line through the points (weights: steps in the interval)
has a slope that is the extra training-thread CPU per step at full background activity. The
charge for the run so far is ``slope x sum(steps_i x busy_i)``: the training CPU the background
cost, step by step. Only intervals that trained at full pace fit the line (``fit=False``
for the rest: a step rate below half the run's usual one means the training thread did other
work in it, a block's set-up or an evaluation, whose CPU per step would read as slowdown);
every interval's busy steps are charged. A slope that is not clearly positive (fewer than
``min_points`` points, no spread in ``busy``, or a slope below its standard error) charges
nothing: on a machine where the exporter runs on a core of its own the slope is ~0 and so is
the charge.

Usage::

    reg = CpuInterferenceRegression()
    reg.add(busy=0.4, cpu_per_step_ns=560_000.0, steps=90)   # one sample interval
    reg.charge_ns()                                          # training CPU lost so far
"""

from __future__ import annotations

import math


class CpuInterferenceRegression:
    """Weighted least squares of training CPU per step on background busy share, O(1) memory."""

    def __init__(self, min_points: int = 30) -> None:
        self.min_points = min_points
        self.points = 0
        self._busy_steps = 0.0  # sum(steps_i x busy_i) over every interval, fitted or not
        # Weighted sums: weights w (steps), x (busy share), y (training CPU ns per step).
        self._w = self._wx = self._wy = self._wxx = self._wxy = self._wyy = 0.0

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
        self._wx += w * x
        self._wy += w * y
        self._wxx += w * x * x
        self._wxy += w * x * y
        self._wyy += w * y * y

    @property
    def busy_steps(self) -> float:
        """sum(steps_i x busy_i): steps weighted by how busy the background was."""
        return self._busy_steps

    def slope_ns(self) -> float | None:
        """Extra training CPU per step at full background activity, None until it is clear."""
        if self.points < self.min_points or self._w <= 0:
            return None
        w = self._w
        mx, my = self._wx / w, self._wy / w
        sxx = self._wxx / w - mx * mx
        if sxx <= 1e-6:  # the background never varied: nothing to compare
            return None
        sxy = self._wxy / w - mx * my
        slope = sxy / sxx
        syy = max(0.0, self._wyy / w - my * my)
        # Standard error of the slope with the points as the sample size (weights only shape
        # the line): the residual variance over the spread of busy.
        resid = max(0.0, syy - slope * sxy)
        se = math.sqrt(resid / (sxx * max(1, self.points - 2)))
        if slope <= 0 or slope < se:
            return None
        # Never more than the whole step's CPU: a line through a few outliers must not charge
        # the run more than it computed.
        return min(slope, my)

    def charge_ns(self, busy_steps: float | None = None) -> float:
        """Training CPU the background cost over ``busy_steps`` (default: the whole run)."""
        slope = self.slope_ns()
        if slope is None:
            return 0.0
        return slope * (self._busy_steps if busy_steps is None else busy_steps)
