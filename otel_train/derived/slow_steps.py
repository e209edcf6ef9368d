"""Slow steps: training time far above a robust baseline, counted, marked and explained.

A step is judged on its *training* time: its duration minus the monitoring phases in it (and,
with ``device_sync="monitor_sync"``, minus the device backlog their start drained:
``queued_wait_ns``).
Monitoring that makes a step long (an eval every 50 steps, a 180 s snapshot) is reported as
monitoring (per operation, the budget, the operation-too-long warning), never as a slow step.

The baseline is robust and per loader: for each ``train.dataloader`` (steps of an RL rollout
and of a supervised batch are not compared with each other) the rolling median of the last
``window_steps`` training times, and their spread as the median absolute deviation (MAD).
A step is slow when its training time is over ``slow_step_factor`` (2.5) x the median *and*
over the median + ``mad_multiplier`` (6) x the MAD's standard-deviation equivalent, so a
loop whose steps vary a lot by nature does not cry wolf, *and* at least
``MIN_SLOW_STEP_EXCESS_SECONDS`` (1 ms) over the median: a ratio to a baseline of a few
microseconds (an empty loop body) is scheduler jitter, not a step anyone can make faster, so
a step shorter than 1 ms is never slow on ratio alone. The first ``warmup_steps`` steps of
the run (compilation, caches) are neither judged nor put in the baseline, and no step is
judged before ``min_history`` steps of its loader are known. ``slow_step_seconds`` (off by
default) flags any training time above it, after warm-up.

A slow step is counted (``otel_train_slow_steps_total``), its root span gets ``train.slow =
True`` (exporters run after us and see it), and a warning prints its phase breakdown, as
hand-timed loops print it ("Generation: 45.2s, Test gen: 12.1s, ..."). The console reads in
a calm rhythm: the first ``max_explanations`` (3) slow steps of the run are explained with
their breakdown, so the second one of a burst is explained too; after them, the slow steps
are summed up, one line once ``explain_window_steps`` (100) steps and
``SUMMARY_MIN_INTERVAL_SECONDS`` (30 s, by the steps' end times) have passed since the last
slow-step line, and one at shutdown for the rest. A lone slow step, as long after the one
before it, with none waiting to be summed up, is explained in full again::

    otel-train: 12 more slow steps since step 140 (the worst: step 188, 0.012 s of
      training, 4.1x the median 0.003 s)                            (one line)

The first summary says once where the rest is (the counter, the report). With the
console off (``explain=False``) the library stays quiet: the first slow step gets one line,
then one line per ``QUIET_SUMMARY_INTERVAL_SECONDS`` of steps at most, and one at shutdown
("N slow steps (the slowest: step K, X s), see otel_train_slow_steps_total ...")::

    otel-train: slow step 1234: training 9.850 s (3.1x the median 3.200 s of loader 'train');
      step 9.900 s                                                  (one line)
      forward       8.100 s  81.8%
      backward      1.700 s  17.2%
      inference     0.050 s   0.5%  [monitor]
      other         0.050 s   0.5%  (not in any phase)

Usage::

    slow = SlowStepSpanProcessor(factor=2.5, absolute_seconds=None, window_steps=100)
    provider.add_span_processor(slow)
    slow.slow_steps, slow.median_seconds()
"""

from __future__ import annotations

from functools import partial
import logging
from bisect import bisect_left, insort
from operator import itemgetter
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from otel_train.common.units import SLOW_STEP, duration, percent_of
from otel_train.common import attributes as A
from otel_train.common.sdk_private import SPAN_ATTRIBUTES_FIELD, span_attributes
from otel_train.derived.step_ordered_log import StepOrderedLog
from otel_train.records.span_rows import P_EXTRA
from otel_train.records.steps_view import (
    P_DURATION,
    P_KIND,
    P_NAME,
    StepView,
    StepViewProcessor,
    set_span_attribute,
)

