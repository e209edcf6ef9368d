"""Monitoring budget: status, warnings, and an advisor that projects each operation's cost.

Status comes from the *steady-state* overhead ratio (monitoring over training time, the
first call of each operation and the warm-up steps replaced by their steady figures, see
``overhead``): ``ok`` up to ``budget`` (0.05), ``warning`` above it, ``critical`` above
``critical`` (0.10). So a validation pass that costs 96 ms once (warm-up) and 3.6 ms
afterwards is judged on 3.6 ms, while the cumulative ratio still counts the 96 ms (an
operation seen once counts at that one call: nothing better is known yet). A warning is
logged when the status gets worse, and when one monitoring call runs longer than
``slow_operation_seconds`` (30 s); both are rate-limited.

No verdict without evidence (``BudgetSpanProcessor.evidence_gap``): before a share is said,
the run needs ``min_steps`` (10) steps, ``MIN_VERDICT_TRAINING_SECONDS`` (0.1 s) of training
time (so one scheduler stall of a loaded machine, ~10 ms, moves the figure by a tenth of
itself at most), and, while the run is younger than ``recent_window_steps`` (100) steps, a
call at a second step of every operation: until an operation runs again, its cost per call
after the first and its interval are unknown, and its one call over a few steps would read
as a share of hundreds of percent (two validations after one step, one per loader, are two
calls but no interval yet). Once the run is over (the final costs), an operation seen at
one step only is a one-off and counts as one. Until the verdict has its evidence, the
console says "not enough steps yet" and why.

The status does not flip on noise: it rises as soon as the steady figure crosses a
threshold, and falls back only once the figure is ``STATUS_HYSTERESIS`` (10%) of the
threshold below it (a WARNING at 5% clears under 4.5%, a CRITICAL at 10% under 9%); a
status held that way says so ("held until under 4.5%").

One verdict, one figure: ``BudgetVerdict`` says the status with the steady-state figure that
drives it first, then the recent and cumulative figures, and, when one of those sits on the
other side of the threshold, why the verdict stands (long warm-up steps, a first call's
warm-up, a recent window without a monitoring call). The console, the costs table and the
budget warnings all say it that way::

    monitoring CRITICAL: 15.0% steady state (over the 10% critical level); recent 4.4%,
    total 4.4%. Recent and total are lower: the 5 warm-up steps (2.000 s of training each,
    against 0.100 s after) count there, not in the steady state. The steady state is what
    a long run converges to, so the verdict stands.                         (one line)

The advisor (``advisor.py``, its names re-exported here) projects each operation's cost.

Usage::

    overhead = OverheadSpanProcessor()
    budget = BudgetSpanProcessor(overhead, budget=0.05, critical=0.10)
    budget.status()                         # "ok" | "warning" | "critical"
    budget.verdict().describe()             # "CRITICAL: 11.4% steady state (...); ..."
    advise(overhead.snapshot(), 0.05)       # [OperationAdvice(...), ...]
"""

from __future__ import annotations

from functools import partial
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from otel_train.common.units import percent
from otel_train.derived.advisor import (  # noqa: F401 - re-exported: budget's names
    PATTERN_IRREGULAR,
    PATTERN_ONCE,
    PATTERN_PERIODIC,
    OperationAdvice,
    advise,
)
from otel_train.derived.overhead import OverheadSnapshot, OverheadSpanProcessor
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.derived.step_ordered_log import StepOrderedLog
from otel_train.records.steps_view import StepView, StepViewProcessor

_log = logging.getLogger("otel_train")

STATUS_OK = "ok"
STATUS_WARNING = "warning"
STATUS_CRITICAL = "critical"
_SEVERITY = {STATUS_OK: 0, STATUS_WARNING: 1, STATUS_CRITICAL: 2}


# A verdict waits for this much training time (and ``min_steps`` steps, and, in a young
# run, a call at a second step of each operation): a share of less is timer and scheduler
# noise.
MIN_VERDICT_TRAINING_SECONDS = 0.1
# A status falls back only once its figure is this share of the threshold below it.
STATUS_HYSTERESIS = 0.10


