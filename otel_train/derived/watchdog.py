"""Stall watchdog: how long the current step has run, and a warning when it is stuck.

A span only ends when its work ends, so a stuck step produces no span to look at. The
watchdog reads the recorder's in-progress step (a thread-safe read of the hot path's state)
instead: ``progress()`` gives ``otel_train_step_in_progress_seconds`` and
``otel_train_last_step_timestamp_seconds`` at every scrape, and a thread checks every
``interval_seconds`` whether the step is stalled, warning with the phase that is running::

    otel-train: step 1234 looks stalled: running for 612.0 s, in phase 'inference' for 600.2 s (a step usually takes 3.5 s)

The same thread names a monitoring operation (a monitoring phase, or ``run.monitor`` between
steps) once it has run longer than ``slow_operation_seconds``, while it still runs::

    otel-train: monitoring operation 'val_loss' at step 12 has been running for 31.0 s (over slow_operation_seconds=30); training waits for it

Stall threshold: ``stall_seconds`` when set; otherwise ``stall_factor`` (10) x the typical
step time, at least ``stall_min_seconds`` (300), and 3 x that before any step completed
(first steps compile and warm up). The warning repeats only when the stall doubles.

Usage::

    dog = StallWatchdog(recorder, interval_seconds=1.0, typical_step_seconds=slow.median_seconds)
    dog.start()
    dog.progress()     # (in-progress seconds, last step end as unix seconds)
    dog.stop(1.0)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from time import perf_counter_ns, time_ns

from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.recording.recorder import Recorder

_log = logging.getLogger("otel_train")


class StallWatchdog:
    """Watches the recorder's step in progress from its own daemon thread."""

    def __init__(
        self,
        recorder: Recorder,
        interval_seconds: float = 1.0,
        stall_seconds: float | None = None,
        stall_min_seconds: float = 300.0,
        stall_factor: float = 10.0,
        typical_step_seconds: Callable[[], float | None] | None = None,
        clock_ns: Callable[[], int] = perf_counter_ns,
        logger: logging.Logger | None = None,
        slow_operation_seconds: float | None = None,
    ) -> None:
        if not interval_seconds > 0:
            raise ValueError("watchdog_interval_seconds must be > 0")
        if stall_seconds is not None and not stall_seconds > 0:
            raise ValueError("stall_seconds must be > 0 or None")
        self._recorder = recorder
        self._interval = interval_seconds
        self._stall_s = stall_seconds
        self._min_s = stall_min_seconds
        self._factor = stall_factor
        self._typical = typical_step_seconds
        self._clock = clock_ns
        # perf counter -> unix time; the recorder stamps steps with perf_counter_ns
        self._offset_ns = time_ns() - perf_counter_ns()
        self._log = logger or _log
        self._warn = RateLimitedLogger(self._log, 60.0)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned_step: int | None = None
        self._warned_at_s = 0.0
        self.stalls_warned = 0
        self.last_warning: str | None = None
        self._slow_op_s = slow_operation_seconds
        self._warned_op: tuple[int, str, int] | None = None
        self.slow_operations_warned = 0

    # -- reading (any thread) -----------------------------------------------------------
    def progress(self) -> tuple[float, float]:
        """(seconds the current step has run or 0, unix seconds the last step ended or 0)."""
        rec = self._recorder
        cur = rec.in_progress()
        in_progress = 0.0
        if cur is not None:
            in_progress = max(0.0, (self._clock() - cur[1]) / 1e9)
        last = rec.last_step_end_ns
        return in_progress, ((last + self._offset_ns) / 1e9 if last else 0.0)

    def threshold_seconds(self) -> float:
        """The in-progress time above which the step counts as stalled."""
        if self._stall_s is not None:
            return self._stall_s
        typical = self._typical() if self._typical is not None else None
        if typical is None or not self._recorder.last_step_end_ns:
            return 3.0 * self._min_s
        return max(self._min_s, self._factor * typical)

    # -- checking -----------------------------------------------------------------------
    def check(self) -> str | None:
        """One look: warn (and return the text) when the current step is stalled."""
        cur = self._recorder.in_progress()
        if cur is None:
            return None
        index, step_start, phase, phase_start = cur
        now = self._clock()
        running = (now - step_start) / 1e9
        limit = self.threshold_seconds()
        if running <= limit:
            return None
        if self._warned_step == index and running < 2.0 * self._warned_at_s:
            return None  # already said; say it again when the stall has doubled
        self._warned_step, self._warned_at_s = index, running
        where = (f"in phase {phase!r} for {(now - phase_start) / 1e9:.1f} s"
                 if phase is not None else "outside any phase")
        typical = self._typical() if self._typical is not None else None
        usual = f" (a step usually takes {typical:.3g} s)" if typical else ""
        text = (f"otel-train: step {index} looks stalled: running for {running:.1f} s, "
                f"{where}{usual}; threshold {limit:.3g} s")
        self.last_warning = text
        if self._warn.warning("stall", "%s", text):
            self.stalls_warned += 1
        return text

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Start the daemon thread."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="otel-train-watchdog",
                                        daemon=True)
        self._thread.start()

    def check_operation(self) -> str | None:
        """Warn once while a monitoring operation runs longer than slow_operation_seconds.

        An eval hook that runs inference on 100 examples can freeze training for 20 minutes: say so at 30 s, while it
        still runs, not when it finally ends (the budget processor reports its final time).
        """
        if self._slow_op_s is None:
            return None
        op = self._recorder.open_monitoring()
        if op is None or op == self._warned_op:
            return None
        index, name, start = op
        running = (self._clock() - start) / 1e9
        if running <= self._slow_op_s:
            return None
        self._warned_op = op
        text = (f"otel-train: monitoring operation {name!r} at step {index} has been running "
                f"for {running:.1f} s (over slow_operation_seconds={self._slow_op_s:g}); "
                "training waits for it")
        self.last_warning = text
        if self._warn.warning(f"slow-op-{name}", "%s", text):
            self.slow_operations_warned += 1
        return text

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.check_operation()
                self.check()
            except Exception as exc:  # never raise out of the thread
                self._warn.warning("watchdog-error", "otel-train: watchdog check failed: %r",
                                   exc)

    def stop(self, timeout_seconds: float = 1.0) -> None:
        """Stop the thread (bounded join); idempotent."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.0, timeout_seconds))
