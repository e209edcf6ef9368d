"""``otel-train compare RUN_A RUN_B``: is B slower than A, where, and how sure is that?

Both runs are read from their span files (``compare_read.py``). Only steady-state steps are
compared: each rank's first warm-up steps (the count its ``monitoring_costs*.json`` gives, the
same rule as the overhead and budget: the first ``warmup_steps`` steps of each rank), steps
that ran monitoring (an eval or a sample: their time is not the step's usual time), steps cut
off or failed, and the step measured under the FLOP counter are left out, and counted.

For the step (its span: ``step``), the time from one step's start to the next's (``wall per
step``: what happens between steps too, intervals holding ``run.monitor`` left out) and each
top-level phase: the median of each run, the ratio B / A and its bootstrap 95% interval
(``compare_stats.py``). A row is ``slower`` or ``faster`` when the interval is on one side of
1 and the change is at least ``min_change`` (2% by default: a large run makes a 0.3%
difference certain without making it matter), else ``within noise``. The verdict and
``--per-phase`` name a phase only when its median moved by at least ``phase_floor`` (1%) of
A's median step. Beside them: each
run's monitoring overhead (monitoring / training time, every step, as the costs file counts
it) and throughput (``train.tokens`` / ``train.samples`` over the steady steps' time) when
recorded. ``failures`` is what ``--fail-if-slower`` checks.

Usage::

    result = compare_runs(read_run_steps(a_dir), read_run_steps(b_dir), CompareSettings())
    result.verdict                 # 'B is 19.8% slower per step [95% CI 18.1, 21.4]; forward ...'
    failures(result, pct=10.0, per_phase=False)   # ['step: +19.8% [95% CI 18.1, 21.4] > 10%']
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from otel_train.common.units import COMPARE_DELTA, duration
from otel_train.rundir.compare_read import RunSteps, StepTimes
from otel_train.rundir.compare_stats import median, median_ratio_interval

STEP_ROW = "step"
WALL_ROW = "wall per step"
_EXCLUSIONS = ("warm-up", "with monitoring", "cut off or failed", "FLOP-counted",
               "kept by sampling as unusual")


class CompareError(ValueError):
    """The runs cannot be compared (no steps, no steps left, only summaries)."""


@dataclass(frozen=True)
class CompareSettings:
    """How to compare: which rank, the bootstrap, what counts as a change."""

    rank: int | None = None  # None: every rank pooled (and a line per rank)
    resamples: int = 2000
    seed: int = 0
    min_change: float = 0.02  # a ratio within 1 +- this is within noise, however sure
    # A phase whose median moved by less than this share of A's median step is named in
    # neither the verdict nor a --per-phase failure: a 2 us phase 15% slower is no finding.
    phase_floor: float = 0.01
    warmup_steps: int | None = None  # None: each rank's costs file, else the option default


@dataclass
class RunSide:
    """One run's steady steps and the figures beside them."""

    label: str
    path: str
    ranks: list[int]
    steps: int  # every step of the ranks compared
    steady: list[StepTimes]
    excluded: dict[str, int]
    wall_intervals: list[float]
    overhead_ratio: float | None
    tokens_per_second: float | None
    samples_per_second: float | None
    run_id: str | None = None

    @property
    def mean_step_seconds(self) -> float:
        """The steady steps' mean time: what throughput divides by, per step."""
        return sum(s.seconds for s in self.steady) / len(self.steady) if self.steady else 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the steps themselves left out)."""
        return {"path": self.path, "run_id": self.run_id, "ranks": self.ranks,
                "steps": self.steps, "steady_steps": len(self.steady),
                "excluded": self.excluded, "monitoring_overhead_ratio": self.overhead_ratio,
                "mean_step_seconds": self.mean_step_seconds,
                "tokens_per_second": self.tokens_per_second,
                "samples_per_second": self.samples_per_second}


@dataclass
class Row:
    """One compared figure: the medians, B / A and its interval, and what it says."""

    name: str
    a_median: float
    b_median: float
    a_n: int
    b_n: int
    ratio: float | None
    low: float | None
    high: float | None
    status: str  # 'slower', 'faster', 'within noise', 'no ratio'

    def change_text(self) -> str:
        """'+19.8% [95% CI 18.1, 21.4]' (or 'no ratio')."""
        if self.ratio is None or self.low is None or self.high is None:
            return "no ratio"
        return (f"{(self.ratio - 1) * 100:+.1f}% [95% CI {(self.low - 1) * 100:.1f}, "
                f"{(self.high - 1) * 100:.1f}]")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"name": self.name, "a_median_seconds": self.a_median,
                "b_median_seconds": self.b_median, "a_steps": self.a_n, "b_steps": self.b_n,
                "ratio": self.ratio, "ci95": [self.low, self.high], "status": self.status}


@dataclass
class Comparison:
    """Everything ``otel-train compare`` prints."""

    a: RunSide
    b: RunSide
    settings: CompareSettings
    step: Row
    wall: Row | None
    phases: list[Row]
    only_a: list[str]
    only_b: list[str]
    per_rank: list[tuple[int, Row]] = field(default_factory=list)
    verdict: str = ""
    # Why A and B are one run ('the same directory', 'the same run id x', 'identical
    # steps'), None when they are two: a run compared with itself says nothing.
    same_run: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: ``otel-train compare --format json``."""
        s = self.settings
        return {"a": self.a.as_dict(), "b": self.b.as_dict(),
                "rank": "all" if s.rank is None else s.rank,
                "bootstrap": {"resamples": s.resamples, "seed": s.seed, "confidence": 0.95},
                "min_change": s.min_change, "step": self.step.as_dict(),
                "wall_per_step": self.wall.as_dict() if self.wall else None,
                "phases": [r.as_dict() for r in self.phases],
                "phases_only_in_a": self.only_a, "phases_only_in_b": self.only_b,
                "per_rank": [dict(r.as_dict(), rank=rank) for rank, r in self.per_rank],
                "same_run": self.same_run, "throughput_note": throughput_note(self),
                "verdict": self.verdict}


