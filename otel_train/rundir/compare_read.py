"""A run's steps read back for ``otel-train compare``: per step of each rank, its time, its
top-level phases, its monitoring, and the few root attributes that set it apart.

One pass over the span files of every rank (``span_files.py``'s fast path for our own lines).
A step's phases end before its root, so they wait in a bounded table keyed by (rank, step)
until the root arrives; a phase is top-level when its parent is the root. Monitoring done
between steps (``run.monitor``: a root span of its own, named after the operation) is kept
per (rank, step it followed). ``train.summary`` spans (summary mode: one span per interval
instead of per-step spans) are counted and their attributes kept, so a run that holds only
summaries can say so.

Usage::

    run = read_run_steps(Path("otel-train-runs/a"))
    run.steps[0].seconds, run.steps[0].phases["forward"], run.warmup_steps(0)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_train.common.options import DEFAULT_WARMUP_STEPS
from otel_train.rundir.span_files import (
    _iter_lines,
    attribute_pattern,
    attributes_dict,
    iter_line_span_fields,
    span_fields,
    span_files,
)

STEP_SPAN = "train.step"
SUMMARY_SPAN = "train.summary"
# The option's default (DEFAULT_WARMUP_STEPS): a run without a costs file is read with the
# warm-up it most likely had.
_MAX_PENDING = 20000  # steps whose root has not arrived (a step's spans share one drain)
_MAX_SUMMARIES = 100000
_ATTRS = attribute_pattern([
    "train.step", "train.rank", "train.phase.kind", "train.truncated", "train.tokens",
    "train.samples", "train.flops.counted", "train.sample.reason"])
# Why a sampled run kept a step (train.sample.reason): these keep an unbiased share of the
# steps; any other reason (slow, error, and the stall and truncated a rank left out of export
# or a summary-mode run sends) keeps a step *because* it was unusual.
_UNBIASED_KEPT = (None, "ratio", "first", "monitor")
_SUMMARY_MARK = b'"' + SUMMARY_SPAN.encode() + b'"'  # in any JSON spacing


@dataclass
class StepTimes:
    """One step of one rank."""

    rank: int
    step: int
    start_ns: int
    seconds: float  # the root span: the step's wall time, its monitoring included
    monitor_seconds: float = 0.0  # top-level monitoring phases inside the step
    phases: dict[str, float] = field(default_factory=dict)  # top-level, seconds by name
    tokens: float | None = None
    samples: float | None = None
    cut: bool = False  # cut off at the end of the run, or failed (ERROR)
    flops_counted: bool = False  # the step ran under the FLOP counter (slower by design)
    kept_as_unusual: bool = False  # a sampled run kept it for being slow, failed, stalled...

    @property
    def training_seconds(self) -> float:
        """The step's time without its monitoring."""
        return max(0.0, self.seconds - self.monitor_seconds)


@dataclass
class RunSteps:
    """Every step of a run directory (all ranks), and what else its span files hold."""

    run_dir: Path
    steps: list[StepTimes] = field(default_factory=list)
    # (rank, step) -> seconds of monitoring done between steps, after that step
    between_seconds: dict[tuple[int, int], float] = field(default_factory=dict)
    summaries: list[dict[str, Any]] = field(default_factory=list)  # train.summary attributes
    costs: list[dict[str, Any]] = field(default_factory=list)  # monitoring_costs*.json
    files: list[Path] = field(default_factory=list)

    def ranks(self) -> list[int]:
        """The ranks that recorded steps."""
        return sorted({s.rank for s in self.steps})

    def warmup_steps(self, rank: int) -> int:
        """The warm-up steps of ``rank``: what its costs file counted, else the default."""
        for costs in self.costs:
            if costs.get("rank") in (rank, str(rank)) or (
                    costs.get("rank") is None and len(self.costs) == 1):
                warm = (costs.get("warmup") or {}).get("steps")
                if isinstance(warm, int):
                    return warm
        return DEFAULT_WARMUP_STEPS


class _StepFolder:
    """Folds spans into steps: phases wait for their root."""

    def __init__(self, run: RunSteps) -> None:
        self.run = run
        # (rank, step) -> [(name, kind, seconds, parent id)]
        self.pending: dict[tuple[int, int], list[tuple[str, str, float, str]]] = {}

    def fold(self, span_id: str, parent_id: str, name: str, start: int, end: int,
             a: dict[str, Any]) -> None:
        """One span of the run."""
        step = a.get("train.step")
        if step is None:
            return
        key = (int(a.get("train.rank", 0)), int(step))
        seconds = (end - start) / 1e9
        if not parent_id:
            if name == STEP_SPAN:
                self._finish(key, span_id, start, seconds, a)
            elif a.get("train.phase.kind") == "monitor":  # run.monitor between steps
                self.run.between_seconds[key] = self.run.between_seconds.get(key, 0.0) + seconds
            return
        kind = a.get("train.phase.kind")
        if kind is None:
            return  # not a phase (a profile span, a user's span under a phase)
        pending = self.pending.get(key)
        if pending is None:
            if len(self.pending) >= _MAX_PENDING:
                self.pending.pop(next(iter(self.pending)))
            pending = self.pending[key] = []
        pending.append((name, str(kind), seconds, parent_id))

    def _finish(self, key: tuple[int, int], span_id: str, start: int, seconds: float,
                a: dict[str, Any]) -> None:
        rec = StepTimes(key[0], key[1], start, seconds,
                        tokens=_number(a.get("train.tokens")),
                        samples=_number(a.get("train.samples")),
                        cut=bool(a.get("train.truncated") or a.get("error")),
                        flops_counted=bool(a.get("train.flops.counted")),
                        kept_as_unusual=a.get("train.sample.reason") not in _UNBIASED_KEPT)
        for name, kind, secs, parent in self.pending.pop(key, ()):
            if parent != span_id:
                continue  # nested in another phase: part of its parent's time
            rec.phases[name] = rec.phases.get(name, 0.0) + secs
            if kind == "monitor":
                rec.monitor_seconds += secs
        self.run.steps.append(rec)

    def fold_line(self, line: bytes) -> None:
        """Every span of one line (a line holding summaries is parsed in full)."""
        if _SUMMARY_MARK not in line:
            for fields in list(iter_line_span_fields(line, _ATTRS)):
                self.fold(*fields)
            return
        request = json.loads(line)
        for rs in request.get("resourceSpans", ()):
            for ss in rs.get("scopeSpans", ()):
                for span in ss.get("spans", ()):
                    if span.get("name") == SUMMARY_SPAN:
                        self._summary(span)
                    else:
                        self.fold(*span_fields(span))

    def _summary(self, span: dict[str, Any]) -> None:
        if len(self.run.summaries) < _MAX_SUMMARIES:
            self.run.summaries.append(attributes_dict(span.get("attributes")))


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _read_costs(run_dir: Path) -> list[dict[str, Any]]:
    found = []
    for p in sorted(run_dir.glob("monitoring_costs*.json")):
        try:
            found.append(json.loads(p.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue  # being replaced right now: the default warm-up stands in
    return found


def read_run_steps(run_dir: Path) -> RunSteps:
    """Every step of a run directory's span files (all ranks), and its costs files."""
    run = RunSteps(Path(run_dir), costs=_read_costs(Path(run_dir)))
    run.files = span_files(run_dir)
    folder = _StepFolder(run)
    for path in run.files:
        for line in _iter_lines(path):
            if not line.strip():
                continue
            try:
                folder.fold_line(line)
            except ValueError:
                continue  # a torn line: the writer was killed mid-write
    run.steps.sort(key=lambda s: (s.rank, s.step, s.start_ns))
    return run
