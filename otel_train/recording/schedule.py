"""When a monitoring operation is due: ``step.due(operation, every=N)``, plain or governed.

Plain (``budget_action="report"``, the default): ``step.due("val_loss", every=200)`` is
exactly ``step.index % 200 == 0`` -- step 0 included, as the ``if step % N == 0`` idiom --
so adopting it changes nothing. ``force=True`` answers True (the last step, a checkpoint
evaluation) and leaves the schedule as it was.

Governed (``budget_action="govern"``): each operation has an *interval in force*, starting
at ``every``. It runs at its first due step (the first multiple of ``every`` at or after its
first call), then ``interval`` steps after its last run. The background
(``derived/governor.py``) proposes intervals from the costs the run measures; they take
effect only at *plan steps*, every ``PLAN_EVERY_STEPS`` steps, so that every rank switches at
the same step:

- at plan step ``n * PLAN_EVERY_STEPS`` rank 0 applies the plan it published one plan step
  earlier and publishes the governor's latest proposal for the next plan step (one
  ``store.set`` every ``PLAN_EVERY_STEPS`` steps, on the training thread: a deliberate,
  bounded choice, so the publication is tied to a step and not to a thread's timing);
- every other rank reads plan ``n`` at that step (one ``store.get`` every ``PLAN_EVERY_STEPS``
  steps). Rank 0 wrote it ``PLAN_EVERY_STEPS`` steps earlier in its own step sequence, so in
  a data-parallel job (ranks within a step of each other) the key is already there; the read
  waits at most ``PLAN_WAIT_SECONDS``. No collective touches the training stream.
- One process (``world_size`` 1) uses the same plan steps with an in-process store.

When the process group's store cannot be had (``torch.distributed`` not initialized in a
multi-rank run, or a read that timed out), the rank falls back to the asked intervals for
the rest of the run and says so in one line. Every rank of a job finds the same store (or
none) at the same plan step, so they fall back together. A plan rank 0 cannot publish
makes every rank fall back at the plan step it was for: rank 0 knows it (it keeps its own
plans and never reads them back), the others after their bounded wait. Only a rank 0 more than
``PLAN_EVERY_STEPS`` steps behind the others, for over ``PLAN_WAIT_SECONDS``, can make one rank
fall back alone -- a job that far apart is already stuck in its collectives.

The hot path is a dict lookup, one comparison with the next plan step and one with the
operation's next due step. Every rank must call ``due`` for an operation at the same steps
(the same code does), and ``force`` alike.

Usage::

    schedule = DueSchedule(governed=True, rank=0, world_size=1, run_id="r")
    if schedule.due(step, "val_loss", 50):
        ...
    schedule.proposed = {"val_loss": (167, 0.15)}   # the governor's proposal
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

_log = logging.getLogger("otel_train")

#: Steps between two plan steps (where governed intervals may change on every rank).
PLAN_EVERY_STEPS = 25
#: The longest a rank waits at a plan step for rank 0's plan.
PLAN_WAIT_SECONDS = 30.0
#: The default ``max_every``: this many times the asked interval (never starve an operation).
DEFAULT_MAX_FACTOR = 20
#: The span event on the root of the step where an interval changes.
INTERVAL_EVENT = "train.monitoring.interval"


class _Operation:
    """One scheduled operation: the asked interval, its bounds, the interval in force."""

    __slots__ = ("name", "every", "min_every", "max_every", "asked_min", "asked_max",
                 "interval", "next_due", "last_run", "changes")

    def __init__(self, name: str, every: int, min_every: int, max_every: int,
                 asked_min: int | None, asked_max: int | None, index: int) -> None:
        self.name = name
        self.every = every
        self.min_every = min_every
        self.max_every = max_every
        self.asked_min = asked_min  # as passed (None: the default), to spot a change cheaply
        self.asked_max = asked_max
        self.interval = every
        self.next_due = -(-index // every) * every  # the first multiple at or after index
        self.last_run = -1
        self.changes = 0


def _check_interval(where: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: {name}={value!r} must be a positive integer (steps)")
    return value


class DueSchedule:
    """Answers ``due`` on the training thread; holds the intervals in force."""

    def __init__(self, governed: bool = False, rank: int = 0, world_size: int = 1,
                 run_id: str = "run", store: Any = None) -> None:
        self.governed = governed
        self.rank = rank
        self.world_size = world_size
        self.run_id = run_id
        self._ops: dict[str, _Operation] = {}
        # Governing: the background's latest proposal, {operation: (interval, share)}
        # where share is what the operation costs at the interval it replaces.
        self.proposed: dict[str, tuple[int, float]] = {}
        # Changes applied, for the background to say: (step, operation, old, new, share).
        self.changes: deque[tuple[int, str, int, int, float]] = deque(maxlen=1024)
        self.history: deque[tuple[int, str, int, int, float]] = deque(maxlen=64)
        self._store = store  # None: found at the first plan step (plan_store.py)
        self._store_resolved = store is not None
        self._next_plan = 0 if governed else 1 << 62
        self.fallback_reason: str | None = None
        self.plans_read = 0
        self._own_next: dict[str, Any] = {}  # rank 0: the plan it published for next time
        self._unpublished: int | None = None  # rank 0: the plan step it could not publish

    # -- the hot path -------------------------------------------------------------------
    def due(self, step: Any, operation: str, every: int | None = None, force: bool = False,
            min_every: int | None = None, max_every: int | None = None,
            index: int = -1) -> bool:
        """Whether ``operation`` runs at ``step`` (see the module docstring); ``index``: the
        step number to schedule by, when not ``step.index`` (a trainer's own count)."""
        if index < 0:
            index = step.index
        op = self._ops.get(operation)
        if (op is None or (every is not None and every != op.every)
                or (min_every is not None and min_every != op.asked_min)
                or (max_every is not None and max_every != op.asked_max)):
            op = self._register(operation, every, min_every, max_every, force, index)
        if index >= self._next_plan:
            self._at_plan_step(step, index)
        if force:
            return True
        if not self.governed:
            return index % op.every == 0
        if index >= op.next_due:
            op.last_run = index
            op.next_due = index + op.interval
            return True
        return index == op.last_run  # asked again in the step it ran: the same answer

    # -- set-up, at the call --------------------------------------------------------------
    def _register(self, name: str, every: int | None, min_every: int | None,
                  max_every: int | None, force: bool, index: int) -> _Operation:
        where = f"due({name!r})"
        if not isinstance(name, str) or not name:
            raise ValueError(f"due({name!r}): operation must be a non-empty string")
        old = self._ops.get(name)
        if every is None:
            if old is None:
                what = "forcing an unknown operation" if force else "an unknown operation"
                raise ValueError(f"{where}: {what}: give every=N on its first call")
            every = old.every
        every = _check_interval(where, "every", every)
        lo = every if min_every is None else _check_interval(where, "min_every", min_every)
        hi = (every * DEFAULT_MAX_FACTOR if max_every is None
              else _check_interval(where, "max_every", max_every))
        if min_every is not None and lo > hi:
            raise ValueError(f"{where}: min_every={lo} is above max_every={hi}")
        if every > hi:
            raise ValueError(f"{where}: every={every} is above max_every={hi}")
        if every < lo:
            raise ValueError(f"{where}: every={every} is below min_every={lo}")
        op = _Operation(name, every, lo, hi, min_every, max_every, index)
        if old is not None and old.every == every:  # new bounds only: keep the state
            op.interval = min(max(old.interval, lo), hi)
            op.next_due, op.last_run, op.changes = old.next_due, old.last_run, old.changes
        self._ops[name] = op
        return op

    # -- plan steps (every PLAN_EVERY_STEPS steps, governed only) -----------------------------
    def _at_plan_step(self, step: Any, index: int) -> None:
        n = index // PLAN_EVERY_STEPS
        self._next_plan = (n + 1) * PLAN_EVERY_STEPS
        if self._unpublished is not None and n >= self._unpublished:
            # Rank 0 could not publish this plan: the others fall back here, after their
            # bounded wait for it; so does rank 0, at the same step.
            self._fall_back(f"the plan of step {n * PLAN_EVERY_STEPS} could not be published")
            return
        try:
            store = self._plan_store()
            if store is None:
                return
            plan = self._exchange(store, n)
        except Exception as exc:  # never into training: fall back (the module docstring)
            self._fall_back(f"the plan of step {n * PLAN_EVERY_STEPS} could not be read "
                            f"({exc!r})")
            return
        if plan:
            self._apply(step, index, plan)

    def _plan_store(self) -> Any:
        if not self._store_resolved:
            self._store_resolved = True
            from otel_train.recording.plan_store import resolve_plan_store
            self._store, reason = resolve_plan_store(self.world_size)
            if self._store is None:
                self._fall_back(reason)
        return self._store

    def _key(self, n: int) -> str:
        return f"otel_train/{self.run_id}/intervals/{n}"

    def _exchange(self, store: Any, n: int) -> dict[str, Any]:
        """Plan ``n`` (published one plan step ago), publishing plan ``n + 1`` on rank 0."""
        if self.rank == 0:
            # Rank 0 keeps what it publishes: it never waits on the store for its own plan.
            plan, self._own_next = self._own_next, dict(self.proposed)
            try:
                store.set(self._key(n + 1), self._own_next)
            except Exception:
                self._unpublished = n + 1
            return plan
        if n == 0:
            return {}  # nothing was published before the first plan step
        plan = store.get_plan(self._key(n), PLAN_WAIT_SECONDS)
        self.plans_read += 1
        return plan or {}

    def _apply(self, step: Any, index: int, plan: dict[str, Any]) -> None:
        for name, (interval, share) in plan.items():
            op = self._ops.get(name)
            if op is None:
                continue
            interval = min(max(int(interval), op.min_every), op.max_every)
            if interval == op.interval:
                continue
            old = op.interval
            op.interval = interval
            op.changes += 1
            if op.last_run >= 0:
                op.next_due = max(op.last_run + interval, index)
            change = (index, name, old, interval, float(share))
            self.changes.append(change)
            self.history.append(change)
            events = getattr(step, "governing_events", None)
            if events is None:
                events = step.governing_events = []
            events.append((INTERVAL_EVENT, time.time_ns(), {
                "train.monitoring.operation": name, "train.monitoring.interval_steps": interval,
                "train.monitoring.previous_interval_steps": old,
                "train.monitoring.asked_interval_steps": op.every,
                "train.monitoring.share_at_previous_interval": float(share)}))

    def _fall_back(self, reason: str) -> None:
        """Asked intervals from now on, on this rank; one line."""
        self.governed = False
        self._next_plan = 1 << 62
        for op in self._ops.values():
            op.interval = op.every
        self.fallback_reason = reason
        _log.warning("otel-train: budget_action=govern: %s; every operation runs at its asked "
                     "interval for the rest of the run%s", reason,
                     f" (rank {self.rank})" if self.world_size > 1 else "")

    # -- read by the background -----------------------------------------------------------
    def operations(self) -> list[tuple[str, int, int, int, int, int]]:
        """(name, every, min_every, max_every, interval in force, changes), any thread."""
        return [(op.name, op.every, op.min_every, op.max_every, op.interval, op.changes)
                for op in list(self._ops.values())]

    def intervals(self) -> dict[str, int]:
        """The interval in force of each operation scheduled so far."""
        return {op.name: op.interval for op in list(self._ops.values())}

    def describe(self) -> dict[str, Any]:
        """The ``governing`` block of monitoring_costs.json."""
        return {
            "budget_action": "govern" if (self.governed or self.fallback_reason) else "report",
            "governing": self.governed,
            "fallback": self.fallback_reason,
            "plan_every_steps": PLAN_EVERY_STEPS,
            "operations": {name: {"asked_every": every, "min_every": lo, "max_every": hi,
                                  "interval_steps": interval, "changes": changes}
                           for name, every, lo, hi, interval, changes in self.operations()},
            "changes": [{"step": s, "operation": o, "from": a, "to": b,
                         "share_at_previous_interval": round(sh, 6)}
                        for s, o, a, b, sh in list(self.history)],
        }
