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

With ``stacks`` (stall_stacks.py), each stall warning comes with every thread's stack in
``RUN_DIR/stalls/`` and one line naming where the training thread is::

    otel-train: step 1234 stacks in otel-train-runs/r1/stalls/step-1234-20261126T161705Z.txt; training thread at train.py:88 forward

and a ``train.stall`` event on the step naming the file. A faulthandler timer armed on each
check writes them even while the training thread holds the GIL (the watchdog cannot run then).

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
from pathlib import Path
from time import perf_counter_ns, time_ns

from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.derived.stall_stacks import (
    STALL_EVENT,
    STALL_EVENT_FILE,
    STALL_EVENT_PHASE,
    STALL_EVENT_REASON,
    StallStacks,
    thread_stack,
)
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
        stacks: StallStacks | None = None,
        run_id: str = "",
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
        # Stacks on stalls; a signal-only StallStacks (timer off) is just closed at stop.
        self.stacks = stacks if stacks is not None and stacks.timer else None
        self._stacks_to_close = stacks
        self._run_id = run_id
        self.stacks_written: list[Path] = []
        self._armed_step: int | None = None  # the step the timer's pending file names
        self._flight_recorder_for: list[Path] = []  # stacks files to save its dump beside

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

    def phase_progress(self) -> tuple[str, float]:
        """(the running phase or '' outside any, seconds it has run; 0 between steps)."""
        cur = self._recorder.in_progress()
        if cur is None:
            return "", 0.0
        return cur[2] or "", max(0.0, (self._clock() - cur[3]) / 1e9)

    # -- checking -----------------------------------------------------------------------
    def check(self) -> str | None:
        """One look: warn (and return the text) when the current step is stalled."""
        text = self._check()
        if self._flight_recorder_for:  # last: torch's dump can take seconds
            paths, self._flight_recorder_for = self._flight_recorder_for, []
            for path in paths:
                fr = self.stacks.save_flight_recorder(path) if self.stacks else None
                if fr is not None:
                    self._log.warning("otel-train: flight recorder dump in %s", fr)
        return text

    def _check(self) -> str | None:
        cur = self._recorder.in_progress()
        fired = self._collect_fired() if self.stacks is not None else None
        if cur is None:
            self._rearm(None, 0.0)
            return None
        index, step_start, phase, phase_start = cur
        now = self._clock()
        running = (now - step_start) / 1e9
        limit = self.threshold_seconds()
        if running <= limit:
            self._rearm(index, limit - running)
            return None
        if self._warned_step == index and running < 2.0 * self._warned_at_s:
            self._rearm(index, 2.0 * self._warned_at_s - running)
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
        if self.stacks is not None:
            self.stacks.request_others(index, text + "\n")  # first: the others dump sooner
            if fired != index:  # the timer did not already write this stall's stacks
                reason = f"stall (running {running:.1f} s, threshold {limit:.3g} s)"
                path = self._dump(index, reason, phase)
                if path is not None:
                    self._stacks_written(index, path, phase, reason)
            self._rearm(index, running)  # the next dump when the stall has doubled
        return text

    # -- stacks (stall_stacks.py) -------------------------------------------------------
    def _header(self, index: int, reason: str, phase: str | None = None) -> str:
        stacks = self.stacks
        assert stacks is not None
        lines = [f"# otel-train stalls: step {index}, rank {stacks.rank} of "
                 f"{stacks.world_size}, run {self._run_id}", f"# reason: {reason}"]
        if phase is not None:
            lines.append(f"# phase: {phase}")
        lines.append(f"# training thread: 0x{stacks.training_thread:x}")
        return "\n".join(lines) + "\n"

    def _rearm(self, index: int | None, seconds: float) -> None:
        """Arm the timer for the step in progress, or for the next one between steps."""
        stacks = self.stacks
        if stacks is None:
            return
        for step, rank in stacks.new_requests():
            self._answer_request(step, rank)
        if index is None:
            # A step starting before the next check and holding the GIL from its start:
            # the timer fires at most one interval after its threshold.
            index = self._recorder.next_index
            seconds = self.threshold_seconds() + self._interval
        self._armed_step = index
        header = self._header(index, "stall (written by faulthandler's timer at the stall "
                              "threshold, before the watchdog could look: the GIL held?); "
                              "the step named is the one armed for (or a later one)")
        # Up to a tenth of the threshold early for a later step: few re-arms with short steps.
        try:
            stacks.arm(index, header, seconds, slack_seconds=0.1 * self.threshold_seconds())
        except OSError as exc:  # the run directory is not writable: direct dumps only
            stacks.timer = False
            self._warn.warning("stacks-error", "otel-train: cannot arm stall stacks (%r); "
                               "stacks are written only when the watchdog can run", exc)

    def _collect_fired(self) -> int | None:
        """Move the timer's stacks to their step's file; that step, or None if it did not fire."""
        stacks = self.stacks
        if stacks is None or self._armed_step is None or not stacks.fired():
            return None
        fired_at = stacks.fired_at_ns()
        rec = self._recorder
        cur = rec.in_progress()
        queued = self._queued_step_at(fired_at - self._offset_ns)
        if queued is not None:  # ended since, not drained yet: its own start and end say
            index, phase = queued, None
        elif cur is not None and cur[1] + self._offset_ns <= fired_at:
            index, phase = cur[0], cur[2]  # the step running now ran when the timer fired
        elif rec.last_step_end_ns and rec.last_step_end_ns + self._offset_ns >= fired_at:
            # It has ended since, over the threshold: the step before the one running now
            # (the watchdog runs within a few ms of the GIL's release).
            index, phase = (cur[0] if cur is not None else rec.next_index) - 1, None
        else:
            stacks.discard_fired()  # between steps, or its step ended in time
            return None
        text = stacks.take_fired()
        reason = ("stall (faulthandler's timer at the stall threshold, "
                  f"{self.threshold_seconds():.3g} s)")
        try:
            path = stacks.write_stacks(index, self._header(index, reason) + text, fired_at)
        except OSError as exc:
            self._warn.warning("stacks-error", "otel-train: cannot write stall stacks: %r", exc)
            return None
        self._stacks_written(index, path, phase, reason)
        return index

    def _queued_step_at(self, at_ns: int) -> int | None:
        """The finished step, still queued for the span worker, that ran at ``at_ns``
        (perf_counter_ns), if any: exact where steps after a stall ended before the watchdog
        could look."""
        # list() copies the deque in one C call under the GIL: no append can interleave.
        for record in reversed(list(self._recorder.queue)):
            index = getattr(record, "index", None)
            start, end = getattr(record, "start_ns", None), getattr(record, "end_ns", 0)
            if not isinstance(index, int) or not isinstance(start, int) or not end:
                continue
            if start <= at_ns <= end:
                return index
            if end < at_ns:
                return None  # older steps ended before it, too
        return None

    def _dump(self, index: int, reason: str, phase: str | None) -> Path | None:
        """Every thread's stack now, in a new file (None, logged, when it cannot be written)."""
        assert self.stacks is not None
        try:
            return self.stacks.dump_now(index, self._header(index, reason, phase))
        except OSError as exc:
            self._warn.warning("stacks-error", "otel-train: cannot write stall stacks: %r", exc)
            return None

    def _answer_request(self, step: int, rank: int) -> None:
        """Another rank stalled: dump this one's stacks too, whatever it is doing."""
        cur = self._recorder.in_progress()
        index = cur[0] if cur is not None else max(self._recorder.next_index - 1, 0)
        phase = cur[2] if cur is not None else None
        reason = f"request from rank {rank} (stalled at its step {step})"
        path = self._dump(index, reason, phase)
        if path is not None:
            self._stacks_written(index, path, phase, reason)

    def _stacks_written(self, index: int, path: Path, phase: str | None, reason: str) -> None:
        """One line naming the training thread's innermost frame; the event on the step."""
        assert self.stacks is not None
        self.stacks_written.append(path)
        try:
            text = path.read_text(errors="replace")
        except OSError:
            text = ""
        stack = thread_stack(text, self.stacks.training_thread)
        where = stack.innermost() if stack is not None else "(not in the dump)"
        self._log.warning("otel-train: step %d stacks in %s; training thread at %s",
                          index, path, where)
        self._flight_recorder_for.append(path)
        step = self._recorder.current
        if step is not None and step.index == index and not step.end_ns:
            attrs = {STALL_EVENT_FILE: str(path), STALL_EVENT_REASON: reason}
            if phase is not None:
                attrs[STALL_EVENT_PHASE] = phase
            events = getattr(step, "stall_events", None)
            if events is None:
                events = step.stall_events = []  # type: ignore[attr-defined]
            events.append((STALL_EVENT, time_ns(), attrs))

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        """Start the daemon thread."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._rearm(None, 0.0)  # a first step that holds the GIL before the first check
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
        if self.stacks is not None and (thread is None or not thread.is_alive()):
            self._collect_fired()  # stacks the timer wrote since the last check
        if self._stacks_to_close is not None:
            self._stacks_to_close.close()
