"""Slow steps: far above the rolling median step time, counted, marked and explained.

A step is slow when its duration exceeds ``slow_step_factor`` (3) x the median of the
previous ``window_steps`` steps (once ``min_history`` steps are known), or the absolute
``slow_step_seconds`` when set. A slow step is counted (``otel_train_slow_steps_total``),
its root span gets ``train.slow = True`` (exporters run after us and see it), and a
rate-limited warning prints its phase breakdown, as the field notes did by hand::

    otel-train: slow step 1234: 65.3 s (8.2x the median 8.0 s)
      inference     45.200 s  69.2%  [monitor]
      forward       12.100 s  18.5%
      other          0.100 s   0.2%  (not in any phase)

Usage::

    slow = SlowStepSpanProcessor(factor=3.0, absolute_seconds=None, window_steps=100)
    provider.add_span_processor(slow)
    slow.slow_steps, slow.median_seconds()
"""

from __future__ import annotations

import logging
from bisect import bisect_left, insort
from collections import deque

from otel_train import attributes as A
from otel_train.rate_limited_log import RateLimitedLogger
from otel_train.steps_view import (
    P_DURATION,
    P_KIND,
    P_NAME,
    StepView,
    StepViewProcessor,
    set_span_attribute,
)

_log = logging.getLogger("otel_train")


class SlowStepSpanProcessor(StepViewProcessor):
    """Flags steps slower than factor x rolling median (or an absolute limit)."""

    def __init__(
        self,
        factor: float = 3.0,
        absolute_seconds: float | None = None,
        window_steps: int = 100,
        min_history: int = 5,
        log_interval_seconds: float = 30.0,
        logger: logging.Logger | None = None,
    ) -> None:
        super().__init__()
        if not factor > 1.0:
            raise ValueError("slow_step_factor must be > 1")
        if absolute_seconds is not None and not absolute_seconds > 0:
            raise ValueError("slow_step_seconds must be > 0 or None")
        if window_steps < 1:
            raise ValueError("window_steps must be >= 1")
        self.factor = factor
        self._absolute_ns = None if absolute_seconds is None else int(absolute_seconds * 1e9)
        self._min_history = max(1, min_history)
        self._window: deque[int] = deque()
        self._sorted: list[int] = []  # the window, sorted: the median is one index away
        self._window_steps = window_steps
        self._warn = RateLimitedLogger(logger or _log, log_interval_seconds)
        self.slow_steps = 0
        self.last_slow: str | None = None  # the last breakdown text (for tests and reports)

    def on_step(self, view: StepView) -> None:
        """Judge the step against the median of the steps before it, then add it."""
        d = view.duration_ns
        median = self._median_ns()
        slow = (self._absolute_ns is not None and d > self._absolute_ns) or (
            median is not None and d > self.factor * median)
        # the window, inline (this runs on every step)
        window, ordered = self._window, self._sorted
        if len(window) >= self._window_steps:
            del ordered[bisect_left(ordered, window.popleft())]
        window.append(d)
        insort(ordered, d)
        if slow:
            self.slow_steps += 1
            view.slow = True
            set_span_attribute(view.span, A.SLOW, True)
            text = format_slow_step(view, median)
            self.last_slow = text
            self._warn.warning("slow-step", "%s", text)

    def _median_ns(self) -> float | None:
        ordered = self._sorted
        n = len(ordered)
        if n < self._min_history:
            return None
        mid = n // 2
        return float(ordered[mid]) if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0

    def median_seconds(self) -> float | None:
        """The rolling median step time, or None before ``min_history`` steps."""
        with self._lock:
            m = self._median_ns()
        return None if m is None else m / 1e9


def format_slow_step(view: StepView, median_ns: float | None) -> str:
    """The slow-step warning: duration, ratio to the median, and the phase breakdown."""
    total = view.duration_ns
    head = f"otel-train: slow step {view.step}: {total / 1e9:.3f} s"
    if median_ns:
        head += f" ({total / median_ns:.1f}x the median {median_ns / 1e9:.3f} s)"
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


def _pct(part: int, total: int) -> str:
    return f"{100.0 * part / total:5.1f}%" if total else "    -"
