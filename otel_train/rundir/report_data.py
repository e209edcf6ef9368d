"""What the report shows, read from a run directory in bounded time and memory.

One streaming pass over the span files (every rank, oldest file first) folds each step into
step-index buckets whose width doubles whenever there are more than ``max_buckets`` of them,
so a run of 1M steps costs the same memory as one of 2,000. Beside the buckets it keeps, with
fixed bounds: the first ``warmup_steps`` steps of each rank, the ``max_slow_steps`` slowest
steps (with their phases), and where each line of each file starts and ends in step indices.
It also keeps the few steps the timeline may show (the first, the slowest, the slowest eval
step, the slowest step without monitoring) and a fixed-size sample of step times whose median
is the typical step. A second, targeted pass reads only the lines holding the steps chosen
for the timeline (``report_steps.py``), to show those steps on every rank. A run in progress reads as far as its files go (a
half-written last line is skipped).

Usage::

    data = load_run(Path("otel-train-runs/<run id>"))
    data.buckets, data.slow_steps, data.timeline_steps, data.timeline_labels, data.costs
"""

from __future__ import annotations

import bisect
import heapq
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from otel_train.rundir.report_throughput import add_throughput
from otel_train.rundir.report_steps import StepRecord, TimelinePicks, choose_timeline
from otel_train.rundir.span_files import (
    _iter_lines,
    attribute_pattern,
    iter_line_span_fields,
    span_files,
)

__all__ = ["Bucket", "RunData", "RunReader", "StepRecord", "load_run"]

_STEP_SPAN = "train.step"
_SUMMARY_SPAN = "train.summary"
_MAX_TRUNCATED = 100  # steps cut off listed (a run ends once per rank: a handful)
# Only what the report uses: each attribute found costs time on a 1M-step run.
_REPORT_ATTRS = attribute_pattern([
    "train.step", "train.rank", "train.phase.kind", "train.dataloader", "train.slow",
    "train.gpu.utilization_ratio", "train.gpu.memory_used_bytes", "train.truncated.reason",
    "train.tokens", "train.samples", "train.mfu", "train.device.timing",
    "train.device.busy_seconds", "train.device.duration_seconds"])


@dataclass
class Bucket:
    """Steps ``first .. first + width - 1`` folded together (sums over steps and ranks)."""

    first: int
    width: int
    steps: int = 0
    seconds: float = 0.0
    max_seconds: float = 0.0
    phase_seconds: dict[tuple[str, str], float] = field(default_factory=dict)
    monitor_seconds: float = 0.0  # inside steps and between them
    between_seconds: float = 0.0  # monitoring between steps (run.monitor)
    gpu_util_sum: float = 0.0
    gpu_util_n: int = 0
    gpu_mem_max: float = 0.0
    # Throughput (report_throughput.py): sums over the steps that were counted.
    tokens: float = 0.0
    samples: float = 0.0
    counted_seconds: float = 0.0
    mfu_sum: float = 0.0
    mfu_n: int = 0

    def merge(self, other: Bucket) -> None:
        """Fold ``other`` (the next bucket) into this one."""
        self.steps += other.steps
        self.seconds += other.seconds
        self.max_seconds = max(self.max_seconds, other.max_seconds)
        for k, v in other.phase_seconds.items():
            self.phase_seconds[k] = self.phase_seconds.get(k, 0.0) + v
        self.monitor_seconds += other.monitor_seconds
        self.between_seconds += other.between_seconds
        self.gpu_util_sum += other.gpu_util_sum
        self.gpu_util_n += other.gpu_util_n
        self.gpu_mem_max = max(self.gpu_mem_max, other.gpu_mem_max)
        self.tokens += other.tokens
        self.samples += other.samples
        self.counted_seconds += other.counted_seconds
        self.mfu_sum += other.mfu_sum
        self.mfu_n += other.mfu_n


