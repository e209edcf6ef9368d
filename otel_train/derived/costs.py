"""What monitoring cost: ``run.costs()``, ``monitoring_costs.json``, and its table.

The report (schema ``otel-train/monitoring-costs/v1``) speaks the language of hand-made cost trackers (so ``jq`` one-liners written for them work):
``total_percentage`` (monitoring over training time, monitoring excluded from training, in
percent, everything counted) and ``budget_status`` at the top, and per operation under
``operations.<name>``: ``calls``, ``total_time``, ``mean_time``, ``max_time`` (seconds),
``percentage`` (of training time) and ``first_seconds`` (the first call, often warm-up).
``verdict_evidence`` says what a verdict still waits for (the console's minimum-evidence
rule, ``BudgetSpanProcessor.evidence_gap``), null once it has enough; the table then says
no status, only the figures so far.
Beside them: the same figures as ratios 0..1 (``total_share``, ``share``), the steady-state
figure the budget status and the advisor use (``steady_share``: first calls and warm-up
steps replaced by their steady figures), the recent window, the share of wall time, the
warm-up steps, and the advisor's projections. otel-train's own cost is under ``own_cost``
(``SelfCostMeter.figures``: per step in µs, its share of the loop's time, start-up apart),
its share also as ``instrumentation_overhead_ratio``.

``run.costs()`` returns a ``CostsReport``: a dict (the JSON content) whose ``str()`` is the
table ``otel-train costs`` prints, so ``print(run.costs())`` reads like the command.

The file is written atomically (a temporary file, then ``os.replace``) from a background
thread every ``interval_seconds`` and at shutdown, never on the training thread.
``otel-train costs PATH`` prints it as a table (``rundir/costs.py``), replacing the jq
commands.

Usage::

    data = build_costs(overhead.snapshot(), budget, slow_steps=3, run_id="r1")
    write_json_atomic(Path("status/monitoring_costs.json"), data)
    print(data)                                 # the table
    data["operations"]["inference"]["percentage"]
"""

from __future__ import annotations

from functools import partial
import logging
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from otel_train.common.units import COSTS_TABLE, duration, percent
from otel_train.derived.budget import BudgetVerdict, VerdictContext, advise, budget_status
from otel_train.derived.goodput import envelope_line
from otel_train.derived.governor import governing_lines
from otel_train.derived.overhead import OverheadSnapshot
from otel_train.common.files import write_json_atomic
from otel_train.common.rate_limited_log import RateLimitedLogger

_log = logging.getLogger("otel_train")
SCHEMA = "otel-train/monitoring-costs/v1"


class CostsReport(dict[str, Any]):
    """The costs report: a plain dict for code and JSON, the table when printed."""

    def __str__(self) -> str:
        return format_costs_table(self)


def build_costs(
    snapshot: OverheadSnapshot,
    budget: float,
    critical: float = 0.10,
    *,
    slow_steps: int = 0,
    slow_operations: dict[str, int] | None = None,
    run_id: str | None = None,
    governing: Mapping[str, Any] | None = None,
) -> CostsReport:
    """The report, JSON-ready; ``governing``: ``DueSchedule.describe()`` (step.due)."""
    in_force = None
    if governing and governing.get("governing"):
        in_force = {name: op["interval_steps"]
                    for name, op in (governing.get("operations") or {}).items()}
    report = CostsReport({
        "schema": SCHEMA,
        "run_id": run_id,
        "rank": snapshot.rank,
        "updated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "steps": snapshot.steps,
        "total_percentage": round(snapshot.cumulative_ratio * 100.0, 4),
        "budget_status": budget_status(snapshot.steady_ratio, budget, critical),
        "budget_status_from": "steady_share",
        "training_time_seconds": round(snapshot.training_seconds, 6),
        "monitoring_time_seconds": round(snapshot.monitoring_seconds, 6),
        "wall_time_seconds": round(snapshot.wall_seconds, 6),
        "total_share": snapshot.cumulative_ratio,
        "steady_share": snapshot.steady_ratio,
        "steady_percentage": round(snapshot.steady_ratio * 100.0, 4),
        "recent_share": snapshot.recent_ratio,
        "recent_steps": snapshot.recent_steps,
        "wall_share": snapshot.wall_share,
        "warmup": {
            "steps": snapshot.warmup_steps,
            "training_seconds": round(snapshot.warmup_training_seconds, 6),
            "steady_training_seconds_per_step": round(
                snapshot.steady_train_seconds_per_step, 6),
        },
        "budget": budget,
        "critical": critical,
        "instrumentation_overhead_ratio": snapshot.instrumentation_ratio,
        "slow_steps": slow_steps,
        "slow_operations": dict(slow_operations or {}),
        "operations": _operation_costs(snapshot),
        "advisor": [a.as_dict() for a in advise(snapshot, budget, in_force)],
    })
    if governing and governing.get("operations"):
        report["governing"] = dict(governing)
    return report


