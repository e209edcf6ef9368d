"""Governing: the intervals that keep monitoring within its budget (``budget_action="govern"``).

The governor reads what the run measures (``OverheadSnapshot``: each operation's calls and
time, the training time per step) and proposes an interval for each operation scheduled with
``step.due``; ``recording/schedule.py`` puts the proposals in force at its plan steps, the
same step on every rank. Its rules:

- **Costs.** An operation's cost per call is the mean of its last ``RECENT_CALLS`` calls
  (one noisy call does not move an interval; a change of cost shows within a few calls),
  starting from its steady mean when the governor first sees it (calls after the first).
  An operation seen once is judged on that one call, as the steady share judges it:
  nothing better is known yet, and waiting for a second call would let a 180 s evaluation
  run twice. Its second call replaces it, so a slow first call (warm-up) stretches the
  interval until then at most, within ``max_every``. The training time per step is the
  mean over the last ``RECENT_WINDOWS`` decisions' steps, once the warm-up steps are over
  (the steady figure before). Monitoring not scheduled with ``step.due`` is counted at its
  steady projection (the advisor's) and left as it is.
- **Target.** The governed operations share ``TARGET_OF_BUDGET`` (90%) of the budget, less
  what the other monitoring takes. **Sharing rule: max-min fair** (``fair_intervals``):
  every operation may take up to a common cap of the training time, the largest cap at
  which the shares fit the target. A cheap operation under the cap keeps its interval (a
  0.3 s collector is not stretched because a 180 s snapshot is expensive); the expensive
  ones are stretched to the cap, within their ``min_every``..``max_every``; one pinned at
  its ``max_every`` takes what it takes there and the others share the rest.
- **Hysteresis.** Over the budget, the intervals stretch at once to the target. Under
  ``SHRINK_BELOW_OF_BUDGET`` (75%) of it, a stretched interval shrinks by at most a third per
  decision toward the target's interval (never below ``min_every``, which defaults to the
  asked interval). Between the two, nothing changes: a run sitting at 90% of its budget
  does not oscillate. A proposed change counts as in force until it is (at most
  ``PENDING_STEPS`` steps): the next decision starts from it, not from the interval it
  replaces.
- **Cadence.** ``Governor.decide`` runs in the background (``GovernorThread``, every
  ``DECIDE_EVERY_SECONDS``), never on the training thread; each change is one console line
  (``val_loss every 50 -> 167 steps: it costs 15.0% of training time, budget 5%``), printed
  by rank 0 once the plan step put it in force.

Usage::

    governor = Governor(budget=0.05)
    proposal = governor.decide(overhead.snapshot(), schedule.operations())
    schedule.proposed = proposal          # {operation: (interval, share at the old one)}
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

from otel_train.derived.overhead import OverheadSnapshot
from otel_train.recording.schedule import PLAN_EVERY_STEPS

_log = logging.getLogger("otel_train")

TARGET_OF_BUDGET = 0.9
SHRINK_BELOW_OF_BUDGET = 0.75
SHRINK_STEP = 2 / 3  # a stretched interval shrinks to at least this fraction per decision
DECIDE_EVERY_SECONDS = 1.0
RECENT_CALLS = 5  # an operation's cost per call: the mean of its last calls
RECENT_WINDOWS = 8  # the training time per step: over the last decisions' windows
# A proposed change reaches every rank within two plan steps; until then it stands.
PENDING_STEPS = 3 * PLAN_EVERY_STEPS


def interval_at_cap(rel: float, lo: int, hi: int, cap: float) -> int:
    """The shortest interval within lo..hi at which an operation costing ``rel`` steps of
    training per call takes at most ``cap`` of the training time (hi if none does)."""
    if cap <= 0:
        return hi
    return min(hi, max(lo, math.ceil(rel / cap - 1e-9)))


def fair_intervals(ops: dict[str, tuple[float, int, int]], target: float) -> dict[str, int]:
    """Max-min fair intervals: {name: interval} for ops {name: (rel, min_every, max_every)},
    ``rel`` being a call's cost in steps of training time.

    Every operation gets at most a common cap of the training time, the largest cap at
    which their shares sum to ``target`` or less: an operation whose share at its shortest
    interval is under the cap keeps that interval, the others are stretched to the cap, and
    one pinned at its ``max_every`` takes what it takes there.
    """
    def total(cap: float) -> float:
        return sum(rel / interval_at_cap(rel, lo, hi, cap) for rel, lo, hi in ops.values())

    top = max(rel / lo for rel, lo, _ in ops.values())
    if total(top) <= target:
        cap = top
    elif target <= 0 or total(0.0) > target:
        cap = 0.0
    else:
        a, b = 0.0, top  # bisection: total(cap) grows with cap (piecewise constant)
        for _ in range(60):
            mid = (a + b) / 2
            if total(mid) <= target:
                a = mid
            else:
                b = mid
        cap = a
    return {name: interval_at_cap(rel, lo, hi, cap) for name, (rel, lo, hi) in ops.items()}


class Governor:
    """Decides governed intervals from overhead snapshots; keeps its running estimates."""

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self._prev: OverheadSnapshot | None = None
        self._costs: dict[str, float] = {}  # operation -> seconds per call
        self._recent_calls: dict[str, deque[float]] = {}  # its last calls' seconds
        self._first_only: set[str] = set()  # operations known by their first call alone
        self._windows: deque[tuple[float, int]] = deque(maxlen=RECENT_WINDOWS)
        # operation -> (interval proposed, steps when proposed): not in force yet
        self._pending: dict[str, tuple[int, int]] = {}
        self._train_per_step = 0.0
        self.decisions = 0
        self.last_share = 0.0  # projected steady share at the intervals in force

    def _estimate(self, snap: OverheadSnapshot) -> None:
        prev = self._prev
        for name, op in snap.operations.items():
            before = prev.operations.get(name) if prev is not None else None
            recent = self._recent_calls.get(name)
            if recent is None:
                if not op.calls:
                    continue
                recent = self._recent_calls[name] = deque(maxlen=RECENT_CALLS)
                recent.append(op.steady_mean_seconds)  # one call: that call itself
                if op.calls == 1:
                    self._first_only.add(name)
            elif before is not None and op.calls > before.calls:
                new = op.calls - before.calls
                if name in self._first_only:  # a second call: the first one is left out
                    self._first_only.discard(name)
                    recent.clear()
                recent.extend([(op.total_seconds - before.total_seconds) / new]
                              * min(new, RECENT_CALLS))
            self._costs[name] = sum(recent) / len(recent)
        if prev is not None and snap.steps > prev.steps and prev.steps >= snap.warmup_steps:
            # the steps since the previous decision, warm-up over: follows a change of pace
            self._windows.append((snap.training_seconds - prev.training_seconds,
                                  snap.steps - prev.steps))
        if self._windows:
            s = sum(t for t, _ in self._windows) / sum(n for _, n in self._windows)
        else:
            s = snap.steady_train_seconds_per_step
        if s > 0:
            self._train_per_step = s
        self._prev = snap

    def decide(self, snap: OverheadSnapshot,
               governed: Sequence[tuple[str, int, int, int, int, int]]
               ) -> dict[str, tuple[int, float]]:
        """{operation: (interval, its share at the interval in force)} for every governed
        operation; ``governed`` is ``DueSchedule.operations()``."""
        self._estimate(snap)
        self.decisions += 1
        s = self._train_per_step
        basis = self._basis(snap, governed)
        known = [g for g in governed if g[0] in self._costs]
        if s <= 0 or not known:
            return {name: (basis[name], 0.0) for name, *_ in governed}
        names = {g[0] for g in governed}
        other = _other_share(snap, names, s)
        rel = {name: self._costs[name] / s for name, *_ in known}  # cost in steps of training
        current = sum(rel[name] / basis[name] for name, *_ in known) + other
        self.last_share = current
        target = TARGET_OF_BUDGET * self.budget - other
        wanted = fair_intervals({n: (rel[n], lo, hi) for n, _, lo, hi, _, _ in known}, target)
        out: dict[str, tuple[int, float]] = {}
        for name, _, lo, _, k, _ in governed:
            b = basis[name]
            if name not in rel:
                out[name] = (b, 0.0)
                continue
            want = wanted[name]
            new = b
            if current > self.budget and want > b:
                new = want
            elif current < SHRINK_BELOW_OF_BUDGET * self.budget and want < b:
                new = max(want, lo, math.floor(b * SHRINK_STEP))
            out[name] = (new, rel[name] / k)  # what it costs at the interval it replaces
            if new != b:
                self._pending[name] = (new, snap.steps)
        return out

    def _basis(self, snap: OverheadSnapshot,
               governed: Sequence[tuple[str, int, int, int, int, int]]) -> dict[str, int]:
        """The interval each operation is about to have: a proposed change on its way to
        the next plan steps counts as in force (deciding again from the interval it
        replaces would undo it); one that never came (bounds changed since) is dropped."""
        basis = {}
        for name, _, lo, hi, k, _ in governed:
            pending = self._pending.get(name)
            if (pending is not None and pending[0] != k and lo <= pending[0] <= hi
                    and snap.steps - pending[1] < PENDING_STEPS):
                basis[name] = pending[0]
            else:
                self._pending.pop(name, None)
                basis[name] = k
        return basis


def _other_share(snap: OverheadSnapshot, governed: set[str], s: float) -> float:
    """The steady share of the monitoring not scheduled with ``step.due`` (the advisor's
    projection: steady cost over the measured interval; a one-off over the steps so far)."""
    total = 0.0
    for name, op in snap.operations.items():
        if name in governed or not op.calls:
            continue
        if op.calls >= 2 and op.last_step > op.first_step:
            k = (op.last_step - op.first_step) / (op.calls - 1)
            total += op.steady_mean_seconds / (k * s)
        elif snap.steps:
            total += op.total_seconds / (snap.steps * s)
    return total


def change_line(operation: str, old: int, new: int, share: float, budget: float,
                rank: int | None = None) -> str:
    """The console line of one interval change."""
    who = f"[rank {rank}] " if rank is not None else ""
    why = (f"it costs {share:.1%} of training time, budget {budget * 100:.3g}%" if new > old
           else f"it costs {share:.1%} of training time now, budget {budget * 100:.3g}%")
    return f"otel-train: {who}{operation} every {old} -> {new} steps: {why}"


class GovernorThread:
    """``otel-train-governor``: decides every ``interval_seconds`` and says each change."""

    def __init__(self, governor: Governor, schedule: Any, snapshot: Any,
                 interval_seconds: float = DECIDE_EVERY_SECONDS) -> None:
        self.governor = governor
        self.schedule = schedule
        self._snapshot = snapshot  # () -> OverheadSnapshot, taken under the chain's lock
        self.interval_seconds = interval_seconds
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lines_said = 0

    def start(self) -> None:
        """Start the daemon thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="otel-train-governor",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_seconds):
            self.tick()

    def tick(self) -> None:
        """One decision and the lines of the changes put in force since the last; never
        raises (a failed decision keeps the intervals in force)."""
        try:
            sched = self.schedule
            if sched.governed and sched.rank == 0:  # only rank 0's proposals are published
                sched.proposed = self.governor.decide(self._snapshot(), sched.operations())
            self.say_changes()
        except Exception as exc:
            _log.warning("otel-train: governing skipped a decision: %r", exc)

    def say_changes(self) -> None:
        """One line per change put in force (rank 0 alone: every rank changed alike)."""
        changes = self.schedule.changes
        while changes:
            step, name, old, new, share = changes.popleft()
            if self.schedule.rank == 0:
                _log.warning("%s (from step %d)", change_line(
                    name, old, new, share, self.governor.budget), step)
                self.lines_said += 1

    def stop(self, timeout_seconds: float = 1.0) -> None:
        """Stop the thread (bounded), then say what is left to say."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(max(0.0, timeout_seconds))
        try:
            self.say_changes()
        except Exception:
            pass


class IntervalCollector:
    """``otel_train_monitoring_interval_steps{operation,rank}``: each operation's interval in
    force (``step.due``), governed or not; its OTLP twin is made from it (otlp_metrics.py)."""

    def __init__(self, schedule: Any, rank: Any) -> None:
        self.schedule = schedule
        self.rank = str(rank)

    def collect(self) -> Any:
        """The gauge family (empty until an operation is scheduled)."""
        from prometheus_client.core import GaugeMetricFamily

        from otel_train.common.attributes import METRIC_MONITORING_INTERVAL

        family = GaugeMetricFamily(
            METRIC_MONITORING_INTERVAL, "Steps between two calls of a monitoring operation "
            "scheduled with step.due: the interval in force (governed with "
            "budget_action=govern, else the asked one).", labels=["operation", "rank"])
        for name, interval in sorted(self.schedule.intervals().items()):
            family.add_metric([name, self.rank], interval)
        yield family


def governor_thread(budget_action: str, budget: float, schedule: Any, overhead: Any,
                    lock: Any) -> GovernorThread | None:
    """The governor of a run with ``budget_action="govern"`` (None otherwise)."""
    if budget_action != "govern":
        return None

    def snapshot() -> OverheadSnapshot:
        with lock:
            return overhead.snapshot()  # type: ignore[no-any-return]

    return GovernorThread(Governor(budget), schedule, snapshot, DECIDE_EVERY_SECONDS)


def governing_lines(governing: Any) -> list[str]:
    """The costs table's lines on ``step.due``'s intervals (``monitoring_costs.json``'s
    ``governing`` block); none when no operation was scheduled."""
    if not governing or not governing.get("operations"):
        return []
    if governing.get("governing"):
        head = "governing (budget_action=govern): intervals in force"
    elif governing.get("fallback"):
        head = f"governing fell back to the asked intervals: {governing['fallback']}"
    else:
        head = "step.due intervals (budget_action=report: as asked)"
    lines = ["", head + ":"]
    for name, op in governing["operations"].items():
        lines.append(f"  {name}: every {op['interval_steps']} steps (asked {op['asked_every']}, "
                     f"bounds {op['min_every']}..{op['max_every']}, {op['changes']} change(s))")
    return lines