def _steady(run: RunSteps, steps: list[StepTimes], warmup: int | None,
            ) -> tuple[list[StepTimes], dict[str, int]]:
    """The steady steps (``steps`` sorted by rank, step) and how many each rule left out."""
    excluded = dict.fromkeys(_EXCLUSIONS, 0)
    steady: list[StepTimes] = []
    first: dict[int, int] = {}
    for s in steps:
        # By step index from the rank's first: a sampled run's files lack steps, so the
        # steps read are not the steps the run counted.
        ordinal = s.step - first.setdefault(s.rank, s.step)
        limit = run.warmup_steps(s.rank) if warmup is None else warmup
        reason = ("warm-up" if ordinal < limit else "with monitoring" if s.monitor_seconds > 0
                  else "cut off or failed" if s.cut else "FLOP-counted" if s.flops_counted
                  else "kept by sampling as unusual" if s.kept_as_unusual else None)
        if reason is None:
            steady.append(s)
        else:
            excluded[reason] += 1
    return steady, excluded


def _wall_intervals(run: RunSteps, steps: list[StepTimes], steady: list[StepTimes],
                    ) -> list[float]:
    """Start of step k+1 minus start of step k, for each steady step k whose next step is
    there and with no monitoring between them."""
    start = {(s.rank, s.step): s.start_ns for s in steps}
    out = []
    for s in steady:
        nxt = start.get((s.rank, s.step + 1))
        if nxt is not None and nxt > s.start_ns and (s.rank, s.step) not in run.between_seconds:
            out.append((nxt - s.start_ns) / 1e9)
    return out


def _rate(steady: list[StepTimes], attr: str) -> float | None:
    counted = [s for s in steady if getattr(s, attr) is not None]
    seconds = sum(s.seconds for s in counted)
    return sum(getattr(s, attr) for s in counted) / seconds if counted and seconds > 0 else None


def run_side(label: str, run: RunSteps, settings: CompareSettings) -> RunSide:
    """One run's side of the comparison; CompareError when nothing is left to compare."""
    steps = [s for s in run.steps if settings.rank is None or s.rank == settings.rank]
    if not steps:
        raise CompareError(_no_steps(label, run, settings.rank))
    steady, excluded = _steady(run, steps, settings.warmup_steps)
    if not steady:
        raise CompareError(f"run {label} ({run.run_dir}): none of its {len(steps)} steps is "
                           f"steady ({_excluded_text(excluded)})")
    ranks = sorted({s.rank for s in steps})
    monitor = sum(s.monitor_seconds for s in steps) + sum(
        v for (r, _), v in run.between_seconds.items() if r in ranks)
    training = sum(s.training_seconds for s in steps)
    return RunSide(label, str(run.run_dir), ranks, len(steps), steady, excluded,
                   _wall_intervals(run, steps, steady),
                   monitor / training if training > 0 else None,
                   _rate(steady, "tokens"), _rate(steady, "samples"), _run_id(run))


def _run_id(run: RunSteps) -> str | None:
    """The run id its costs files name (the same in every rank's)."""
    for costs in run.costs:
        if isinstance(costs.get("run_id"), str) and costs["run_id"]:
            return str(costs["run_id"])
    return None