@dataclass
class RunData:
    """Everything the report draws."""

    run_dir: Path
    run_id: str | None = None
    ranks: set[int] = field(default_factory=set)
    steps_per_rank: dict[int, int] = field(default_factory=dict)
    index_range: dict[int, tuple[int, int]] = field(default_factory=dict)
    spans: int = 0
    bucket_width: int = 1
    buckets: dict[int, Bucket] = field(default_factory=dict)
    warmup: dict[int, list[StepRecord]] = field(default_factory=dict)
    slow_steps: list[StepRecord] = field(default_factory=list)
    slow_flagged: int = 0
    # Step index -> every rank's record, in step order; and why each step is shown.
    timeline_steps: dict[int, list[StepRecord]] = field(default_factory=dict)
    timeline_labels: dict[int, list[str]] = field(default_factory=dict)
    warmup_step_count: int = 0  # warm-up steps, from the costs file (0: unknown or none)
    typical_seconds: float | None = None  # the median steady step without monitoring
    costs: list[dict[str, Any]] = field(default_factory=list)
    removed: list[dict[str, Any]] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    torn_lines: int = 0
    truncated: list[tuple[int, int, str]] = field(default_factory=list)  # rank, step, reason
    summary_spans: int = 0  # train.summary spans (span_mode="summary"): rundir/summaries.py
    # Spans by train.device.timing (sync, events, host), and per (phase, kind) of the spans
    # that carry device time from events: [spans, host seconds, device seconds]
    # (report_device.py).
    device_timing: dict[str, int] = field(default_factory=dict)
    device_phases: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    # Set when reading stopped at the time limit: the page says how far it got.
    stopped_early: str | None = None

    def missing_steps(self) -> dict[int, int]:
        """Per rank: step indices between its first and last step that no span file holds."""
        return {r: (hi - lo + 1) - self.steps_per_rank.get(r, 0)
                for r, (lo, hi) in self.index_range.items()}


class _Pending:
    """Spans of steps whose root has not been read yet (children come first)."""

    __slots__ = ("phases", "monitor")

    def __init__(self) -> None:
        self.phases: list[tuple[str, str, int, int, str, str]] = []
        self.monitor = 0