_log = logging.getLogger("otel_train")
_MONITOR, _QUEUED_WAIT, _FLOPS_COUNTED = A.KIND_MONITOR, A.DEVICE_QUEUED_WAIT, A.FLOPS_COUNTED
_NO_ATTRIBUTES: dict[str, Any] = {}
_extra_of = itemgetter(P_EXTRA)  # a record phase's extra attributes (or None)
_MAD_TO_SIGMA = 1.4826  # MAD x this = the standard deviation, for normally spread data
# A slow step costs at least this much more than its loader's median: below it, a ratio
# measures scheduler and timer jitter on near-empty steps, nothing a user can act on.
MIN_SLOW_STEP_EXCESS_SECONDS = 0.001
# With the console off: at most one slow-step summary line per this many seconds of steps
# (by the steps' end times, so replays give the same lines), and one at shutdown.
QUIET_SUMMARY_INTERVAL_SECONDS = 900.0
# With the console on, after the first explanations: a summary line at most once per this
# many seconds of steps (and ``explain_window_steps`` steps), and one at shutdown.
SUMMARY_MIN_INTERVAL_SECONDS = 30.0


class _Baseline:
    """Rolling training times of one loader: a window and the same values sorted."""

    __slots__ = ("ordered", "window", "_sigma", "_sigma_age")

    def __init__(self) -> None:
        self.window: deque[int] = deque()
        self.ordered: list[int] = []
        self._sigma = 0.0
        self._sigma_age = -1  # adds since the spread was computed; -1: never

    def add(self, value: int, size: int) -> None:
        """Add one training time, dropping the oldest beyond ``size``."""
        if len(self.window) >= size:
            del self.ordered[bisect_left(self.ordered, self.window.popleft())]
        self.window.append(value)
        insort(self.ordered, value)
        if self._sigma_age >= 0:
            self._sigma_age += 1

    def median(self) -> float:
        """Median of the window (non-empty)."""
        return _median(self.ordered)

    def sigma(self, median: float) -> float:
        """Robust spread: MAD x 1.4826, for a candidate slow step.

        O(n), so kept for up to 8 adds: a loop whose steps keep crossing the factor test
        (bimodal step times) would otherwise pay it on every step.
        """
        if self._sigma_age < 0 or self._sigma_age >= 8:
            self._sigma = _MAD_TO_SIGMA * _median(sorted(abs(v - median)
                                                         for v in self.ordered))
            self._sigma_age = 0
        return self._sigma


def _median(ordered: list[Any]) -> float:
    n = len(ordered)
    mid = n // 2
    return float(ordered[mid]) if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