def budget_status(ratio: float, budget: float, critical: float) -> str:
    """ok / warning / critical for an overhead ratio."""
    if ratio > critical:
        return STATUS_CRITICAL
    if ratio > budget:
        return STATUS_WARNING
    return STATUS_OK


def held_status(ratio: float, held: str | None, budget: float, critical: float,
                hysteresis: float = STATUS_HYSTERESIS) -> str:
    """The status with hysteresis: up at once, down only ``hysteresis`` under a threshold.

    ``held`` is the status so far (None: none yet). A CRITICAL run at 9.5% stays CRITICAL
    (the 10% level less 10% of it is 9%); at 8% it is a WARNING; under 4.5% it is OK.
    """
    plain = budget_status(ratio, budget, critical)
    if held is None or _SEVERITY[plain] >= _SEVERITY[held]:
        return plain
    if held == STATUS_CRITICAL and ratio > critical * (1.0 - hysteresis):
        return STATUS_CRITICAL
    if ratio > budget * (1.0 - hysteresis):
        return STATUS_WARNING
    return plain


# Warm-up steps this much slower than the steady ones explain a total below steady state.
_SLOW_WARMUP_FACTOR = 1.5


@dataclass(frozen=True)
class VerdictContext:
    """What explains a figure that disagrees with the verdict (a snapshot's, or a report's)."""

    steps: int = 0
    warmup_steps: int = 0
    warmup_seconds_per_step: float = 0.0
    steady_seconds_per_step: float = 0.0
    first_call_excess_seconds: float = 0.0  # first calls over their steady cost, summed
    late_operation: tuple[str, int] | None = None  # (name, first step) of a late starter
    recent_steps: int | None = None

    @classmethod
    def of_snapshot(cls, snap: OverheadSnapshot) -> VerdictContext:
        """From the overhead figures."""
        ops = [(op.name, op.calls, op.first_seconds, op.steady_mean_seconds, op.first_step)
               for op in snap.operations.values()]
        return cls._of(snap.steps, snap.warmup_steps, snap.warmup_training_seconds,
                       snap.steady_train_seconds_per_step, ops, snap.recent_steps)

    @classmethod
    def of_costs(cls, data: Mapping[str, Any]) -> VerdictContext:
        """From a costs report (``run.costs()`` or monitoring_costs.json)."""
        warm = data.get("warmup") or {}
        ops = [(name, int(op.get("calls", 0)), float(op.get("first_seconds") or 0.0),
                float(op.get("steady_mean_seconds") or 0.0), int(op.get("first_step") or 0))
               for name, op in (data.get("operations") or {}).items()]
        return cls._of(int(data.get("steps") or 0), int(warm.get("steps") or 0),
                       float(warm.get("training_seconds") or 0.0),
                       float(warm.get("steady_training_seconds_per_step") or 0.0), ops,
                       data.get("recent_steps"))

    @classmethod
    def _of(cls, steps: int, warmup_steps: int, warmup_seconds: float, steady_per_step: float,
            ops: list[tuple[str, int, float, float, int]],
            recent_steps: int | None) -> VerdictContext:
        excess = sum(max(0.0, first - steady) for _, calls, first, steady, _ in ops
                     if calls >= 2)
        # An operation that first ran after the first tenth of the run: the total spreads
        # it over steps it was not running in.
        late = [(name, first) for name, calls, _, _, first in ops
                if calls >= 2 and steps and first > steps / 10]
        return cls(steps, warmup_steps, warmup_seconds / warmup_steps if warmup_steps else 0.0,
                   steady_per_step, excess, min(late, key=lambda x: x[1]) if late else None,
                   recent_steps)


