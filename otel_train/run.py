"""The public entry point: ``start_run`` and the ``Run`` it returns.

Usage::

    import otel_train

    with otel_train.start_run(service_name="tiny-gpt", budget=0.05) as run:
        for step in run.steps(train_loader, loader="train"):
            with step.phase("forward"):
                loss = model(step.batch)
            with step.phase("backward"):
                loss.backward()
            with step.phase("optimizer"):
                opt.step(); opt.zero_grad()
            step.set_attribute("train.loss", loss)
            if step.index % 200 == 0:
                with step.monitor("inference"):
                    model.generate(...)
        print(run.costs())
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api

from otel_train import process_hooks
from otel_train.pipeline.assembly import assemble_run
from otel_train.pipeline.telemetry import DisabledTelemetry, RunTelemetry
from otel_train.recording.monitor_record import CheckpointRecord
from otel_train.recording.device import DeviceTiming
from otel_train.common import attributes as A
from otel_train.common.drop_counter import DropCounter
from otel_train.common.drop_words import run_dropped_summary
from otel_train.common.identity import RunIdentity
from otel_train.common.options import RunOptions
from otel_train.recording.collectives import CollectiveLog
from otel_train.recording.recorder import MonitorRecord, Phase, Step
from otel_train.pipeline.profile_capture import ProfileCapture
from otel_train.recording.step_counts import BatchCounter
from otel_train.recording.truncation import (
    cut_open_step,
    inert_after_fork,
    reason_of,
    release_held_cut,
)
from otel_train.common.sdk_config import ExportPlan

_log = logging.getLogger("otel_train")
_EXIT_TEARDOWN_RESERVE_SECONDS = 0.5


def start_run(**options: Any) -> Run:
    """Start a run. Options are keyword arguments, each also read from OTEL_TRAIN_<NAME>.

    Raises ``ValueError`` naming the option and the rule when an option is bad, and when
    the Prometheus port is taken.
    """
    return Run(RunOptions.resolve(**options))


class Run:
    """One training run: steps, phases, monitoring, and the telemetry they produce."""

    def __init__(self, options: RunOptions) -> None:
        started_ns = time.perf_counter_ns()  # own cost: start-up is reported apart from the steps
        self.options = options
        self._closed = False
        self._lock = threading.Lock()
        self.drops = DropCounter()
        parts = assemble_run(options, self.drops, started_ns)  # every part, built: none started
        self.disabled_by = parts.disabled_by
        self.identity: RunIdentity = parts.identity
        self.status_dir = parts.status_dir
        self.device: DeviceTiming = parts.device
        self.self_cost = parts.self_cost
        self._recorder = parts.recorder
        self._counter: BatchCounter | None = parts.counter
        self._telemetry: RunTelemetry | DisabledTelemetry = parts.telemetry
        self._profiling: ProfileCapture | None = parts.profiling
        self._report_at_shutdown = parts.writes_report
        self._context_token = None
        self._telemetry.start()  # shows the banner; may raise: e.g. the Prometheus port is taken
        if self.disabled_by is None:
            # User spans opened inside a phase nest under it: one proxy span, attached once.
            self._proxy = parts.proxy
            self._context_token = context_api.attach(
                trace_api.set_span_in_context(self._proxy))
            self._context_thread = threading.get_ident()
            self._manual_step: Step | None = None  # the last run.step() (profile_next's check)
            atexit.register(self._atexit)
            process_hooks.track(self)  # fork-safe; SIGTERM ends the run cleanly
            self.self_cost.note_ready()

    # -- public API ---------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        """The run id every rank shares."""
        return self.identity.run_id

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self.identity.rank

    @property
    def world_size(self) -> int:
        """The number of ranks."""
        return self.identity.world_size

    @property
    def prometheus_url(self) -> str | None:
        """Base URL of the metrics endpoint (``/metrics`` under it), or None when off."""
        return self._telemetry.prometheus_url

    @property
    def export_plan(self) -> ExportPlan:
        """Where spans go, and why (the banner's ``spans ->`` line)."""
        return self._telemetry.export_plan

    @property
    def spans_path(self) -> Path | None:
        """The local span file when spans go to one."""
        return self.export_plan.path

    def collective_log(self) -> CollectiveLog | None:
        """Where this run's collectives are timed (``otel_train.instrument_ddp``); None when
        disabled. Made on first use: a run without it adds nothing per step."""
        return self._telemetry.collective_log()

    def steps(self, iterable: Iterable[Any], loader: str | None = "train",
              max_steps: int | None = None) -> Iterator[Step]:
        """Yield a Step per item of ``iterable``; fetching the item is the ``data`` phase.

        ``max_steps`` ends this loop after that many steps, without fetching another item.
        Step indices continue across calls (one call per epoch keeps one index); leaving
        the loop early ends the step in progress (docs/api.md, "Loops").
        """
        self._check_open("steps")
        prof = self._profiling
        if prof is not None and prof.armed:  # only then: off, the loop is left as it is
            iterable = prof.hooked(iterable)
        counter = self._counter
        if counter is not None and not counter.active:  # off: nothing per batch
            counter = None
        return self._recorder.steps(iterable, loader, max_steps, counter)

    def step(self, loader: str | None = None, index: int | None = None,
             start_ns: int | None = None) -> Step:
        """A step for loops that fetch their own data (``with run.step() as step:``).

        ``start_ns`` (a ``perf_counter_ns`` value) backdates the start to an event already
        seen, for integrations that learn a step began only after it did.
        """
        self._check_open("step")
        self._recorder.release_held()
        step = self._recorder.begin_step(loader, index)
        if start_ns is not None and start_ns < step.start_ns:
            step.start_ns = start_ns
        counter = self._counter
        if counter is not None and counter.active:
            counter.at_manual_step(step)
        prof = self._profiling
        if prof is not None and prof.armed:
            self._manual_step = step
            prof.boundary(step)
        return step

    def profile_next(self, steps: int = 1) -> None:
        """Profile the next ``steps`` steps under ``torch.profiler`` (any thread).

        The capture starts where the next step begins: in a ``run.steps`` loop started with
        ``profile_on_slow_steps`` on or after this call, or at the next ``run.step()``. Its
        trace goes to ``RUN_DIR/profiles/``; each step gets a ``train.profile`` child span
        with its top operators (docs/telemetry.md). Not rate limited: you asked.
        """
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 1000:
            raise ValueError(f"profile_next(steps={steps!r}): steps must be an integer "
                             "from 1 to 1000")
        prof = self._profiling
        if prof is None or self._closed:
            return  # a disabled or ended run profiles nothing
        prof.request(steps)
        cur = self._recorder.current
        if cur is not None and not prof.in_hooked_loop and cur is not self._manual_step:
            _log.warning("otel-train: run.profile_next(%d): this run.steps loop started with "
                         "profiling off; the capture starts with the next run.steps loop or "
                         "run.step() (set profile_on_slow_steps, or call profile_next "
                         "before the loop)", steps)

    def timestamp_ns(self) -> int:
        """A phase-boundary timestamp (``perf_counter_ns``), synchronizing per device_sync."""
        return self._recorder.timestamp_ns()

    def phase(self, name: str) -> Phase:
        """A training phase of the current step."""
        step = self._recorder.current
        if step is None:
            raise RuntimeError(
                f"run.phase({name!r}) called outside a step: use it inside "
                "`for step in run.steps(...)` or `with run.step() as step:`")
        return step.phase(name)

    def due(self, operation: str, every: int | None = None, *, force: bool = False,
            min_every: int | None = None, max_every: int | None = None,
            index: int | None = None) -> bool:
        """``step.due`` of the current step (``with run.step() as step:`` loops); ``index``
        schedules by another count than the step's index (a trainer's 1-based
        ``global_step``: ``index % every == 0`` as the trainer's own check)."""
        step = self._recorder.current
        if step is None:
            raise RuntimeError(
                f"run.due({operation!r}) called outside a step: use it inside "
                "`for step in run.steps(...)` or `with run.step() as step:`")
        if index is not None and (isinstance(index, bool) or not isinstance(index, int)
                                  or index < 0):
            raise ValueError(f"run.due({operation!r}): index={index!r} must be an integer >= 0")
        return self._recorder.schedule.due(step, operation, every, force, min_every,
                                           max_every, -1 if index is None else index)

    def monitor(self, name: str) -> Phase | MonitorRecord:
        """Monitoring work: a phase of the current step, or its own span between steps
        (``"checkpoint"`` between steps is ``run.checkpoint()``)."""
        step = self._recorder.current
        if step is not None and not step.end_ns:
            return step.monitor(name)
        self._check_open("monitor")
        if name == A.CHECKPOINT_OPERATION:
            return CheckpointRecord(self._recorder)
        return MonitorRecord(self._recorder, name)

    def checkpoint(self, action: str = "save") -> Phase | MonitorRecord:
        """A checkpoint save or load (``action``): span ``train.checkpoint`` between steps,
        the monitoring phase ``checkpoint`` inside one; the job envelope counts it."""
        step = self._recorder.current
        if step is not None and not step.end_ns:
            return step.monitor(A.CHECKPOINT_OPERATION)
        self._check_open("checkpoint")
        return CheckpointRecord(self._recorder, action)

    def costs(self) -> dict[str, Any]:
        """What monitoring cost so far (the content of monitoring_costs.json)."""
        return self._telemetry.costs()

    def flush(self, timeout_seconds: float = 5.0) -> bool:
        """Build and export everything recorded so far; True when it all went out."""
        self._recorder.release_held()
        return self._telemetry.flush(timeout_seconds)

    def dropped_spans(self) -> dict[str, int]:
        """Spans dropped so far, by reason."""
        return self.drops.counts()

    def shutdown(self, timeout: float | None = None) -> None:
        """Flush and stop everything within ``timeout`` seconds (default: the option)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        budget = self.options.shutdown_timeout_seconds if timeout is None else timeout
        deadline = time.monotonic() + max(0.0, budget)
        rec = self._recorder
        cut_open_step(rec, A.TRUNCATED_SHUTDOWN)  # a step still open is cut off here
        if self._counter is not None:
            self._counter.close_flops(None)  # a FLOP count still open ends, uncounted
        rec.release_held()
        rec.closed = True
        if self._profiling is not None:  # its spans go out with the rest: before the stop
            self._profiling.close(max(0.0, deadline - time.monotonic()) * 0.5)
        self._telemetry.shutdown(deadline)
        if self._context_token is not None and threading.get_ident() == self._context_thread:
            try:
                context_api.detach(self._context_token)
            except Exception:
                pass  # contexts attached after ours were not detached: leave them be
        try:
            atexit.unregister(self._atexit)
        except Exception:
            pass
        process_hooks.untrack(self)
        # How many spans did not arrive, why and where they were going, in words.
        telemetry = self._telemetry
        dropped = run_dropped_summary(self.drops.counts(), telemetry.export_plan,
                                      telemetry.export)
        if dropped is not None:
            _log.warning("%s", dropped)
        if self._writes_report():
            # After everything is exported: the report reads the files it just flushed.
            from otel_train.rundir.report import write_report_at_shutdown
            write_report_at_shutdown(self.status_dir, announce=self.options.console)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is not None:
            self._cut(exc, reason_of(exc, A.TRUNCATED_EXCEPTION))
        self.shutdown()
        return False

    # -- internals ----------------------------------------------------------------------
    def _check_open(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"run.{what}() called after the run was shut down")

    def _atexit(self) -> None:
        # Interpreter exit: the teardown that follows (modules, torch, gRPC) is part of the
        # bound too, so the run shuts down within the budget less a reserve for it.
        budget = self.options.shutdown_timeout_seconds
        # An unhandled exception ended the interpreter (it is printed, and kept in
        # sys.last_value, before atexit runs): the step it cut off says so.
        error = getattr(sys, "last_value", None)
        if isinstance(error, BaseException) and not self._closed:
            self._cut(error, reason_of(error, A.TRUNCATED_EXCEPTION))
        self.shutdown(budget - min(_EXIT_TEARDOWN_RESERVE_SECONDS, budget * 0.25))

    def _cut(self, error: BaseException, reason: str) -> None:
        """The step in progress, or the one its loop left as it unwound, was cut off."""
        rec = self._recorder
        cut_open_step(rec, reason, error)
        release_held_cut(rec, reason, error)

    def _interrupt(self, error: BaseException, reason: str = "sigterm") -> None:
        """A signal ends the run: the step in progress is cut off (failed with ``error``,
        marked with ``reason``), then shutdown."""
        self._cut(error, reason)
        self.shutdown()

    def _after_fork_in_child(self) -> None:
        """In a forked child: this copy of the run goes inert (the parent exports its data).

        Code still running inside one of its steps keeps working, but records nothing; no
        inherited lock is ever taken again (a background thread may have held it at fork).
        """
        self._lock = threading.Lock()
        self._closed = True
        self._profiling = None  # a capture running is the parent's
        inert_after_fork(self._recorder)
        try:
            atexit.unregister(self._atexit)
        except Exception:
            pass
        self._telemetry.after_fork_in_child()

    def _writes_report(self) -> bool:
        """report.html at shutdown: option ``report`` (default: with the console), rank 0,
        when spans go to the run directory's files."""
        return self._report_at_shutdown