class SlowStepSpanProcessor(StepViewProcessor):
    """Flags steps whose training time is far above their loader's robust baseline."""

    state_fields = ("steps_seen", "slow_steps", "unexplained", "_pending", "last_slow",
                    "_explained", "slowest", "_slow_steps_said", "_next_summary_ns",
                    "_next_summary_ordinal", "_summaries", "_last_slow")

    def __init__(
        self,
        factor: float = 2.5,
        absolute_seconds: float | None = None,
        window_steps: int = 100,
        min_history: int = 5,
        warmup_steps: int = 5,
        mad_multiplier: float = 6.0,
        max_explanations: int = 3,
        explain_window_steps: int = 100,
        logger: logging.Logger | StepOrderedLog | None = None,
        world_size: int = 1,
        min_excess_seconds: float = MIN_SLOW_STEP_EXCESS_SECONDS,
        explain: bool = True,
    ) -> None:
        super().__init__()
        if not factor > 1.0:
            raise ValueError("slow_step_factor must be > 1")
        if absolute_seconds is not None and not absolute_seconds > 0:
            raise ValueError("slow_step_seconds must be > 0 or None")
        if window_steps < 1:
            raise ValueError("window_steps must be >= 1")
        if warmup_steps < 0:
            raise ValueError("warmup_steps must be >= 0")
        if max_explanations < 0 or explain_window_steps < 1:
            raise ValueError("max_explanations must be >= 0 and explain_window_steps >= 1")
        if not min_excess_seconds >= 0:
            raise ValueError("min_excess_seconds must be >= 0")
        self.factor = factor
        self._absolute_ns = None if absolute_seconds is None else int(absolute_seconds * 1e9)
        self._min_excess_ns = int(min_excess_seconds * 1e9)
        self._min_history = max(1, min_history)
        self._window_steps = window_steps
        self.warmup_steps = warmup_steps
        self.mad_multiplier = mad_multiplier
        self._baselines: dict[Any, _Baseline] = {}
        self._max_explanations = max_explanations
        self._explain_window = explain_window_steps
        self._explained = 0  # slow steps explained with their breakdown
        self._log = logger or _log
        # A StepOrderedLog (the console is on) is told which step each warning is about.
        self._log_at = getattr(self._log, "at", None)
        self.world_size = world_size
        self.explain = explain  # False (console off): summary lines only
        self.steps_seen = 0
        self.slow_steps = 0
        self.unexplained = 0  # slow steps over the explanation limit (counted, summed up)
        # Slow steps not yet in a line: [count, first step, worst step, worst ratio, its
        # median ns, worst training ns] (count 0: none).
        self._pending: list[Any] = [0, None, None, 0.0, 0.0, 0]
        self._next_summary_ordinal = 0  # no summary before this step ordinal ...
        self._summaries = 0  # summary lines said
        self._last_slow = [0, 0]  # the last slow step: [ordinal, end ns]
        self.last_slow: str | None = None  # the last breakdown text (for tests and reports)
        # The run's slowest slow step: [step, rank, training ns, median ns or 0].
        self.slowest: list[Any] | None = None
        self._slow_steps_said = 0  # slow steps covered by a quiet line so far
        self._next_summary_ns = 0  # no quiet summary for a step ending before this

    def on_step(self, view: StepView) -> None:
        """Judge the step's training time against its loader's baseline, then add it."""
        ordinal = self.steps_seen
        self.steps_seen += 1
        if ordinal < self.warmup_steps:
            return  # warm-up: not judged, and kept out of the baseline
        if (span_attributes(view.span) or _NO_ATTRIBUTES).get(_FLOPS_COUNTED):
            return  # run under FlopCounterMode (count_flops): slowed by the counting itself
        train = max(0, view.duration_ns - view.monitor_ns - queued_wait_ns(view))
        base = self._baselines.get(view.loader)
        if base is None:
            base = self._baselines[view.loader] = _Baseline()
        median: float | None = None
        slow = self._absolute_ns is not None and train > self._absolute_ns
        if len(base.ordered) >= self._min_history:
            median = base.median()
            # cheap tests first; the spread only if needed
            if train > self.factor * median and train - median >= self._min_excess_ns:
                slow = slow or train > median + self.mad_multiplier * base.sigma(median)
        base.add(train, self._window_steps)
        if slow:
            self._flag(view, train, median, ordinal)
        elif (self._pending[0] and ordinal >= self._next_summary_ordinal
              and view.end_ns >= self._next_summary_ns):
            # Slow steps wait to be summed up and their interval is over: said now, so a
            # lone slow step later is explained in full again.
            if self._log_at is not None:
                self._log_at(view.step)
            self._said_at(view, ordinal)
            self._say_summary()

    def on_steps(self, views: Sequence[StepView],
                 failed: Callable[[StepViewProcessor, StepView, Exception], None]) -> None:
        """A frame of steps: ``on_step`` on each, the usual step's judgement inline (past
        the warm-up, no FLOP counting, its loader's baseline, no slow-step line due): the
        median read and the baseline's window moved here, the settings read once a frame."""
        on_step = self.on_step
        baselines, window = self._baselines, self._window_steps
        warmup, min_history = self.warmup_steps, self._min_history
        factor, min_excess, mad = self.factor, self._min_excess_ns, self.mad_multiplier
        for view in views:
            try:
                ordinal = self.steps_seen
                base = baselines.get(view.loader)
                if (ordinal < warmup or base is None or self._pending[0]
                        or self._absolute_ns is not None):
                    on_step(view)  # the rarer paths, as they are
                    continue
                self.steps_seen = ordinal + 1
                attrs = getattr(view.span, SPAN_ATTRIBUTES_FIELD, None)  # span_attributes, inline
                if attrs and attrs.get(_FLOPS_COUNTED):
                    continue  # run under FlopCounterMode: slowed by the counting itself
                train = view.duration_ns - view.monitor_ns
                if view.monitor_ns:
                    try:  # a C-level pass over the extras: none (the usual step), no wait
                        waited = any(map(_extra_of, view.phases))
                    except IndexError:
                        waited = True
                    if waited:
                        train -= queued_wait_ns(view)
                if train < 0:
                    train = 0
                ordered = base.ordered
                n = len(ordered)
                if n >= min_history:
                    mid = n // 2  # _median(ordered), inline
                    median = (float(ordered[mid]) if n % 2
                              else (ordered[mid - 1] + ordered[mid]) / 2.0)
                    if (train > factor * median and train - median >= min_excess
                            and train > median + mad * base.sigma(median)):
                        base.add(train, window)
                        self._flag(view, train, median, ordinal)
                        continue
                recent = base.window  # base.add(train, window), inline
                if len(recent) >= window:
                    del ordered[bisect_left(ordered, recent.popleft())]
                recent.append(train)
                insort(ordered, train)
                if base._sigma_age >= 0:
                    base._sigma_age += 1
            except Exception as exc:
                failed(self, view, exc)

    def _flag(self, view: StepView, train_ns: int, median: float | None, ordinal: int) -> None:
        self.slow_steps += 1
        view.slow = True
        set_span_attribute(view.span, A.SLOW, True)
        if self.slowest is None or train_ns > self.slowest[2]:
            self.slowest = [view.step, view.rank, train_ns, median or 0.0]
        if self._log_at is not None:
            self._log_at(view.step)
        if self.explain:
            self._explain(view, train_ns, median, ordinal)
        else:
            self._say_quietly(view, train_ns, median)

    def _explain(self, view: StepView, train_ns: int, median: float | None,
                 ordinal: int) -> None:
        due = ordinal >= self._next_summary_ordinal and view.end_ns >= self._next_summary_ns
        last_ordinal, last_end_ns = self._last_slow
        self._last_slow = [ordinal, view.end_ns]
        lone = (not self._pending[0] and ordinal - last_ordinal >= self._explain_window
                and view.end_ns - last_end_ns >= SUMMARY_MIN_INTERVAL_SECONDS * 1e9)
        # The first few, and a lone one after a quiet spell, are explained in full.
        if self._explained < self._max_explanations or lone:
            self._explained += 1
            view.slow_explained = True  # the console prints this step's line too
            text = format_slow_step(view, median, train_ns,
                                    rank=view.rank if self.world_size > 1 else None)
            self._said_at(view, ordinal)
            self.last_slow = text
            self._log.warning("%s", text)  # logging reports a failing handler itself
            return
        self.unexplained += 1
        pending = self._pending
        ratio = train_ns / median if median else 0.0
        if pending[0] == 0:
            pending[1] = view.step
        pending[0] += 1
        if pending[2] is None or train_ns > pending[5]:
            pending[2:6] = [view.step, ratio, median or 0.0, train_ns]
        if due:
            self._said_at(view, ordinal)
            self._say_summary()

    def _said_at(self, view: StepView, ordinal: int) -> None:
        """A slow-step line was said at this step: the next summary waits its interval."""
        self._next_summary_ordinal = ordinal + self._explain_window
        self._next_summary_ns = view.end_ns + int(SUMMARY_MIN_INTERVAL_SECONDS * 1e9)

    def _say_summary(self) -> None:
        count, first, worst, ratio, median_ns, train_ns = self._pending
        if not count:
            return
        self._pending = [0, None, None, 0.0, 0.0, 0]
        figures = f"{_seconds(train_ns / 1e9)} of training"
        if median_ns:
            figures += f", {_times(ratio)} the median {_seconds(median_ns / 1e9)}"
        if count == 1:
            text = f"otel-train: 1 more slow step: step {worst} ({figures})"
        else:
            text = (f"otel-train: {count} more slow steps since step {first} (the worst: "
                    f"step {worst}, {figures})")
        if self._summaries == 0:
            # Said once: why these are no longer explained one by one, and where they are.
            text += (f"; after the first {self._max_explanations}, slow steps are summed up "
                     f"like this: each is counted in {A.METRIC_SLOW_STEPS}, and "
                     "`otel-train report` shows their phases")
        self._summaries += 1
        self.last_slow = text
        self._log.warning("%s", text)

    def _say_quietly(self, view: StepView, train_ns: int, median: float | None) -> None:
        """Console off: the first slow step in one line, then a summary per interval."""
        if view.end_ns < self._next_summary_ns:
            return
        self._next_summary_ns = view.end_ns + int(QUIET_SUMMARY_INTERVAL_SECONDS * 1e9)
        if self._slow_steps_said == 0:
            text = (format_slow_step(view, median, train_ns, rank=self._rank_of(view.rank),
                                     breakdown=False)
                    + "; the console is off: further slow steps are counted "
                    f"({A.METRIC_SLOW_STEPS}) and summed up")
        else:
            text = self.summary()
        self._slow_steps_said = self.slow_steps
        self.last_slow = text
        self._log.warning("%s", text)

    def summary(self) -> str:
        """One line: how many slow steps, the slowest, and where to look."""
        step, rank, train_ns, median_ns = self.slowest or (None, None, 0, 0.0)
        who = f" (rank {rank})" if self._rank_of(rank) is not None else ""
        times = f"{_seconds(train_ns / 1e9)} of training"
        if median_ns:
            times += f", {_times(train_ns / median_ns)} the median {_seconds(median_ns / 1e9)}"
        return (f"otel-train: {self.slow_steps} slow step(s) so far (the slowest: step "
                f"{step}{who}, {times}); see {A.METRIC_SLOW_STEPS}, or `otel-train report` "
                "for their phases")

    def shutdown(self) -> None:
        """The run's slow steps not yet said, in one line."""
        with self._lock:
            if self.explain:
                if self._log_at is not None:
                    self._log_at(None)
                self._say_summary()
                return
            if self.slow_steps <= self._slow_steps_said:
                return
            self._slow_steps_said = self.slow_steps
            self.last_slow = self.summary()
        self._log.warning("%s", self.last_slow)

    def _rank_of(self, rank: Any) -> Any:
        return rank if self.world_size > 1 else None

    def export_state(self) -> dict[str, Any]:
        """The running figures, the loaders' baselines included (plain data)."""
        state = super().export_state()
        state["_baselines"] = {loader: (list(b.window), list(b.ordered), b._sigma,
                                        b._sigma_age)
                               for loader, b in self._baselines.items()}
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from ``export_state``'s figures."""
        super().load_state(state)
        baselines = {}
        for loader, (window, ordered, sigma, age) in state.get("_baselines", {}).items():
            b = baselines[loader] = _Baseline()
            b.window.extend(window)
            b.ordered = list(ordered)
            b._sigma, b._sigma_age = sigma, age
        self._baselines = baselines

    def median_seconds(self) -> float | None:
        """The largest per-loader median training time, or None before ``min_history`` steps."""
        with self._lock:
            medians = [b.median() for b in self._baselines.values()
                       if len(b.ordered) >= self._min_history]
        return max(medians) / 1e9 if medians else None


