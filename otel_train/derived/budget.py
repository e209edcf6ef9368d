"""Monitoring budget: status, warnings, and an advisor that projects each operation's cost.

Status comes from the *steady-state* overhead ratio (monitoring over training time, the
first call of each operation and the warm-up steps replaced by their steady figures, see
``overhead``): ``ok`` up to ``budget`` (0.05), ``warning`` above it, ``critical`` above
``critical`` (0.10). So a validation pass that costs 96 ms once (warm-up) and 3.6 ms
afterwards is judged on 3.6 ms, while the cumulative ratio still counts the 96 ms (an
operation seen once counts at that one call: nothing better is known yet). A warning is
logged when the status gets worse, not before ``min_steps`` steps and leaving out operations
seen only once (so one evaluation at step 0 or a slow first call does not cry wolf), and
when one monitoring call runs longer than ``slow_operation_seconds`` (30 s); both are
rate-limited.

The advisor does the "estimate the cost before enabling it" arithmetic for the user: from each
operation's steady cost per call ``c``, its interval ``k`` (steps between calls) and the
steady training time per step ``s``, its projected overhead is ``c / (k*s)`` and the
smallest interval that keeps it within budget ``b`` alone is ``ceil(c / (b*s))``: a 180 s
snapshot on 3.5 s steps needs ``180 / (0.05 x 3.5)`` = 1029 steps between calls.

Usage::

    overhead = OverheadSpanProcessor()
    budget = BudgetSpanProcessor(overhead, budget=0.05, critical=0.10)
    budget.status()                         # "ok" | "warning" | "critical"
    advise(overhead.snapshot(), 0.05)       # [OperationAdvice(...), ...]
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from typing import Any

from otel_train.derived.overhead import OverheadSnapshot, OverheadSpanProcessor
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.records.steps_view import StepView, StepViewProcessor

_log = logging.getLogger("otel_train")

STATUS_OK = "ok"
STATUS_WARNING = "warning"
STATUS_CRITICAL = "critical"
_SEVERITY = {STATUS_OK: 0, STATUS_WARNING: 1, STATUS_CRITICAL: 2}


def budget_status(ratio: float, budget: float, critical: float) -> str:
    """ok / warning / critical for an overhead ratio."""
    if ratio > critical:
        return STATUS_CRITICAL
    if ratio > budget:
        return STATUS_WARNING
    return STATUS_OK


# Steps between two checks of the budget status, when none has material monitoring.
_STATUS_CHECK_EVERY_STEPS = 8


@dataclass(frozen=True)
class OperationAdvice:
    """The advisor's projection for one monitoring operation."""

    operation: str
    mean_seconds: float
    interval_steps: float | None  # measured steps between calls (None: not periodic yet)
    projected_share: float  # at the measured interval, 0..1
    min_interval_steps: int | None  # smallest interval within budget (None: unknown)
    within_budget: bool
    advice: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


def advise(snapshot: OverheadSnapshot, budget: float) -> list[OperationAdvice]:
    """Project each operation's overhead and the smallest interval within ``budget``."""
    s = snapshot.steady_train_seconds_per_step
    out: list[OperationAdvice] = []
    for op in sorted(snapshot.operations.values(), key=lambda o: -o.total_seconds):
        c = op.steady_mean_seconds
        if op.calls >= 2 and op.last_step > op.first_step:
            k: float | None = (op.last_step - op.first_step) / (op.calls - 1)
        elif snapshot.steps:
            k = max(1.0, snapshot.steps / op.calls)  # one call so far: at most this often
        else:
            k = None
        if k is not None and s > 0:
            projected = c / (k * s)
            min_k: int | None = max(1, math.ceil(c / (budget * s) - 1e-9))
        else:
            projected = op.share
            min_k = None
        within = projected <= budget
        every = f"every {k:g} steps" if k is not None else "so far"
        first = ""
        if op.calls >= 2 and op.first_seconds > 2 * c and op.first_seconds - c > 1e-3:
            first = f" (first call {op.first_seconds:.3g} s: warm-up, left out)"
        if min_k is None:
            text = (f"{op.name}: {c:.3g} s per call {every}; not enough steps yet to "
                    "project its cost")
        elif within:
            text = (f"{op.name}: {c:.3g} s per call{first} {every} -> {projected:.1%} of "
                    f"training time; within the {budget:.0%} budget at every >= {min_k} steps")
        else:
            text = (f"{op.name}: {c:.3g} s per call{first} {every} -> {projected:.1%} of "
                    f"training time, over the {budget:.0%} budget: run it every >= {min_k} "
                    "steps, or make it cheaper (smaller sample, offline)")
        out.append(OperationAdvice(op.name, c, k, projected, min_k, within, text))
    return out


