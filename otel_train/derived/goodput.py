"""Goodput and the job envelope: where the job's wall time went, steps and the rest.

The job's time, from this process's start (``common/process_start.py``; ``start_run`` where
that cannot be read) to the end of the latest step or operation the metrics have seen, is cut
into parts (``attributes.JOB_PARTS``):

- ``startup``: process start -> the first step's start (the ``train.startup`` span, option
  ``startup_span``), less the checkpoints and evaluation recorded before that step;
- ``steps``: the steps' wall time less the monitoring inside them;
- ``checkpoint``: ``run.checkpoint()`` / ``run.monitor("checkpoint")`` between steps, and a
  ``checkpoint`` monitoring phase inside a step (the Hugging Face callback's);
- ``evaluation``: every other monitoring operation, between steps or inside them;
- ``restart_lost``: on an attempt that resumed the run (same run id, same run directory):
  the previous attempt's end (its latest step or operation) -> this process's start, plus the
  previous attempt's step time after its last checkpoint save (redone since that checkpoint;
  none when it recorded no save: that cannot be told);
- ``other``: the rest (time between steps that nothing recorded).

Goodput = ``steps`` / the job's time, over every attempt so far. A resumed attempt carries the
previous attempts' parts (read from the run directory's costs file at start) so its figures
are the whole job's. "So far" ends at the latest thing recorded, so the counters never go
back when a late step arrives; a hang shows in the stall metrics, and here once it ends.

Usage::

    proc = GoodputSpanProcessor(envelope_settings(costs_path, start_run_ns))
    proc.on_step(view); proc.on_operation(view)       # the chain feeds it
    proc.envelope()                                   # the costs file's "envelope"
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from otel_train.common import attributes as A
from otel_train.common.sdk_private import span_attributes
from otel_train.common.process_start import process_start
from otel_train.records.steps_view import StepView, StepViewProcessor

_log = logging.getLogger("otel_train")
_CHECKPOINT = A.CHECKPOINT_OPERATION
_MEASURED = ("startup", "steps", "checkpoint", "evaluation")
# The process's start opens the envelope of its first run only: a later run of the same
# process starts at its own start_run.
_process_start_taken = False


def envelope_settings(costs_path: Path, start_run_epoch_ns: int) -> dict[str, Any]:
    """Where this attempt's job time starts, and what earlier attempts carry (plain data)."""
    global _process_start_taken
    found = None if _process_start_taken else process_start()
    _process_start_taken = True
    start_ns, source = ((found.epoch_ns, found.source) if found is not None
                        else (start_run_epoch_ns, "start_run"))
    settings: dict[str, Any] = {"job_start_epoch_ns": start_ns, "start_from": source,
                                "attempt": 1, "carried_seconds": {}, "carried_job_seconds": 0.0,
                                "previous_startup_trace_id": None, "restart_lost_seconds": 0.0}
    previous = previous_envelope(costs_path)
    if previous is not None:
        settings.update(carry_previous(previous, start_ns))
    return settings


def previous_envelope(costs_path: Path) -> dict[str, Any] | None:
    """The envelope a previous attempt of this run wrote to the costs file, or None."""
    try:
        data = json.loads(costs_path.read_text(encoding="utf-8"))
        env = data["envelope"]
        int(env["attempt"]), int(env["horizon_epoch_ns"]), float(env["job_seconds"])
        dict(env["parts_seconds"])
        return env  # type: ignore[no-any-return]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        _log.warning("otel-train: %s holds no previous attempt's envelope (%r): this attempt "
                     "starts the job's figures afresh", costs_path, exc)
        return None


def carry_previous(previous: dict[str, Any], start_ns: int) -> dict[str, Any]:
    """What this attempt carries: the previous attempts' parts, the restart's loss added."""
    parts = {p: float(previous["parts_seconds"].get(p, 0.0)) for p in A.JOB_PARTS}
    gap = max(0.0, (start_ns - int(previous["horizon_epoch_ns"])) / 1e9)
    redone = 0.0
    if previous.get("checkpoint_saves"):
        redone = min(parts["steps"], float(previous.get("steps_since_save_seconds") or 0.0))
    parts["steps"] -= redone
    parts["restart_lost"] += gap + redone
    return {"attempt": int(previous["attempt"]) + 1, "carried_seconds": parts,
            "carried_job_seconds": float(previous["job_seconds"]) + gap,
            "previous_startup_trace_id": previous.get("startup_trace_id"),
            "restart_lost_seconds": round(gap + redone, 6)}


