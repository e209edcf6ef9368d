"""Two-tier console report, as hand-timed training loops print it (to stderr).

- Fast log, every ``log_every`` steps; with ``log_every`` left at its default, at most
  once per ``min_interval_seconds`` too (1 s; pipeline/settings.py
  ``fast_log_min_interval_seconds``: an explicit
  ``log_every`` is honoured as given; the slow steps explained in full get their line). One
  line with the step time and its phases, then the budget verdict with the figure that
  drives it first (the steady state, ``BudgetVerdict``); recent and total follow where they
  read differently. Why one of them is on the other side of the threshold is said once per
  kind of disagreement, not on every line; before the verdict has evidence enough
  (``BudgetSpanProcessor.evidence_gap``) the line says what it waits for::

      ⏱️  step 120: 0.123s (data[train] 0.010s, forward 0.045s, ..., other 0.002s)
          | monitoring OK: 1.1% steady state (budget 5%); recent 0.8%, total 1.2%

- Full breakdown, only on steps whose monitoring is material: at least
  ``breakdown_min_share`` (5%) of the step, or one of ``eval_operations`` (the operations
  the user marks as evaluation). A 0.3 ms collector every 50 steps gets no breakdown. Each
  top-level phase with its share of the step, the summary line (training, monitoring,
  other/overhead), the budget status, and red flags when a share crosses its threshold
  (``DEFAULT_RED_FLAGS``: inference > 90% of the step: hanging? val_loss > 50%: validation
  set too large? time in no phase > 20%: overhead around the phases)::

      ⏱️  TIMING BREAKDOWN (Step 2,800):
         Total:          8.234s
         inference:      6.123s (74.4%)  [monitor]
         ...
         bound: compute (device busy 7.981s, idle 0.253s)
         monitoring: 92.0% of this step (training 4.2%, other/overhead 3.8%) | ...

- The bound line is the step's ``train.step.bound`` (``derived/device_metrics.py``); a phase
  that ran out of memory gets a line of its own on any step: ``⛔ out of memory in backward
  (step 12): peak 71.2 GiB allocated``.
- Warm-up is marked, not hidden: the first ``warmup_steps`` steps' lines say ``[warm-up]``
  and an operation's first call says ``first call`` (it is left out of the steady-state
  figures that drive the budget status).
- With more than one rank, every line starts with ``[rank N]``.

Usage::

    interval = settings["console_min_interval_seconds"]  # 0 when log_every was set
    console = ConsoleReportSpanProcessor(log_every=10, overhead=overhead, budget=budget,
                                         min_interval_seconds=interval)
    provider.add_span_processor(console)
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import TextIO

from otel_train.common.units import percent_of
from otel_train.common import attributes as A
from otel_train.derived.budget import BudgetSpanProcessor, VerdictContext
from otel_train.derived.device_metrics import bound_line, oom_line
from otel_train.derived.overhead import OverheadSpanProcessor
from otel_train.derived.step_ordered_log import StepOrderedLog
from otel_train.derived.throughput import ThroughputSpanProcessor, rate_text
from otel_train.records.steps_view import (
    P_DURATION,
    P_KIND,
    P_LOADER,
    P_NAME,
    P_PARENT_ID,
    StepView,
    StepViewProcessor,
)

OTHER = "other"  # time of the step in no phase
# Share of a step above which a phase is a red flag: inference above 90% of an eval step
# usually means generation is hanging; a validation pass above 50%, a set too large.
DEFAULT_RED_FLAGS: Mapping[str, float] = {
    A.PHASE_INFERENCE: 0.90,  # model generation is probably hanging (check its timeout)
    A.PHASE_VAL_LOSS: 0.50,   # validation set too large, or inefficient
    OTHER: 0.20,              # time outside any phase: inefficient status/display logic
}
_WHY = {
    A.PHASE_INFERENCE: "generation may be hanging (check its timeout)",
    A.PHASE_VAL_LOSS: "validation set too large or inefficient",
    OTHER: "time outside any phase (status updates, display, untimed work)",
}


class ConsoleReportSpanProcessor(StepViewProcessor):
    """Prints the fast log and the full timing breakdown; reads overhead and budget."""

    view_by_view = True  # the console reads its figures as of each step
    state_fields = ("_next_fast_ns", "_steps_seen", "_seen_operations", "_last_step_ns",
                    "lines_written", "_explained")

    def __init__(
        self,
        log_every: int = 10,
        overhead: OverheadSpanProcessor | None = None,
        budget: BudgetSpanProcessor | None = None,
        stream: TextIO | None = None,
        red_flags: Mapping[str, float] | None = None,
        breakdown_min_share: float = 0.05,
        eval_operations: Iterable[str] = (),
        warmup_steps: int = 5,
        world_size: int = 1,
        min_interval_seconds: float = 1.0,
        ordered_log: StepOrderedLog | None = None,
        throughput: ThroughputSpanProcessor | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(log_every, int) or log_every < 1:
            raise ValueError("log_every must be an integer >= 1")
        if not min_interval_seconds >= 0:
            raise ValueError("console_min_interval_seconds must be >= 0")
        if not 0.0 <= breakdown_min_share <= 1.0:
            raise ValueError("console_breakdown_min_share must be between 0 and 1")
        self.log_every = log_every
        # Measured by the steps' own end times: no clock read, and replays are exact.
        self._min_interval_ns = int(min_interval_seconds * 1e9)
        self._next_fast_ns = 0  # no routine fast line for a step ending before this
        self.breakdown_min_share = breakdown_min_share
        self.eval_operations = frozenset(eval_operations)
        self.warmup_steps = warmup_steps
        self.world_size = world_size
        self._steps_seen = 0
        self._seen_operations: set[str] = set()
        self._first_calls: set[str] = set()  # operations whose first call is in this view
        self._last_step_ns = 0
        self._warmup = False  # the step being formatted is a warm-up step
        self.overhead = overhead
        self.budget = budget
        self._stream = stream
        self.red_flags = dict(DEFAULT_RED_FLAGS if red_flags is None else red_flags)
        self.lines_written = 0
        self._explained: set[tuple[str, tuple[str, ...]]] = set()  # disagreements explained
        # The slow-step and budget warnings, released once this step's lines are written.
        self._ordered_log = ordered_log
        self.throughput = throughput  # the rate on the fast line ('' without it)

    def on_step(self, view: StepView) -> None:
        """Full breakdown when monitoring is material; a fast line every ``log_every`` steps."""
        self._warmup = self._steps_seen < self.warmup_steps
        self._steps_seen += 1
        self._last_step_ns = view.duration_ns
        self._note_first_calls(view)
        oom = oom_line(view)
        if oom is not None:
            self._write(oom, view)
        if view.operations and self.is_material(view):
            self._write(self.format_breakdown(view), view)
        elif view.slow_explained or (view.step % self.log_every == 0
                                     and view.end_ns >= self._next_fast_ns):
            # Formatting a line costs ~40 us of the GIL the training thread needs: a fast
            # loop gets one routine line per interval, not one per log_every steps.
            self._next_fast_ns = view.end_ns + self._min_interval_ns
            self._write(self.format_fast(view), view)
        if self._ordered_log is not None:
            self._ordered_log.release(view.step)

    def on_operation(self, view: StepView) -> None:
        """Monitoring between steps: one line with its cost, when material."""
        self._warmup = False
        self._note_first_calls(view)
        if (view.name in self.eval_operations or self._first_calls
                or view.duration_ns >= self.breakdown_min_share * self._last_step_ns):
            first = " (first call)" if self._first_calls else ""
            # Two loaders validated one after the other are two lines: each names its own.
            loader = f" (loader {view.loader!r})" if view.loader else ""
            self._write(f"⏱️  monitor {view.name!r}{loader} after step {view.step}: "
                        f"{view.duration_ns / 1e9:.3f}s{first}{self._overhead_suffix()}", view)
        if self._ordered_log is not None:
            self._ordered_log.release(view.step)

    def shutdown(self) -> None:
        """Warnings still held (none normally: each step releases its own) are logged."""
        if self._ordered_log is not None:
            self._ordered_log.release()

    def is_material(self, view: StepView) -> bool:
        """Monitoring worth a full breakdown: a big enough share, or an eval operation."""
        if view.monitor_ns > 0 and view.monitor_ns >= self.breakdown_min_share * view.duration_ns:
            return True
        evals = self.eval_operations
        for name, _ in view.operations:  # a loop, not any(): no generator made per step
            if name in evals:
                return True
        return False

    def _note_first_calls(self, view: StepView) -> None:
        first = self._first_calls
        first.clear()
        seen = self._seen_operations
        for name, _ in view.operations:
            if name not in seen:
                seen.add(name)
                first.add(name)

    # -- formatting ---------------------------------------------------------------------
    def format_fast(self, view: StepView) -> str:
        """The one-line fast log."""
        parts = [f"{label} {dur / 1e9:.3f}s" for label, _, dur in _phase_rows(view)]
        other = _other_ns(view)
        parts.append(f"{OTHER} {other / 1e9:.3f}s")
        slow = "  🚩 slow step" if view.slow else ""
        warm = " [warm-up]" if self._warmup else ""
        rate = rate_text(self.throughput.snapshot()) if self.throughput is not None else ""
        return (f"⏱️  step {view.step}{warm}: {view.duration_ns / 1e9:.3f}s "
                f"({', '.join(parts)}){rate}{self._overhead_suffix()}{slow}")

    def format_breakdown(self, view: StepView) -> str:
        """The full timing breakdown with percentages and red flags."""
        total = view.duration_ns
        rows = _phase_rows(view)
        other = _other_ns(view)
        width = max([len(label) for label, _, _ in rows] + [len(OTHER), 6]) + 1
        warm = " [warm-up]" if self._warmup else ""
        lines = [f"⏱️  TIMING BREAKDOWN (Step {view.step:,}){warm}:",
                 f"   {'Total:':<{width}}  {total / 1e9:9.3f}s"]
        for label, kind, dur in rows:
            tag = ""
            if kind == A.KIND_MONITOR:
                tag = ("  [monitor, first call: warm-up]"
                       if label in self._first_calls else "  [monitor]")
            lines.append(f"   {label + ':':<{width}}  {dur / 1e9:9.3f}s ({_pct(dur, total)}){tag}")
        lines.append(f"   {OTHER + ':':<{width}}  {other / 1e9:9.3f}s ({_pct(other, total)})")
        loaders = _nested_data_by_loader(view)
        for loader, dur in loaders.items():
            lines.append(f"   (data[{loader}] inside monitoring: {dur / 1e9:.3f}s)")
        bound = bound_line(view)
        if bound is not None:
            lines.append(bound)
        train = max(0, total - view.monitor_ns - other)
        lines.append(f"   monitoring: {_pct(view.monitor_ns, total)} of this step (training "
                     f"{_pct(train, total)}, other/overhead {_pct(other, total)})"
                     f"{self._overhead_suffix()}")
        if self._first_calls:
            # Until an operation runs again its one call is all the steady state knows of
            # it (overhead.py): left out from its second call on.
            lines.append(f"   first call of {', '.join(sorted(self._first_calls))}: in the "
                         "total; left out of the steady state (budget status, advisor) once "
                         "it has run again")
        for flag in self.red_flags_of(view):
            lines.append(f"   🚩 {flag}")
        return "\n".join(lines)

    def red_flags_of(self, view: StepView) -> list[str]:
        """Red flags: shares over their threshold, slow step, budget breached."""
        total = view.duration_ns
        flags: list[str] = []
        if total <= 0:
            return flags
        shares: dict[str, int] = {}
        for ph in view.top_level_phases():
            shares[ph[P_NAME]] = shares.get(ph[P_NAME], 0) + ph[P_DURATION]
        shares[OTHER] = _other_ns(view)
        operations = dict(view.operations)
        for name, limit in self.red_flags.items():
            share = shares.get(name, 0) / total
            if share > limit:
                why = _WHY.get(name, "over its threshold")
                flag = f"{name} {share:.1%} of this step (> {limit:.0%}): {why}"
                if name in operations and self.overhead is not None:
                    # A share of this one step, not of the run: the verdict's figure is a
                    # share of training time. Both are said, so they do not read as a
                    # contradiction.
                    cost = self.overhead.snapshot().operations.get(name)
                    if cost is not None:
                        flag += (f"; over the run so far {name} is {cost.share:.1%} of "
                                 "training time, the measure the monitoring verdict uses")
                flags.append(flag)
        if view.slow:
            flags.append("slow step (training time far above its baseline)")
        if self.budget is not None and self.budget.judging:
            verdict = self.budget.verdict()
            if verdict.status != "ok":
                held = " (held until it falls back)" if verdict.held else ""
                flags.append(f"monitoring budget {verdict.status}{held}: {verdict.steady:.1%} "
                             f"{verdict.label} share of training time (budget "
                             f"{self.budget.budget:.0%}, critical {self.budget.critical:.0%})")
        return flags

    # -- internals ----------------------------------------------------------------------
    def _overhead_suffix(self) -> str:
        """The budget verdict, its driving figure first (``BudgetVerdict.describe``)."""
        overhead = self.overhead
        if overhead is None:
            return ""
        if self.budget is not None:
            gap = self.budget.evidence_gap()
            if gap is not None:
                return f" | monitoring verdict: {gap}"
            verdict = self.budget.verdict()
        else:  # no budget to judge by: the figures alone
            recent, cumulative = overhead.ratios()
            return (f" | monitoring {overhead.steady_ratio():.1%} steady state; recent "
                    f"{recent:.1%}, total {cumulative:.1%}")
        # Why a figure disagrees with the verdict is said once per kind of disagreement
        # (which figures, which status), not on every line; the reasons need the whole
        # snapshot, taken only then.
        wrong = verdict.disagreeing()
        key = (verdict.status, tuple(wrong)) if wrong else None
        explain = key is not None and key not in self._explained
        if explain:
            self._explained.add(key)
        context = VerdictContext.of_snapshot(overhead.snapshot()) if explain else None
        return " | monitoring " + verdict.describe(context=context, all_figures=False,
                                                   explain=explain)

    def _write(self, text: str, view: StepView | None = None) -> None:
        if self.world_size > 1 and view is not None:
            prefix = f"[rank {view.rank}] "
            text = "\n".join(prefix + line for line in text.split("\n"))
        stream = self._stream if self._stream is not None else sys.stderr
        try:
            # One write with its newline: print() writes the newline apart, and another
            # thread's print (the script's own) could land between the two.
            stream.write(text + "\n")
            stream.flush()
            self.lines_written += 1
        except Exception:  # a closed stream must not break the pipeline
            pass


def _phase_rows(view: StepView) -> list[tuple[str, str, int]]:
    """Top-level phases summed by (label, kind) in first-seen order; data carries its loader."""
    acc: dict[tuple[str, str], int] = {}
    for ph in view.top_level_phases():
        name = ph[P_NAME]
        label = f"{name}[{ph[P_LOADER]}]" if name == A.PHASE_DATA and ph[P_LOADER] else name
        key = (label, ph[P_KIND])
        acc[key] = acc.get(key, 0) + ph[P_DURATION]
    return [(label, kind, dur) for (label, kind), dur in acc.items()]


def _other_ns(view: StepView) -> int:
    return max(0, view.duration_ns - sum(ph[P_DURATION] for ph in view.top_level_phases()))


def _nested_data_by_loader(view: StepView) -> dict[str, int]:
    """Validation loaders: data phases inside monitoring (not top-level), by loader."""
    root = view.root_span_id
    out: dict[str, int] = {}
    for ph in view.phases:
        if ph[P_NAME] == A.PHASE_DATA and ph[P_KIND] == A.KIND_MONITOR and ph[P_PARENT_ID] != root:
            loader = ph[P_LOADER] or "?"
            out[loader] = out.get(loader, 0) + ph[P_DURATION]
    return out


_pct = percent_of