@dataclass(frozen=True)
class BudgetVerdict:
    """The budget status, the figure that drives it (steady state), and the other windows."""

    steady: float
    recent: float | None
    total: float | None
    budget: float
    critical: float
    label: str = "steady state"  # the driving figure's name
    # A status the figure alone no longer reaches, held by hysteresis (``held_status``).
    held: str | None = None
    hysteresis: float = STATUS_HYSTERESIS

    @property
    def status(self) -> str:
        """ok / warning / critical: from the driving figure, or the status it holds."""
        return self.held or budget_status(self.steady, self.budget, self.critical)

    def disagreeing(self) -> list[str]:
        """The other figures on the other side of the threshold the status turns on."""
        status = self.status
        limit = self.critical if status == STATUS_CRITICAL else self.budget
        if self.held is not None:  # held: the level it holds until
            limit *= 1.0 - self.hysteresis
        out = []
        for label, value in (("recent", self.recent), ("total", self.total)):
            if value is None:
                continue
            if (value > limit) if status == STATUS_OK else (value <= limit):
                out.append(label)
        return out

    def describe(self, digits: int = 1, context: VerdictContext | None = None,
                 all_figures: bool = True, of_training_time: bool = False,
                 explain: bool = True) -> str:
        """``STATUS: X% steady state (threshold); recent Y%, total Z%[. Why]``.

        ``all_figures=False`` leaves out a figure that reads the same as the driving one,
        unless it disagrees with the verdict; ``of_training_time`` says what X% is of;
        ``explain=False`` leaves out why a disagreeing figure does not move the verdict
        (the console says it once, not on every line).
        """
        pct = f"{{:.{digits}%}}".format
        status = self.status
        if self.held is not None:
            threshold = self.critical if status == STATUS_CRITICAL else self.budget
            limit = f"held until under {_percent(threshold * (1.0 - self.hysteresis))}"
        elif status == STATUS_CRITICAL:
            limit = f"over the {_percent(self.critical)} critical level"
        elif status == STATUS_WARNING:
            limit = f"over the {_percent(self.budget)} budget"
        else:
            limit = f"budget {_percent(self.budget)}"
        figure = (f"{pct(self.steady)} of training time in {self.label}" if of_training_time
                  else f"{pct(self.steady)} {self.label}")
        text = f"{status.upper()}: {figure} ({limit})"
        wrong = self.disagreeing()
        others = [f"{label} {pct(value)}" for label, value in
                  (("recent", self.recent), ("total", self.total))
                  if value is not None and (all_figures or label in wrong
                                            or pct(value) != pct(self.steady))]
        if others:
            text += "; " + ", ".join(others)
        if wrong and explain:
            text += ". " + self.why(wrong, context or VerdictContext())
        return text

    def why(self, labels: list[str], ctx: VerdictContext) -> str:
        """Why the figures ``labels`` disagree with the verdict, and why the verdict stands."""
        direction = "higher" if self.status == STATUS_OK else "lower"
        if ctx.recent_steps is not None and ctx.steps and ctx.recent_steps >= ctx.steps:
            # The recent window still holds the whole run: the same figure as the total.
            groups = [(labels, self._why_total(ctx))]
        else:
            groups = [([label], self._why_total(ctx) if label == "total"
                       else self._why_recent(ctx)) for label in labels]
        sentences = []
        for names, cause in groups:
            subject = ("the total" if names == ["total"] else " and ".join(names))
            verb = "are" if len(names) > 1 else "is"
            sentences.append(f"{subject[0].upper()}{subject[1:]} {verb} {direction}: {cause}.")
        if self.status == STATUS_OK:
            sentences.append(f"The {self.label}, without warm-up, is what a long run "
                             "converges to.")
        else:
            sentences.append(f"The {self.label} is what a long run converges to, so the "
                             "verdict stands.")
        return " ".join(sentences)

    def _why_total(self, ctx: VerdictContext) -> str:
        total = self.total or 0.0
        if total < self.steady:
            if (ctx.warmup_steps and ctx.warmup_seconds_per_step
                    > _SLOW_WARMUP_FACTOR * ctx.steady_seconds_per_step > 0):
                return (f"the {ctx.warmup_steps} warm-up steps ({ctx.warmup_seconds_per_step:.3f}"
                        f" s of training each, against {ctx.steady_seconds_per_step:.3f} s "
                        "after) count there, not in the steady state")
            if ctx.late_operation is not None:
                name, first = ctx.late_operation
                return f"the steps before {name!r} first ran (step {first}) count there"
        elif ctx.first_call_excess_seconds > 0:
            return (f"the first calls' warm-up ({ctx.first_call_excess_seconds:.3g} s over "
                    "their steady cost) counts there once")
        return ("everything since the start is averaged there, while the steady state takes "
                "each operation at its cost per call after the first and its interval")

    def _why_recent(self, ctx: VerdictContext) -> str:
        window = f"the last {ctx.recent_steps} steps" if ctx.recent_steps else "the last steps"
        if (self.recent or 0.0) < self.steady:
            return f"{window} had fewer monitoring calls than their interval brings"
        return f"{window} had a monitoring call, which weighs more there than over its interval"