class GoodputSpanProcessor(StepViewProcessor):
    """The job's time by part, and goodput, from every step and operation."""

    takes_envelope = True
    state_fields = ("parts_ns", "horizon_ns", "steps_since_save_ns", "checkpoint_saves",
                    "startup_trace_id", "first_step_seen", "before_first_step_ns")

    def __init__(self, settings: dict[str, Any]) -> None:
        super().__init__()
        self.settings = settings
        self.job_start_ns = int(settings["job_start_epoch_ns"])
        self.carried: dict[str, float] = dict(settings.get("carried_seconds") or {})
        self.carried_job_seconds = float(settings.get("carried_job_seconds") or 0.0)
        self.parts_ns = {p: 0 for p in _MEASURED}
        self.horizon_ns = self.job_start_ns
        self.steps_since_save_ns = 0
        self.checkpoint_saves = 0
        self.startup_trace_id: str | None = None
        self.first_step_seen = False
        self.before_first_step_ns = 0  # operations between the process start and the first step

    def on_step(self, view: StepView) -> None:
        """A step: its time less its monitoring, which is evaluation (or checkpoint)."""
        parts = self.parts_ns
        if not self.first_step_seen:  # start-up ends here, less what was recorded in it
            self.first_step_seen = True
            parts["startup"] = max(0, view.start_ns - self.job_start_ns
                                   - self.before_first_step_ns)
        monitor = view.monitor_ns
        train = view.duration_ns - monitor
        parts["steps"] += train
        self.steps_since_save_ns += train
        if monitor:
            saved = 0
            for name, d in view.operations:  # a loop: no list made per step
                if name == _CHECKPOINT:
                    saved += d
            parts["checkpoint"] += saved
            parts["evaluation"] += monitor - saved
            if saved:
                self._saved()
        if view.end_ns > self.horizon_ns:
            self.horizon_ns = view.end_ns

    def on_steps(self, views: Sequence[StepView],
                 failed: Callable[[StepViewProcessor, StepView, Exception], None]) -> None:
        """A frame of steps: ``on_step``'s sums past the first step, in the same order, the
        steps' and evaluation's running sums and the horizon in locals over the frame (a
        dict item and two attributes written back once); the first step goes to ``on_step``."""
        parts = self.parts_ns
        steps, evaluation = parts["steps"], parts["evaluation"]
        since_save, horizon = self.steps_since_save_ns, self.horizon_ns
        try:
            for view in views:
                try:
                    if not self.first_step_seen:
                        parts["steps"], parts["evaluation"] = steps, evaluation
                        self.steps_since_save_ns, self.horizon_ns = since_save, horizon
                        try:
                            self.on_step(view)
                        finally:  # what it added, even if it failed half-way
                            steps, evaluation = parts["steps"], parts["evaluation"]
                            since_save, horizon = self.steps_since_save_ns, self.horizon_ns
                        continue
                    monitor = view.monitor_ns
                    train = view.duration_ns - monitor
                    steps += train
                    since_save += train
                    if monitor:
                        saved = 0
                        for name, d in view.operations:
                            if name == _CHECKPOINT:
                                saved += d
                        parts["checkpoint"] += saved
                        evaluation += monitor - saved
                        if saved:  # _saved(), inline
                            self.checkpoint_saves += 1
                            since_save = 0
                    end = view.end_ns
                    if end > horizon:
                        horizon = end
                except Exception as exc:
                    failed(self, view, exc)
        finally:
            parts["steps"], parts["evaluation"] = steps, evaluation
            self.steps_since_save_ns, self.horizon_ns = since_save, horizon

    def on_operation(self, view: StepView) -> None:
        """Between steps: start-up, a checkpoint, or evaluation."""
        parts = self.parts_ns
        if view.envelope:  # train.startup: its time is counted at the first step
            self.startup_trace_id = f"{view.trace_id:032x}"
            return
        if not self.first_step_seen:
            self.before_first_step_ns += view.duration_ns
        if view.name == _CHECKPOINT:
            parts["checkpoint"] += view.duration_ns
            attrs = span_attributes(view.span) or {}
            if attrs.get(A.CHECKPOINT_ACTION, "save") == "save":
                self._saved()
        else:
            parts["evaluation"] += view.duration_ns
        if view.end_ns > self.horizon_ns:
            self.horizon_ns = view.end_ns

    def _saved(self) -> None:
        self.checkpoint_saves += 1
        self.steps_since_save_ns = 0

    def job_seconds(self) -> float:
        """The job's time so far, every attempt: to the latest step or operation seen."""
        return self.carried_job_seconds + max(0, self.horizon_ns - self.job_start_ns) / 1e9

    def parts_seconds(self) -> dict[str, float]:
        """Seconds by part (``attributes.JOB_PARTS``), every attempt so far."""
        out = {p: self.carried.get(p, 0.0) for p in A.JOB_PARTS}
        for p in _MEASURED:
            out[p] += self.parts_ns[p] / 1e9
        this_job = max(0, self.horizon_ns - self.job_start_ns) / 1e9
        measured = sum(self.parts_ns.values()) / 1e9
        out["other"] += max(0.0, this_job - measured)
        return out

    def goodput_ratio(self) -> float | None:
        """Steps / the job's time (None before anything was seen)."""
        job = self.job_seconds()
        return self.parts_seconds()["steps"] / job if job > 0 else None

    def envelope(self) -> dict[str, Any]:
        """The costs file's ``envelope``: parts, goodput, and what a next attempt carries."""
        parts = self.parts_seconds()
        job = self.job_seconds()
        s = self.settings
        return {
            "goodput_ratio": parts["steps"] / job if job > 0 else None,
            "job_seconds": round(job, 6),
            "parts_seconds": {p: round(v, 6) for p, v in parts.items()},
            "attempt": int(s.get("attempt", 1)),
            "job_start_epoch_ns": self.job_start_ns,
            "start_from": s.get("start_from"),
            "horizon_epoch_ns": self.horizon_ns,
            "restart_lost_seconds": s.get("restart_lost_seconds", 0.0),
            "previous_startup_trace_id": s.get("previous_startup_trace_id"),
            "startup_trace_id": self.startup_trace_id,
            "checkpoint_saves": self.checkpoint_saves,
            "steps_since_save_seconds": round(self.steps_since_save_ns / 1e9, 6),
        }