def same_run(run_a: RunSteps, run_b: RunSteps) -> str | None:
    """Why A and B are one run, or None: the same directory, the same run id, or the very
    same steps (a copy of one run's directory)."""
    try:
        if run_a.run_dir.resolve() == run_b.run_dir.resolve():
            return "the same directory"
    except OSError:
        pass
    id_a, id_b = _run_id(run_a), _run_id(run_b)
    if id_a is not None and id_a == id_b:
        return f"the same run id {id_a}"
    key = [(s.rank, s.step, s.start_ns, s.seconds) for s in run_a.steps]
    if key and key == [(s.rank, s.step, s.start_ns, s.seconds) for s in run_b.steps]:
        return "identical steps: one run's spans in both"
    return None


def _no_steps(label: str, run: RunSteps, rank: int | None) -> str:
    where = f"run {label} ({run.run_dir})"
    if rank is not None and run.steps:
        return f"{where} has no steps of rank {rank} (its ranks: {run.ranks()})"
    if run.summaries:
        return (f"{where} holds only train.summary spans ({len(run.summaries)}; summary "
                "mode): there are no per-step times to compare; run it with per-step spans "
                "to compare it")
    return f"{where}: its span files hold no train.step span"


def _excluded_text(excluded: dict[str, int]) -> str:
    parts = [f"{n} {why}" for why, n in excluded.items() if n]
    return ", ".join(parts) if parts else "none left out"


def compare_values(name: str, a: list[float], b: list[float], settings: CompareSettings,
                   rng: random.Random) -> Row:
    """One row: medians, ratio and its bootstrap interval, and its status."""
    a_sorted, b_sorted = sorted(a), sorted(b)
    ma, mb = median(a_sorted), median(b_sorted)
    ratio = mb / ma if ma > 0 else None
    interval = (median_ratio_interval(a_sorted, b_sorted, settings.resamples, rng)
                if ratio is not None else None)
    low, high = interval if interval is not None else (None, None)
    status = "no ratio"
    if ratio is not None and low is not None and high is not None:
        status = "within noise"
        if low > 1.0 and ratio - 1.0 >= settings.min_change:
            status = "slower"
        elif high < 1.0 and 1.0 - ratio >= settings.min_change:
            status = "faster"
    return Row(name, ma, mb, len(a), len(b), ratio, low, high, status)


def _phase_values(steady: list[StepTimes], phase: str) -> list[float]:
    return [s.phases[phase] for s in steady if phase in s.phases]


def compare_runs(run_a: RunSteps, run_b: RunSteps, settings: CompareSettings) -> Comparison:
    """Compare two runs (CompareError when either has nothing to compare)."""
    a, b = run_side("A", run_a, settings), run_side("B", run_b, settings)
    rng = random.Random(settings.seed)
    step = compare_values(STEP_ROW, [s.seconds for s in a.steady],
                          [s.seconds for s in b.steady], settings, rng)
    wall = (compare_values(WALL_ROW, a.wall_intervals, b.wall_intervals, settings, rng)
            if a.wall_intervals and b.wall_intervals else None)
    names_a = _phase_names(a.steady)
    names_b = _phase_names(b.steady)
    phases = [compare_values(p, _phase_values(a.steady, p), _phase_values(b.steady, p),
                             settings, rng) for p in names_a if p in names_b]
    result = Comparison(a, b, settings, step, wall, phases,
                        [p for p in names_a if p not in names_b],
                        [p for p in names_b if p not in names_a])
    if settings.rank is None and len(set(a.ranks) | set(b.ranks)) > 1:
        for rank in sorted(set(a.ranks) & set(b.ranks)):
            ra = [s.seconds for s in a.steady if s.rank == rank]
            rb = [s.seconds for s in b.steady if s.rank == rank]
            if ra and rb:
                result.per_rank.append((rank, compare_values(STEP_ROW, ra, rb, settings, rng)))
    result.same_run = same_run(run_a, run_b)
    result.verdict = verdict(result)
    return result


def _phase_names(steady: list[StepTimes]) -> list[str]:
    """Phase names in the order the steps ran them (first step that has each)."""
    seen: dict[str, None] = {}
    for s in steady:
        for name in s.phases:
            seen.setdefault(name, None)
    return list(seen)