def format_slow_step(view: StepView, median_ns: float | None, train_ns: int | None = None,
                     rank: Any = None, breakdown: bool = True) -> str:
    """The slow-step warning: training time, ratio to the median, and the phase breakdown."""
    total = view.duration_ns
    train = total - view.monitor_ns if train_ns is None else train_ns
    who = f" (rank {rank})" if rank is not None else ""
    head = f"otel-train: slow step {view.step}{who}: training {_seconds(train / 1e9)}"
    if median_ns:
        loader = f" of loader {view.loader!r}" if view.loader else ""
        head += f" ({_times(train / median_ns)} the median {_seconds(median_ns / 1e9)}{loader})"
    head += f"; step {_seconds(total / 1e9)}"
    if not breakdown:
        return head
    lines = [head]
    by_name: dict[tuple[str, str], int] = {}
    for ph in view.top_level_phases():
        key = (ph[P_NAME], ph[P_KIND])
        by_name[key] = by_name.get(key, 0) + ph[P_DURATION]
    accounted = sum(by_name.values())
    rows = sorted(by_name.items(), key=lambda kv: -kv[1])
    width = max([len(name) for (name, _), _ in rows] + [5])
    for (name, kind), dur in rows:
        tag = "  [monitor]" if kind == A.KIND_MONITOR else ""
        lines.append(f"  {name:<{width}}  {dur / 1e9:9.3f} s  {_pct(dur, total)}{tag}")
    other = max(0, total - accounted)
    lines.append(f"  {'other':<{width}}  {other / 1e9:9.3f} s  {_pct(other, total)}"
                 "  (not in any phase)")
    return "\n".join(lines)


_pct = partial(percent_of, spec="5.1f", missing="    -")
_seconds = partial(duration, style=SLOW_STEP)


def _times(ratio: float) -> str:
    """A ratio to the median: one decimal where it tells something."""
    return f"{ratio:.1f}x" if ratio < 100 else f"{ratio:.0f}x"


def queued_wait_ns(view: Any) -> int:
    """With ``device_sync="monitor_sync"``: what the synchronizes at the start of the step's
    monitoring phases waited for (``train.device.queued_wait_seconds``). That is the device
    backlog the steps before left while their host ran ahead, drained here because
    monitoring starts: not this step's slowness."""
    if not view.monitor_ns:
        return 0
    total = 0.0
    for ph in view.phases:
        if ph[P_KIND] == _MONITOR and len(ph) > P_EXTRA:
            extra = ph[P_EXTRA]
            if extra:
                total += extra.get(_QUEUED_WAIT) or 0.0
    return int(total * 1e9)