def _operation_costs(snapshot: OverheadSnapshot) -> dict[str, Any]:
    """Per operation, the costliest first: the hand-made trackers' fields and ours."""
    ops: dict[str, Any] = {}
    for name, op in sorted(snapshot.operations.items(), key=lambda kv: -kv[1].total_seconds):
        ops[name] = {
            # the hand-made trackers' names (seconds; percentage of training time)
            "calls": op.calls,
            "total_time": round(op.total_seconds, 6),
            "mean_time": round(op.mean_seconds, 6),
            "max_time": round(op.max_seconds, 6),
            "percentage": round(op.share * 100.0, 4),
            "first_seconds": round(op.first_seconds, 6),
            # the same in base units, and what the advisor uses
            "total_seconds": round(op.total_seconds, 6),
            "mean_seconds": round(op.mean_seconds, 6),
            "steady_mean_seconds": round(op.steady_mean_seconds, 6),
            "max_seconds": round(op.max_seconds, 6),
            "share": op.share,
            "first_step": op.first_step,
            "last_step": op.last_step,
        }
    return ops


def format_costs_table(data: Mapping[str, Any]) -> str:
    """A readable table of a costs report (``run.costs()`` or monitoring_costs.json)."""
    head = (f"run {data.get('run_id') or '?'} rank {data.get('rank', '?')}: "
            f"{data.get('steps', 0)} steps, {_secs(data.get('training_time_seconds'))} "
            f"training time, updated {data.get('updated_at', '?')}")
    lines = [head, "monitoring " + verdict_text(data)]
    warm = data.get("warmup") or {}
    if warm.get("steps"):
        lines.append(f"warm-up: first {warm['steps']} steps, "
                     f"{_secs(warm.get('training_seconds'))} of training (steady state "
                     f"{_secs(warm.get('steady_training_seconds_per_step'))} per step)")
    lines.append("")
    ops = data.get("operations") or {}
    cols = ("operation", "calls", "total", "first", "mean", "max", "share")
    rows = [cols]
    for name, op in ops.items():
        rows.append((str(name), str(op.get("calls", 0)), _secs(op.get("total_seconds")),
                     _secs(op.get("first_seconds")), _secs(op.get("mean_seconds")),
                     _secs(op.get("max_seconds")), _share(op.get("share"))))
    rows.append(("TOTAL", str(sum(int(o.get("calls", 0)) for o in ops.values())),
                 _secs(data.get("monitoring_time_seconds")), "", "", "",
                 _share(data.get("total_share"))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    for n, line in enumerate(rows):
        cells = [line[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(line[1:], widths[1:])]
        lines.append("  ".join(cells).rstrip())
        if n == 0 or n == len(rows) - 2:
            lines.append("  ".join("-" * w for w in widths))
    if not ops:
        lines.append("(no monitoring operation recorded)")
    advice = data.get("advisor") or []
    if advice:
        lines += ["", "advisor (steady state: first calls and warm-up steps left out):"]
        lines += [f"  {'ok ' if a.get('within_budget') else '!! '}{a.get('advice', '')}"
                  for a in advice]
    lines += governing_lines(data.get("governing"))
    slow = data.get("slow_operations") or {}
    if slow:
        lines += ["", "calls over slow_operation_seconds: "
                  + ", ".join(f"{k} x{v}" for k, v in slow.items())]
    if data.get("slow_steps"):
        lines.append(f"slow steps: {data['slow_steps']}")
    if data.get("envelope"):
        lines += ["", "job: " + envelope_line(data["envelope"])]
    own_line = own_cost_line(data)
    if own_line:
        lines += ["", own_line]
    return "\n".join(lines)


def add_own_cost(data: dict[str, Any], figures: Mapping[str, Any]) -> None:
    """otel-train's own cost (``SelfCostMeter.figures``) into a costs report: ``own_cost``,
    and ``instrumentation_overhead_ratio`` = its share of the loop's wall time (whole run,
    start-up apart)."""
    data["own_cost"] = dict(figures)
    data["instrumentation_overhead_ratio"] = figures.get("share_of_step_time")


def own_cost_line(data: Mapping[str, Any]) -> str:
    """The summary line of otel-train's own cost ('' when the report has none)."""
    own = data.get("own_cost")
    if not own:
        return ""
    if not own.get("steps"):
        return "otel-train's own cost: no step drained yet"

    def us(key: str) -> str:
        v = own.get(key)
        return "-" if v is None else f"{v:.0f} us"

    share = own.get("share_of_step_time")
    head = (f"otel-train's own cost: {_share(share)} of the training loop's time "
            f"({us('lost_us_per_step')} per step of {us('step_wall_us')}: hot path "
            f"{us('hot_path_us_per_step')}, ")
    if own.get("batch_counting_us_per_step") is not None:
        head += f"counting batches {us('batch_counting_us_per_step')}, "
    if own.get("wait_unavailable"):
        head += f"wait on its threads not measured: {own['wait_unavailable']})"
    else:
        slower = [own.get(k) for k in ("shared_interpreter_us_per_step",
                                        "cpu_interference_us_per_step")]
        slower_us = sum(v for v in slower if v is not None)
        head += (f"waiting for its threads {us('wait_us_per_step')}, "
                 f"computing slower beside them {slower_us:.0f} us)")
    beside = f"; beside it, CPU per step: {us('background_cpu_us_per_step')} in this process"
    if own.get("exporter_process_cpu_us_per_step") is not None:
        beside += f", {us('exporter_process_cpu_us_per_step')} in the exporter process"
    start = own.get("startup") or {}
    parts = []
    if start.get("start_run_seconds") is not None:
        parts.append(f"start_run {_secs(start['start_run_seconds'])}")
    if start.get("exporter_process_cpu_seconds"):
        parts.append(f"exporter process {_secs(start['exporter_process_cpu_seconds'])} CPU")
    tail = f"; start-up apart: {', '.join(parts)}" if parts else ""
    return head + beside + tail + _device_work_text(own.get("device_work"))


def _device_work_text(device: Mapping[str, Any] | None) -> str:
    """What of the device work the own cost includes and leaves out ('' on CPU)."""
    if not device:
        return ""
    def us(key: str) -> str:
        v = device.get(key)
        return "-" if v is None else f"{v:.0f} us"

    return (f"; device work included: sync waits {us('sync_wait_us_per_step')}, events and "
            f"allocator reads {us('events_and_peaks_us_per_step')}, tensor copies "
            f"{us('tensor_copies_us_per_step')} per step; left out: monitoring syncs "
            f"({us('monitoring_sync_wait_us_per_step')} per step, training work queued before "
            "monitoring and its own kernels) and the device idle after each sync until the "
            "next launch")


def verdict_text(data: Mapping[str, Any]) -> str:
    """The verdict line of a costs report, as the console words it (``STATUS: X% ...``);
    while the run lacks the evidence for one (``verdict_evidence``, the console's rule), what
    it waits for and the figures so far, with no status."""
    verdict = costs_verdict(data)
    gap = data.get("verdict_evidence")
    if gap:
        total = "" if verdict.total is None else f", total {verdict.total:.2%}"
        return (f"verdict: {gap}; so far {verdict.steady:.2%} of training time in "
                f"{verdict.label}{total}")
    return verdict.describe(digits=2, context=VerdictContext.of_costs(data),
                            of_training_time=True)


def costs_verdict(data: Mapping[str, Any]) -> BudgetVerdict:
    """The budget verdict of a costs report: the steady state drives it (``budget_status``).

    A report without ``steady_share`` (written by an older otel-train) is judged on its
    total, and says so.
    """
    budget = float(data.get("budget") or 0.05)
    critical = float(data.get("critical") or 0.10)
    recent = data.get("recent_share")
    recent = None if recent is None else float(recent)
    total = float(data.get("total_share") or 0.0)
    if data.get("steady_share") is None:
        return BudgetVerdict(total, recent, None, budget, critical, label="total")
    return BudgetVerdict(float(data["steady_share"]), recent, total, budget, critical)


class CostsFileWriter:
    """Writes ``build()`` to ``path`` every ``interval_seconds`` and once at stop."""

    def __init__(self, path: Path, build: Callable[[], dict[str, Any]],
                 interval_seconds: float = 10.0) -> None:
        if not interval_seconds > 0:
            raise ValueError("interval_seconds must be > 0")
        self.path = path
        self._build = build
        self._interval = interval_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warn = RateLimitedLogger(_log)
        self.writes = 0
        self.failures = 0

    def write_now(self) -> bool:
        """Write once; False (logged, counted) on failure. Never raises."""
        try:
            write_json_atomic(self.path, self._build())
            self.writes += 1
            return True
        except Exception as exc:
            self.failures += 1
            self._warn.warning("costs-write", "otel-train: could not write %s: %r",
                               self.path, exc)
            return False

    def start(self) -> None:
        """Start the periodic writer thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="otel-train-costs",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.write_now()

    def stop(self, timeout_seconds: float = 1.0, final_write: bool = True) -> None:
        """Stop the thread (bounded) and write the final report."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(max(0.0, timeout_seconds))
        if final_write:
            self.write_now()


_secs = partial(duration, style=COSTS_TABLE)
_share = partial(percent, spec=".2f")