class GoodputCollector:
    """Prometheus: ``otel_train_goodput_ratio`` and ``otel_train_job_seconds_total``."""

    def __init__(self, proc: GoodputSpanProcessor, rank: Any) -> None:
        self._proc = proc
        self._rank = str(rank)

    def collect(self) -> Iterator[Metric]:
        """Two families, read under the chain's lock."""
        proc = self._proc
        with proc._lock:
            parts = proc.parts_seconds()
            ratio = proc.goodput_ratio()
        parts_fam = CounterMetricFamily(
            A.METRIC_JOB_SECONDS, "The job's wall time so far by part (startup, steps, "
            "checkpoint, evaluation, restart_lost, other), every attempt.",
            labels=["part", "rank"])
        for part in A.JOB_PARTS:
            parts_fam.add_metric([part, self._rank], parts[part])
        yield parts_fam
        # The family even before a value: the OTLP mirror makes its instruments from the
        # families it finds at start (otlp_metrics.py).
        fam = GaugeMetricFamily(A.METRIC_GOODPUT, "Time in training steps / the job's wall "
                                "time so far, every attempt.", labels=["rank"])
        if ratio is not None:
            fam.add_metric([self._rank], ratio)
        yield fam


def envelope_line(env: dict[str, Any]) -> str:
    """One line: goodput, and where the rest of the job's time went."""
    ratio = env.get("goodput_ratio")
    if ratio is None:
        return "job: no step yet"
    parts = env.get("parts_seconds") or {}
    shown = ", ".join(f"{p} {float(parts.get(p, 0.0)):.1f}s" for p in A.JOB_PARTS
                      if parts.get(p))
    attempt = int(env.get("attempt") or 1)
    again = f", attempt {attempt}" if attempt > 1 else ""
    return (f"goodput {ratio * 100:.1f}% of the job's {float(env['job_seconds']):.1f}s"
            f"{again} ({shown})")


def now_epoch_ns_of(perf_ns: int) -> int:
    """A ``perf_counter_ns`` stamp as epoch nanoseconds."""
    return time.time_ns() - time.perf_counter_ns() + perf_ns
