"""When the span worker drains the recorder's queue, and how long it sleeps until it looks again.

A drain is due once ``drain_at_records`` records wait, the oldest ended ``max_delay`` ago, or
(console on) a step the console prints a fast line for is queued (``ConsoleDrainClock``).
Between looks the worker sleeps until the earliest moment one of those can come true, from
the steps' own end times and their recent period: the oldest record's age limit, the step
that fills the batch, the console's next line step. Every wake-up takes the GIL the training
thread needs and starts on cold caches, so the worker wakes a few times a second while a
loop trains and about three times a second while nothing happens, instead of at every poll
interval; the poll interval is the floor, so a prediction that came early costs one more
look, never a late line.

Usage::

    schedule = DrainSchedule(0.05, 256, 0.35, ConsoleDrainClock(10, 1.0))
    schedule.observe(queue)                         # each look: the newest step's end
    if schedule.drain_due(queue, perf_counter_ns()): worker.drain()
    stop.wait(schedule.wait_seconds(queue, perf_counter_ns(), active=True))
"""

from __future__ import annotations

from collections import deque
from typing import Any

# The steps' period is the median of the last few looks' (each over the steps between two
# looks): a slow step, or an evaluation, does not push the next console line late.
_PERIOD_SAMPLES = 7


class ConsoleDrainClock:
    """When the console's next fast line is queued: a step whose index is the next multiple
    of ``log_every``, ending at least ``min_interval_seconds`` after the last one, as the
    console counts it (by the steps' own end times; a cheap look at the newest queued record,
    once per look)."""

    def __init__(self, every_steps: int, min_interval_seconds: float) -> None:
        self._every = every_steps
        self._interval_ns = int(min_interval_seconds * 1e9)
        self._next_index = 0
        self._next_end_ns = 0  # perf_counter_ns: no line for a step ending before this

    def due(self, queue: Any) -> bool:
        """The newest queued step has reached the next line's step, and its time has come."""
        try:
            newest = queue[-1]
        except IndexError:
            return False
        index = getattr(newest, "index", None)
        end_ns = getattr(newest, "end_ns", 0)
        if not isinstance(index, int) or index < self._next_index or not end_ns:
            return False
        if end_ns < self._next_end_ns:
            return False
        self._next_index = (index // self._every + 1) * self._every
        # The console's next line comes no earlier than its last line's step end + its
        # interval; which step that was (a fast line or a breakdown) is the console's to
        # say, so the gate opens again after half the interval: at most two early drains
        # per interval, and the line's step is never waited past.
        self._next_end_ns = end_ns + self._interval_ns // 2
        return True

    def next_due_ns(self, index: int, end_ns: int, period_ns: float) -> float:
        """When a step is predicted to open the gate, after step ``index`` ended at ``end_ns``
        and steps take ``period_ns`` each."""
        at = end_ns + max(1, self._next_index - index) * period_ns
        return max(at, self._next_end_ns)


class DrainSchedule:
    """The span worker's drain rule and its sleep between looks."""

    def __init__(self, poll_seconds: float, drain_at_records: int, max_delay_seconds: float,
                 console: ConsoleDrainClock | None = None) -> None:
        self.poll_ns = int(poll_seconds * 1e9)
        self.drain_at = drain_at_records
        self.max_delay_ns = int(max_delay_seconds * 1e9)
        self.console = console
        self.period_ns = 0.0  # the steps' recent period; 0 until two steps were seen
        self._periods: deque[float] = deque(maxlen=_PERIOD_SAMPLES)
        self._newest: tuple[int, int] | None = None  # (index, end_ns) of the newest step seen

    def observe(self, queue: Any) -> None:
        """Note the newest queued step: its end and index give the steps' period."""
        try:
            newest = queue[-1]
        except IndexError:
            return
        index = getattr(newest, "index", None)
        end_ns = getattr(newest, "end_ns", 0)
        if not isinstance(index, int) or not end_ns:
            return  # a monitoring record between steps: no index
        seen = self._newest
        if seen is not None and index > seen[0] and end_ns > seen[1]:
            periods = self._periods
            periods.append((end_ns - seen[1]) / (index - seen[0]))
            self.period_ns = sorted(periods)[(len(periods) - 1) // 2]  # the lower median
        if seen is None or index != seen[0]:
            self._newest = (index, end_ns)

    def drain_due(self, queue: Any, now_ns: int) -> bool:
        """A drain is due now: enough records, the oldest too old, or the console's step."""
        n = len(queue)
        if not n:
            return False
        if n >= self.drain_at:
            return True
        try:
            oldest_end = getattr(queue[0], "end_ns", 0) or now_ns
        except IndexError:  # drained meanwhile (run.flush() on the training thread)
            return False
        if now_ns - oldest_end >= self.max_delay_ns:
            return True
        return self.console is not None and self.console.due(queue)

    def wait_seconds(self, queue: Any, now_ns: int, active: bool, stepped: bool = True
                     ) -> float:
        """How long the worker may sleep before a drain can be due (the poll interval at
        least, the age limit at most: a record queued meanwhile is due no sooner).
        ``active``: a step is open or ended within the age limit; ``stepped``: a step ended
        in this run."""
        wait = float(self.max_delay_ns)
        n = len(queue)
        if n:
            try:
                oldest_end = getattr(queue[0], "end_ns", 0) or now_ns
                wait = min(wait, oldest_end + self.max_delay_ns - now_ns)
            except IndexError:
                pass
        period = self.period_ns
        console = self.console
        if console is not None and (not stepped or (active and not period)):
            # No pace known yet (before and in the loop's first steps): look every poll, so
            # the first lines are on time too.
            wait = self.poll_ns
        elif active and period > 0:
            if n:
                wait = min(wait, (self.drain_at - n) * period)
            seen = self._newest
            if console is not None and seen is not None:
                due = console.next_due_ns(seen[0], seen[1], period) - now_ns
                # Past by more than the age limit, the prediction is stale (the loop paused,
                # in a long step or between epochs): the age limit paces the looks again.
                if due > -self.max_delay_ns:
                    wait = min(wait, due)
        return max(self.poll_ns, min(wait, self.max_delay_ns)) / 1e9