_percent = partial(percent, spec=".3g")  # a threshold as people write it: 5%, 2.5%, 10%


def snapshot_verdict(snap: OverheadSnapshot, budget: float, critical: float) -> BudgetVerdict:
    """The verdict of an overhead snapshot."""
    return BudgetVerdict(snap.steady_ratio, snap.recent_ratio, snap.cumulative_ratio,
                         budget, critical)

_STATUS_CHECK_EVERY_STEPS = 8  # steps between status checks, none monitoring materially


class BudgetSpanProcessor(StepViewProcessor):
    """Budget status and warnings; reads the figures of an ``OverheadSpanProcessor``.

    Add it after the overhead processor (it reads the ratio the step just updated)."""

    view_by_view = True  # the console reads its figures as of each step
    state_fields = ("_unchecked", "_worst_warned", "slow_operations", "warnings_logged",
                    "_status")

    def __init__(
        self,
        overhead: OverheadSpanProcessor,
        budget: float = 0.05,
        critical: float = 0.10,
        slow_operation_seconds: float = 30.0,
        min_steps: int = 10,
        warn_interval_seconds: float = 300.0,
        logger: logging.Logger | StepOrderedLog | None = None,
        world_size: int = 1,
        min_training_seconds: float = MIN_VERDICT_TRAINING_SECONDS,
        hysteresis: float = STATUS_HYSTERESIS,
    ) -> None:
        super().__init__()
        self.world_size = world_size  # > 1: warnings name their rank
        if not 0.0 < budget < critical < 1.0:
            raise ValueError("budget and critical must satisfy 0 < budget < critical < 1")
        if not min_training_seconds >= 0:
            raise ValueError("min_training_seconds must be >= 0")
        if not 0.0 <= hysteresis < 1.0:
            raise ValueError("hysteresis must be >= 0 and < 1")
        self._min_training_seconds = min_training_seconds
        self.hysteresis = hysteresis
        self._status: str | None = None  # the status so far, hysteresis applied
        if not slow_operation_seconds > 0:
            raise ValueError("slow_operation_seconds must be > 0")
        self.overhead = overhead
        self.budget = budget
        self.critical = critical
        self._slow_op_ns = int(slow_operation_seconds * 1e9)
        self.slow_operation_seconds = slow_operation_seconds
        self._min_steps = min_steps
        self._unchecked = 0  # steps without monitoring since the status was checked
        log = logger or _log
        self._warn = RateLimitedLogger(log, warn_interval_seconds)  # type: ignore[arg-type]
        self._op_warn = RateLimitedLogger(log, 60.0)  # type: ignore[arg-type]
        # A StepOrderedLog (the console is on) is told which step each warning is about.
        self._log_at = getattr(log, "at", None)
        self._worst_warned = STATUS_OK
        self.slow_operations: dict[str, int] = {}  # operation -> calls over the threshold
        self.warnings_logged = 0

    def on_step(self, view: StepView) -> None:
        """Check the operations of this step, then the status."""
        if self._log_at is not None:
            self._log_at(view.step)
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

    def take_group(self, before: Sequence[StepViewProcessor], views: Sequence[StepView],
                   failed: Callable[[StepViewProcessor, StepView, Exception], None]) -> bool:
        """After its overhead alone (the console off): the group's frame in one loop, the
        overhead's (``OverheadSpanProcessor.on_steps`` with this as its reader)."""
        if self._log_at is not None or len(before) != 1 or before[0] is not self.overhead:
            return False
        self.overhead.on_steps(views, failed, reader=self)
        return True

    def read_rule(self) -> tuple[float, int, int, int]:
        """When ``on_step`` reads the overhead's figures (a status check or a slow operation's
        warning): (material share, slow operation ns, every N steps, unchecked steps)."""
        return self.budget, self._slow_op_ns, _STATUS_CHECK_EVERY_STEPS, self._unchecked

    def unchecked(self) -> int:
        """Steps since the status was last checked."""
        return self._unchecked

    def set_unchecked(self, steps: int) -> None:
        """Steps since the status was last checked, counted by a group's loop."""
        self._unchecked = steps

    def on_operation(self, view: StepView) -> None:
        """Check a monitoring operation done between steps."""
        if self._log_at is not None:
            self._log_at(view.step)
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
        # An operation seen once may be warming up: no verdict before its second call (one
        # call over slow_operation_seconds warns on its own, above).
        if self.evidence_gap() is not None:
            return
        status = self._status = held_status(ov.steady_ratio(), self._status, self.budget,
                                            self.critical, self.hysteresis)
        if _SEVERITY[status] <= _SEVERITY[self._worst_warned]:
            if status == STATUS_OK:
                self._worst_warned = STATUS_OK  # recovered: a later breach warns again
            return
        # Said with the figure the console and the costs table show.
        snap = ov.snapshot()
        verdict = self._verdict(snap.steady_ratio, snap.recent_ratio, snap.cumulative_ratio)
        self._worst_warned = status
        if self._warn.warning(
                f"status-{self._worst_warned}",
                "otel-train: %smonitoring %s [monitoring excluded from training time; see "
                "monitoring_costs.json or `otel-train costs` for what to cut]",
                self._who(), verdict.describe(context=VerdictContext.of_snapshot(snap),
                                              of_training_time=True)):
            self.warnings_logged += 1

    def _who(self) -> str:
        return f"rank {self.overhead.rank}: " if self.world_size > 1 else ""

    @property
    def judging(self) -> bool:
        """Evidence enough for a verdict (``evidence_gap``): before, a first call's cost over
        one or two steps would read as a share of hundreds of percent."""
        return self.evidence_gap() is None

    def evidence_gap(self, run_over: bool = False) -> str | None:
        """What the verdict still waits for, in words (None: it has enough to go on).

        ``run_over``: the run has ended, no operation will run again: one seen at one step
        only is a one-off, not an operation waiting for its second call."""
        steps, training_seconds, once = self.overhead.evidence()
        if run_over:
            once = []
        if steps < self._min_steps:
            return f"not enough steps yet (a verdict needs {self._min_steps})"
        if training_seconds < self._min_training_seconds:
            return (f"not enough steps yet (a verdict needs {self._min_training_seconds:g} s "
                    "of training time)")
        if once:
            name, step, calls = min(once, key=lambda item: item[1])
            if len(once) > 1:  # several, the first seen named with its step
                names = " and ".join(repr(n) for n, _, _ in sorted(once, key=lambda x: x[1]))
                return (f"not enough steps yet ({names} ran at one step each, the first at "
                        f"step {step}: their steady cost needs a call at a second step)")
            if calls == 1:
                return (f"not enough steps yet ({name!r} ran once, at step {step}: its "
                        "steady cost needs a second call)")
            return (f"not enough steps yet ({name!r} ran {calls} times, all at step "
                    f"{step}: its interval needs a call at another step)")
        return None

    @property
    def min_steps(self) -> int:
        """Steps before the first verdict."""
        return self._min_steps

    def status(self) -> str:
        """ok / warning / critical from the steady-state ratio, hysteresis applied."""
        return self.verdict().status

    def verdict(self) -> BudgetVerdict:
        """The status with its driving figure and the recent and cumulative ones."""
        recent, total = self.overhead.ratios()
        return self._verdict(self.overhead.steady_ratio(), recent, total)

    def _verdict(self, steady: float, recent: float, total: float) -> BudgetVerdict:
        status = held_status(steady, self._status, self.budget, self.critical, self.hysteresis)
        held = status if status != budget_status(steady, self.budget, self.critical) else None
        return BudgetVerdict(steady, recent, total, self.budget, self.critical, held=held,
                             hysteresis=self.hysteresis)

    def advice(self) -> list[OperationAdvice]:
        """The advisor's projections for every operation seen so far."""
        return advise(self.overhead.snapshot(), self.budget)