class RunReader:
    """Folds spans into a :class:`RunData`, within fixed bounds."""

    def __init__(self, data: RunData, max_buckets: int = 2000, warmup_steps: int = 50,
                 max_slow_steps: int = 30, max_pending: int = 20000,
                 deadline: float | None = None) -> None:
        self.data = data
        self.deadline = deadline  # time.monotonic() after which reading stops
        self.max_buckets = max_buckets
        self.warmup_steps = warmup_steps
        self.max_slow = max_slow_steps
        self.max_pending = max_pending
        self._pending: dict[tuple[int, int], _Pending] = {}
        self._slow_heap: list[tuple[float, int, int, StepRecord]] = []
        # Per file: line number -> (min step, max step), for the targeted second pass.
        self.line_ranges: dict[Path, list[tuple[int, int, int]]] = {}
        self.picks = TimelinePicks(skip_steps=max(1, data.warmup_step_count))

    # -- pass 1 ---------------------------------------------------------------------------
    def read_file(self, path: Path) -> None:
        """Fold every complete line of one span file."""
        ranges = self.line_ranges.setdefault(path, [])
        for n, line in enumerate(_iter_lines(path)):
            if self.deadline is not None and time.monotonic() > self.deadline:
                self.data.stopped_early = f"{path.name}, line {n + 1}"
                return
            if not line.strip():
                continue
            try:
                lo, hi = self._fold_line(line)
            except ValueError:
                self.data.torn_lines += 1
                continue
            if lo <= hi:
                ranges.append((n, lo, hi))
        # Pending steps stay: a step's children may end one file and its root begin the next.

    def _fold_line(self, line: bytes) -> tuple[int, int]:
        lo, hi = 1 << 62, -1
        data = self.data
        # The whole line first: a torn one raises before anything is folded.
        fields = list(iter_line_span_fields(line, _REPORT_ATTRS))
        for span_id, parent_id, name, start, end, a in fields:
            data.spans += 1
            step = a.get("train.step")
            if step is None:
                data.summary_spans += name == _SUMMARY_SPAN and not parent_id
                continue
            step = int(step)
            lo, hi = min(lo, step), max(hi, step)
            self._fold_span(span_id, parent_id, name, start, end, a, step)
        return lo, hi

    def _fold_span(self, span_id: str, parent_id: str, name: str, start: int, end: int,
                   a: dict[str, Any], step: int) -> None:
        rank = int(a.get("train.rank", 0))
        kind = a.get("train.phase.kind", "train")
        if kind == "envelope":  # train.startup and its children: "Where the job's time went"
            return
        if name == _STEP_SPAN and not parent_id:
            self._finish_step(rank, step, start, end, a)
            return
        if not parent_id:
            # Monitoring between steps (run.monitor): its own root, after step ``step``.
            self._add_bucket(step, None, {(name, "monitor"): (end - start) / 1e9}, 0, a)
            return
        key = (rank, step)
        pending = self._pending.get(key)
        if pending is None:
            if len(self._pending) >= self.max_pending:
                self._pending.pop(next(iter(self._pending)))
            pending = self._pending[key] = _Pending()
        label = name
        if name == "data" and a.get("train.dataloader"):
            label = f"data[{a['train.dataloader']}]"
        pending.phases.append((label, kind, start, end, parent_id, span_id))
        timing = a.get("train.device.timing")
        if timing is not None:
            self._fold_device(label, kind, str(timing), end - start, a)

    def _fold_device(self, label: str, kind: str, timing: str, host_ns: int,
                     a: dict[str, Any]) -> None:
        """A phase's timing, and its device time where events measured it (sampled steps)."""
        data = self.data
        data.device_timing[timing] = data.device_timing.get(timing, 0) + 1
        device = a.get("train.device.busy_seconds", a.get("train.device.duration_seconds"))
        if device is None:
            return
        acc = data.device_phases.setdefault((label, kind), [0, 0.0, 0.0])
        acc[0] += 1
        acc[1] += host_ns / 1e9
        acc[2] += float(device)

    def _finish_step(self, rank: int, step: int, start: int, end: int,
                     a: dict[str, Any]) -> None:
        data = self.data
        data.ranks.add(rank)
        data.steps_per_rank[rank] = data.steps_per_rank.get(rank, 0) + 1
        lo_hi = data.index_range.get(rank)
        data.index_range[rank] = (step, step) if lo_hi is None else (
            min(lo_hi[0], step), max(lo_hi[1], step))
        pending = self._pending.pop((rank, step), None)
        phases = pending.phases if pending is not None else []
        ids = {p[5] for p in phases}
        rec = StepRecord(rank, step, start, end, bool(a.get("train.slow")),
                         [(p[0], p[1], p[2], p[3], p[4] not in ids) for p in phases])
        if rec.slow:
            data.slow_flagged += 1
        cut = a.get("train.truncated.reason")
        if cut is not None and len(data.truncated) < _MAX_TRUNCATED:
            data.truncated.append((rank, step, str(cut)))
        per_phase: dict[tuple[str, str], float] = {}
        monitor = 0.0
        for label, kind, s, e, top in rec.phases:
            if top:
                per_phase[(label, kind)] = per_phase.get((label, kind), 0.0) + (e - s) / 1e9
                if kind == "monitor":
                    monitor += (e - s) / 1e9
        self._add_bucket(step, rec, per_phase, monitor, a)
        self.picks.offer(rec, monitor > 0)
        warm = data.warmup.setdefault(rank, [])
        if len(warm) < self.warmup_steps:
            warm.append(rec)
        heap = self._slow_heap
        item = (rec.seconds, -step, rank, rec)
        if len(heap) < self.max_slow:
            heapq.heappush(heap, item)
        elif item[:3] > heap[0][:3]:
            heapq.heapreplace(heap, item)

    def _add_bucket(self, step: int, rec: StepRecord | None,
                    per_phase: dict[tuple[str, str], float], monitor: float,
                    a: dict[str, Any]) -> None:
        data = self.data
        width = data.bucket_width
        b = data.buckets.get(step // width)
        if b is None:
            b = data.buckets[step // width] = Bucket((step // width) * width, width)
        for k, v in per_phase.items():
            b.phase_seconds[k] = b.phase_seconds.get(k, 0.0) + v
        if rec is None:  # between-step monitoring: time outside any step
            b.monitor_seconds += sum(per_phase.values())
            b.between_seconds += sum(per_phase.values())
        else:
            b.steps += 1
            b.seconds += rec.seconds
            b.max_seconds = max(b.max_seconds, rec.seconds)
            b.monitor_seconds += monitor
            util = a.get("train.gpu.utilization_ratio")
            if util is not None:
                b.gpu_util_sum += float(util)
                b.gpu_util_n += 1
            mem = a.get("train.gpu.memory_used_bytes")
            if mem is not None:
                b.gpu_mem_max = max(b.gpu_mem_max, float(mem))
            add_throughput(b, rec.seconds, a)
        if len(data.buckets) > self.max_buckets:
            self._coarsen()

    def _coarsen(self) -> None:
        """Double the bucket width: memory stays bounded however long the run."""
        data = self.data
        data.bucket_width *= 2
        merged: dict[int, Bucket] = {}
        for key in sorted(data.buckets):
            b = data.buckets[key]
            nk = b.first // data.bucket_width
            target = merged.get(nk)
            if target is None:
                b.first, b.width = nk * data.bucket_width, data.bucket_width
                merged[nk] = b
            else:
                target.merge(b)
        data.buckets = merged

    # -- pass 2 ---------------------------------------------------------------------------
    def read_steps(self, steps: set[int]) -> dict[int, list[StepRecord]]:
        """Every rank's record of each of ``steps``, reading only the lines that hold them."""
        wanted = sorted(steps)
        found: dict[tuple[int, int], StepRecord] = {}
        sub = RunReader(RunData(self.data.run_dir), max_buckets=1 << 30, warmup_steps=0,
                        max_slow_steps=0)
        for path, ranges in self.line_ranges.items():
            lines = {n for n, lo, hi in ranges
                     if bisect.bisect_left(wanted, lo) < bisect.bisect_right(wanted, hi)}
            if not lines:
                continue
            for n, line in enumerate(_iter_lines(path)):
                if n in lines:
                    try:
                        sub._fold_line_keep(line, steps, found)
                    except ValueError:
                        continue
        out: dict[int, list[StepRecord]] = {}
        for (rank, step), rec in sorted(found.items()):
            out.setdefault(step, []).append(rec)
        return out

    def _fold_line_keep(self, line: bytes, steps: set[int],
                        found: dict[tuple[int, int], StepRecord]) -> None:
        for span_id, parent_id, name, start, end, a in list(
                iter_line_span_fields(line, _REPORT_ATTRS)):
            step = a.get("train.step")
            if step is None or int(step) not in steps:
                continue
            step = int(step)
            if name == _STEP_SPAN and not parent_id:
                rank = int(a.get("train.rank", 0))
                pending = self._pending.pop((rank, step), None)
                phases = pending.phases if pending is not None else []
                ids = {p[5] for p in phases}
                found[(rank, step)] = StepRecord(
                    rank, step, start, end, bool(a.get("train.slow")),
                    [(p[0], p[1], p[2], p[3], p[4] not in ids) for p in phases])
            elif parent_id:
                self._fold_span(span_id, parent_id, name, start, end, a, step)

    def slowest(self) -> list[StepRecord]:
        """The slowest steps kept, slowest first."""
        return [item[3] for item in sorted(self._slow_heap, reverse=True)]


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # being replaced right now, or not there: the report says so


def load_run(run_dir: str | Path, max_buckets: int = 2000, warmup_steps: int = 50,
             time_limit_seconds: float | None = None,
             costs: list[dict[str, Any]] | None = None) -> RunData:
    """Read a run directory (finished or in progress) into a :class:`RunData`; with a time
    limit, stop reading span files when it is reached (``stopped_early`` says where);
    ``costs`` given are used instead of the run's costs files."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} is not a run directory")
    data = RunData(run_dir)
    # The costs first: their warm-up count keeps warm-up steps out of the timeline's picks.
    _add_costs(data, run_dir, costs)
    deadline = None if time_limit_seconds is None else time.monotonic() + time_limit_seconds
    reader = RunReader(data, max_buckets=max_buckets, warmup_steps=warmup_steps,
                       deadline=deadline)
    data.files = span_files(run_dir)
    for path in data.files:
        reader.read_file(path)
        if data.stopped_early:
            break
    data.slow_steps = reader.slowest()
    for p in sorted(run_dir.glob("spans*.removed.json")):
        removed = _read_json(p)
        if removed is not None:
            removed["_file"] = p.name
            data.removed.append(removed)
    typical = reader.picks.typical()
    data.typical_seconds = typical[1] if typical is not None else None
    chosen = choose_timeline(reader.picks, data.slow_steps, data.warmup_step_count)
    if chosen:
        found = reader.read_steps({step for step, _ in chosen})
        data.timeline_steps = {s: found[s] for s, _ in chosen if s in found}
        data.timeline_labels = {s: labels for s, labels in chosen if s in found}
    if data.run_id is None:
        m = re.search(r"[^/]+$", str(run_dir.resolve()))
        data.run_id = m.group(0) if m else None
    return data


def _add_costs(data: RunData, run_dir: Path, given: list[dict[str, Any]] | None) -> None:
    """The costs given, else each costs file of the run; the run id from the first."""
    if given is not None:
        found = [dict(c, _file="monitoring costs as the report was written") for c in given]
    else:
        found = []
        for p in sorted(run_dir.glob("monitoring_costs*.json")):
            costs = _read_json(p)
            if costs is not None:
                found.append(dict(costs, _file=p.name))
    for costs in found:
        data.costs.append(costs)
        data.run_id = data.run_id or costs.get("run_id")
    if found:
        data.warmup_step_count = int((found[0].get("warmup") or {}).get("steps") or 0)