def verdict(result: Comparison) -> str:
    """'B is 19.8% slower per step [95% CI 18.1, 21.4]; forward +31%, others within noise'.

    Every row the table marks slower or faster is named: a phase that moved by at least
    ``phase_floor`` of the step by its change, largest first; one that moved less with how
    little that is; ``wall per step`` when it says other than the step. 'every phase within
    noise' only when the table says so of every phase. A run compared with itself says so
    first.
    """
    step = result.step
    if step.ratio is None or step.low is None or step.high is None:
        head = "no ratio for the step (A's median step is 0)"
    else:
        pct = (step.ratio - 1) * 100
        ci = f"[95% CI {(step.low - 1) * 100:.1f}, {(step.high - 1) * 100:.1f}]"
        if step.status in ("slower", "faster"):
            head = f"B is {abs(pct):.1f}% {step.status} per step {ci}"
        else:
            head = f"B and A take the same time per step within noise ({pct:+.1f}% {ci})"
    if result.same_run is not None:
        head = (f"A and B are one run ({result.same_run}): a run compared with itself shows "
                f"no change; {head}")
    wall = result.wall
    if wall is not None and wall.status in ("slower", "faster") and wall.status != step.status:
        head += f"; {WALL_ROW} {_signed_pct(wall)} {wall.status} (between steps too)"
    changed = [r for r in result.phases if r.status in ("slower", "faster")]
    if not result.phases:
        return head + "; no phase in both runs"
    if not changed:
        return head + "; every phase within noise"
    large = sorted((r for r in changed if _moves_step(result, r)),
                   key=lambda r: -abs(r.b_median - r.a_median))
    small = [r for r in changed if not _moves_step(result, r)]
    floor = result.settings.phase_floor * 100
    listed = [f"{r.name} {_signed_pct(r, 0)}" for r in large] + [
        f"{r.name} {_signed_pct(r)} ({_delta_text(r.b_median - r.a_median)}, under "
        f"{floor:g}% of the step)" for r in small]
    rest = len(result.phases) - len(changed)
    return head + "; " + ", ".join(listed) + (", others within noise" if rest else "")


def _signed_pct(row: Row, digits: int = 1) -> str:
    return f"{((row.ratio or 1.0) - 1) * 100:+.{digits}f}%"


def _delta_text(seconds: float) -> str:
    """'+4 us', '-1.20 ms', '+310 ns': a phase's change in time."""
    return ("+" if seconds >= 0 else "-") + duration(abs(seconds), COMPARE_DELTA)


def throughput_note(result: Comparison) -> str | None:
    """Why throughput and the step row point different ways, when they do; None when they
    agree (or there is no throughput).

    Throughput is units over the steady steps' summed time, so it follows their mean step
    and the units per step; the step row is a median. A tail of slow steps that moved, or
    steps that carry more tokens, turn one without the other.
    """
    a, b, step = result.a, result.b, result.step
    for what, attr in (("tokens", "tokens_per_second"), ("samples", "samples_per_second")):
        ra, rb = getattr(a, attr), getattr(b, attr)
        if not ra or rb is None or step.ratio is None:
            continue
        rate_ratio = rb / ra
        if (rate_ratio - 1.0) * (step.ratio - 1.0) <= 0:
            return None  # B faster by one, not slower by the other: they agree
        mean_ratio = (b.mean_step_seconds / a.mean_step_seconds
                      if a.mean_step_seconds > 0 else float("nan"))
        per_step_ratio = rate_ratio * mean_ratio
        return (f"throughput ({what}/s, B/A {rate_ratio:.3f}) and the step median (B/A "
                f"{step.ratio:.3f}) point different ways: throughput is {what} over the "
                f"steady steps' summed time, so it follows their mean (B/A {mean_ratio:.3f}) "
                f"and the {what} per step (B/A {per_step_ratio:.3f}); the step row is the "
                "median, which a tail of slow steps does not move")
    return None


def _moves_step(result: Comparison, row: Row) -> bool:
    """Whether a phase's change is at least ``phase_floor`` of A's median step."""
    return abs(row.b_median - row.a_median) >= result.settings.phase_floor * result.step.a_median


def failures(result: Comparison, pct: float, per_phase: bool) -> list[str]:
    """What is slower by more than ``pct`` percent with the interval's lower bound above it
    (``--fail-if-slower``): the step, and each phase with ``per_phase``."""
    phases = [r for r in result.phases if _moves_step(result, r)] if per_phase else []
    limit = 1.0 + pct / 100.0
    return [f"{r.name}: {r.change_text()} > {pct:g}%" for r in [result.step] + phases
            if r.low is not None and r.ratio is not None and r.low > limit]


def excluded_text(side: RunSide) -> str:
    """'5 warm-up, 6 with monitoring' (or 'none left out')."""
    return _excluded_text(side.excluded)
