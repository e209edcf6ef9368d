"""A profile of the steps after a slow one: ``torch.profiler`` over K steps, on request.

Two ways in, both asked for by the user: ``profile_on_slow_steps=K`` (after a slow step, the
next K steps are profiled; at most one such capture per ``profile_min_interval_seconds``) and
``run.profile_next(k)`` by hand (any thread; not rate limited). The slow-step verdict is made
in the derived chain, possibly in the exporter process; its count comes back to this process
with the chain's state (``SlowStepSpanProcessor.slow_steps``), and the training thread reads
that count at each step boundary: one attribute read, in Python code of its own, never in
the C hot path.

The boundaries are where a step begins: each fetch of a ``run.steps`` loop (its iterable is
wrapped, only while profiling is armed: the option on, or a request pending when the loop
starts) and each ``run.step()``. A capture opens ``torch.profiler.profile`` (CPU; CUDA too
when available) at a step's start, brackets each step in a ``record_function`` range named
``otel_train.step#<index>``, and stops at the start of the step after the K-th. A background
thread then writes the trace and attaches each step's top operators to it
(``profile_spans.py``). With the option at 0 and no request, nothing is wrapped, nothing is
checked and ``torch.profiler`` is never imported.

Usage::

    capture = ProfileCapture(recorder, run_dir, run_id, on_slow_steps=2,
                             min_interval_seconds=600, slow=derived.slow,
                             emit=emit_spans)
    iterable = capture.hooked(iterable)      # run.steps, when capture.armed
    capture.boundary(step)                   # run.step()
    capture.request(5)                       # run.profile_next(5), any thread
    capture.close()                          # shutdown: stop a capture, wait for its files
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from otel_train.common.identity import step_trace_id
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.common.trace_ids import new_span_id
from otel_train.pipeline.profile_spans import CapturedStep, write_capture

_log = logging.getLogger("otel_train")
_RANGE_PREFIX = "otel_train.step#"
_WRITE_JOIN_SECONDS = 30.0  # close() waits this long at most for the last trace's files
# The profiled steps are slower (the profiler's own cost): slow-step verdicts that arrive
# this soon after a capture ends are theirs (the chain's state comes back once a second),
# and start no capture of their own.
_AFTER_CAPTURE_IGNORE_SECONDS = 2.0


class ProfileCapture:
    """Runs K steps under ``torch.profiler`` when asked; lives on the training thread."""

    def __init__(self, recorder: Any, run_dir: Path, run_id: str, on_slow_steps: int,
                 min_interval_seconds: float, slow: Any,
                 emit: Callable[[list[CapturedStep], str, str], None] | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._rec = recorder
        self.run_dir = run_dir
        self._run_id = run_id
        self.on_slow_steps = on_slow_steps
        self.min_interval_seconds = min_interval_seconds
        # The slow-step processor (derived/slow_steps.py): its ``slow_steps`` count, here or
        # loaded from the exporter process's chain, is all that is read.
        self._slow = slow if on_slow_steps else None
        self._slow_seen = slow.slow_steps if self._slow is not None else 0
        self._emit = emit
        self._clock = clock
        self._next_allowed = 0.0  # monotonic: the next slow-step capture may start then
        self._ignore_until = 0.0  # monotonic: slow verdicts before this are the profile's own
        self._lock = threading.Lock()
        self._requested = 0  # run.profile_next(k), pending
        self._prof: Any = None  # the torch profiler of the capture running
        self._range: Any = None  # the record_function range of the step being profiled
        self._steps: list[CapturedStep] = []
        self._left = 0  # steps still to profile in this capture
        self._trigger = ""
        self._writers: list[threading.Thread] = []
        self._hooked_loops = 0
        self._owner = 0  # the thread that started the running profiler
        self.captures = 0  # captures started (tests, costs)
        self.skipped = 0  # slow-step captures refused by the rate limit
        self.files: list[Path] = []  # traces written
        self._warn = RateLimitedLogger(_log)
        self._closed = False
        # Profiling can start: the option is on, or a request is pending or running. A plain
        # attribute: run.step() reads it on every call.
        self.armed = bool(on_slow_steps)

    @property
    def in_hooked_loop(self) -> bool:
        """A ``run.steps`` loop with its boundaries checked is running."""
        return self._hooked_loops > 0

    def request(self, steps: int) -> None:
        """Profile the next ``steps`` steps (any thread); a running capture is not extended."""
        with self._lock:
            self._requested = max(self._requested, steps)
            self.armed = True

    # -- on the training thread ----------------------------------------------------------
    def hooked(self, iterable: Iterable[Any]) -> Iterator[Any]:
        """``iterable``, with a step boundary checked before each fetch."""
        rec = self._rec
        it = iter(iterable)
        slow = self._slow  # locals: this runs once per step while armed
        self._hooked_loops += 1
        try:
            while True:
                if (self._prof is not None or self._requested
                        or (slow is not None and slow.slow_steps > self._slow_seen)):
                    step = rec.current
                    if step is not None:
                        self.at_step_start(step)
                try:
                    item = next(it)
                except StopIteration:
                    self._forget_unfetched_step(rec.current)
                    return
                yield item
        finally:
            self._hooked_loops -= 1
            self.stop()  # the loop ended: a capture ends with it

    def boundary(self, step: Any) -> None:
        """``step`` begins: the capture running goes on or stops, or one is due to start."""
        if self._prof is not None or self._due():
            self.at_step_start(step)

    def at_step_start(self, step: Any) -> None:
        """A step begins: end the previous step's range, start, go on or stop a capture."""
        if self._closed:
            return
        try:
            if self._prof is not None:
                self._close_range()
                if self._left <= 0:
                    self.stop()
            if self._prof is None:
                k = self._take_due()
                if not k:
                    return
                self._start(k)
            self._open_range(step)
            self._left -= 1
        except Exception as exc:  # never into training
            self._warn.warning("profile", "otel-train: profiling failed: %r", exc)
            self._abandon()

    def stop(self) -> None:
        """End the capture running, if any, and write it in the background."""
        prof = self._prof
        if prof is None:
            return
        if threading.get_ident() != self._owner:
            # The profiler is the training thread's (a SIGTERM's shutdown runs on a thread
            # of its own): stopping it here is not safe, and the process is ending.
            self._prof, self._steps, self._left, self._range = None, [], 0, None
            return
        steps, trigger = self._steps, self._trigger
        self._prof, self._steps, self._left = None, [], 0
        with self._lock:
            self.armed = bool(self.on_slow_steps or self._requested)
        self._ignore_until = self._clock() + _AFTER_CAPTURE_IGNORE_SECONDS
        try:
            self._close_range()
            name = f"step-{steps[0].index}-{steps[-1].index}.json" if steps else "empty.json"
            path = self.run_dir / "profiles" / name
            _add_metadata(prof, steps, trigger)
            prof.stop()
        except Exception as exc:
            self._warn.warning("profile", "otel-train: profiling failed: %r", exc)
            return
        if not steps:
            return
        self.files.append(path)
        writer = threading.Thread(target=write_capture, name="otel-train-profile",
                                  args=(prof, steps, path, trigger, self.run_dir, self._emit),
                                  daemon=True)
        writer.start()
        self._writers = [w for w in self._writers if w.is_alive()] + [writer]

    def close(self, timeout_seconds: float = _WRITE_JOIN_SECONDS) -> None:
        """Stop a capture running and wait (bounded) until every trace is written."""
        self.stop()
        self._closed = True
        deadline = time.monotonic() + timeout_seconds
        for writer in self._writers:
            writer.join(max(0.0, deadline - time.monotonic()))

    # -- internals ------------------------------------------------------------------------
    def _due(self) -> bool:
        """A capture should start at this boundary (cheap: reads two numbers)."""
        if self._requested:
            return True
        slow = self._slow
        return slow is not None and slow.slow_steps > self._slow_seen

    def _take_due(self) -> int:
        """The steps of the capture to start now, 0 for none; takes the request or trigger."""
        with self._lock:
            k, self._requested = self._requested, 0
        if k:
            self._trigger = "request"
            return k
        slow = self._slow
        if slow is None:
            return 0
        seen = slow.slow_steps
        if seen <= self._slow_seen:
            return 0
        self._slow_seen = seen
        now = self._clock()
        if now < self._ignore_until:
            return 0
        if now < self._next_allowed:
            self.skipped += 1
            return 0
        self._next_allowed = now + self.min_interval_seconds
        self._trigger = "slow_step"
        return self.on_slow_steps

    def _start(self, steps: int) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities)
        prof.start()
        self._owner = threading.get_ident()
        self._prof, self._left, self._steps = prof, steps, []
        self.captures += 1

    def _open_range(self, step: Any) -> None:
        from torch.autograd.profiler import record_function

        if not step.trace_id:
            step.trace_id = step_trace_id(self._run_id, step.index)
        ids = step.span_ids
        if ids is None:
            ids = step.span_ids = {}
        root_id = ids.get(-1) or ids.setdefault(-1, new_span_id())  # the profile's parent
        self._steps.append(CapturedStep(step.index, step.trace_id, root_id, step))
        rng = record_function(f"{_RANGE_PREFIX}{step.index}")
        rng.__enter__()
        self._range = rng

    def _close_range(self) -> None:
        rng, self._range = self._range, None
        if rng is not None:
            rng.__exit__(None, None, None)

    def _forget_unfetched_step(self, step: Any) -> None:
        """The fetch found the loop's iterable exhausted: that step never ran."""
        if self._steps and step is not None and self._steps[-1].step is step:
            self._steps.pop()

    def _abandon(self) -> None:
        """Drop the capture running without writing it."""
        prof, self._prof, self._steps, self._left, self._range = (
            self._prof, None, [], 0, None)
        if prof is not None:
            try:
                prof.stop()
            except Exception:
                pass


def _add_metadata(prof: Any, steps: list[CapturedStep], trigger: str) -> None:
    """Each step's index and trace id into the trace file itself (key ``otel_train``)."""
    import json

    meta = {"trigger": trigger, "steps": [
        {"step": s.index, "trace_id": f"{s.trace_id:032x}", "span_id": f"{s.root_id:016x}"}
        for s in steps]}
    try:
        prof.add_metadata_json("otel_train", json.dumps(meta))
    except Exception:  # older torch: the sidecar file holds the same
        pass