class BudgetSpanProcessor(StepViewProcessor):
    """Budget status and warnings; reads the figures of an ``OverheadSpanProcessor``.

    Add it after the overhead processor (it reads the ratio the step just updated).
    """

    state_fields = ("_unchecked", "_worst_warned", "slow_operations", "warnings_logged")

    def __init__(
        self,
        overhead: OverheadSpanProcessor,
        budget: float = 0.05,
        critical: float = 0.10,
        slow_operation_seconds: float = 30.0,
        min_steps: int = 10,
        warn_interval_seconds: float = 300.0,
        logger: logging.Logger | None = None,
        world_size: int = 1,
    ) -> None:
        super().__init__()
        self.world_size = world_size  # > 1: warnings name their rank
        if not 0.0 < budget < critical < 1.0:
            raise ValueError("budget and critical must satisfy 0 < budget < critical < 1")
        if not slow_operation_seconds > 0:
            raise ValueError("slow_operation_seconds must be > 0")
        self.overhead = overhead
        self.budget = budget
        self.critical = critical
        self._slow_op_ns = int(slow_operation_seconds * 1e9)
        self.slow_operation_seconds = slow_operation_seconds
        self._min_steps = min_steps
        self._unchecked = 0  # steps without monitoring since the status was checked
        self._warn = RateLimitedLogger(logger or _log, warn_interval_seconds)
        self._op_warn = RateLimitedLogger(logger or _log, 60.0)
        self._worst_warned = STATUS_OK
        self.slow_operations: dict[str, int] = {}  # operation -> calls over the threshold
        self.warnings_logged = 0

    def on_step(self, view: StepView) -> None:
        """Check the operations of this step, then the status."""
        if view.operations:
            self._check_operations(view)
            # Monitoring that is a material share of its step can move the status alone:
            # checked now. Lighter monitoring moves it only over many steps.
            if view.monitor_ns * 2 >= self.budget * view.duration_ns:
                self._check_status()
                return
        # Otherwise the steady ratio moves slowly: checked every few steps (a warning is at
        # most that late), which spares the background a check per step when every step
        # monitors.
        self._unchecked += 1
        if self._unchecked >= _STATUS_CHECK_EVERY_STEPS:
            self._check_status()

    def on_operation(self, view: StepView) -> None:
        """Check a monitoring operation done between steps."""
        self._check_operations(view)
        self._check_status()

    def _check_operations(self, view: StepView) -> None:
        for name, dur in view.operations:
            if dur > self._slow_op_ns:
                self.slow_operations[name] = self.slow_operations.get(name, 0) + 1
                if self._op_warn.warning(
                        f"op-{name}",
                        "otel-train: %smonitoring operation %r took %.1f s at step %s (over "
                        "slow_operation_seconds=%g); training waited for it",
                        self._who(), name, dur / 1e9, view.step,
                        self.slow_operation_seconds):
                    self.warnings_logged += 1

    def _check_status(self) -> None:
        self._unchecked = 0
        ov = self.overhead
        if ov.steps < self._min_steps:
            return
        # An operation seen once may be warming up: the warning waits for its second call
        # (one call over slow_operation_seconds warns on its own, above).
        ratio = ov.steady_ratio(settled_only=True)
        status = budget_status(ratio, self.budget, self.critical)
        if _SEVERITY[status] <= _SEVERITY[self._worst_warned]:
            if status == STATUS_OK:
                self._worst_warned = STATUS_OK  # recovered: a later breach warns again
            return
        self._worst_warned = status
        limit = self.critical if status == STATUS_CRITICAL else self.budget
        if self._warn.warning(
                f"status-{status}",
                "otel-train: %smonitoring %s: %.1f%% of training time (steady state, "
                "monitoring excluded from training) is over the %.0f%% %s (see "
                "monitoring_costs.json or `otel-train costs` for what to cut)",
                self._who(), status.upper(), ratio * 100, limit * 100,
                "critical level" if status == STATUS_CRITICAL else "budget"):
            self.warnings_logged += 1

    def _who(self) -> str:
        return f"rank {self.overhead.rank}: " if self.world_size > 1 else ""

    def status(self) -> str:
        """ok / warning / critical from the steady-state ratio."""
        return budget_status(self.overhead.steady_ratio(), self.budget, self.critical)

    def advice(self) -> list[OperationAdvice]:
        """The advisor's projections for every operation seen so far."""
        return advise(self.overhead.snapshot(), self.budget)
