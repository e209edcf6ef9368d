"""How long the exporter process's ring reader sleeps once it has read the ring to its head.

The reader has no descriptor to wait on (the ring is shared memory the training thread writes
without a system call), so it sleeps and looks again. Each wake meets cold caches: a wake
that reads a few hundred steps costs each of them far less than one that reads a few
(``python benchmarks/bench_processors.py --live --ring``: the exporter process's CPU per
7-span step falls by about 40% between 20 ms and 250 ms sleeps, most of it in the derived
chain and the record builder). So it sleeps ``POLL_SECONDS``, below the console's drain delay
in the training process (0.35 s) so that a console line is no later than without the ring,
and less when the ring fills fast: a ring over a quarter full while the reader sleeps could
fill before it wakes, and a full ring drops the newest steps (``step_ring_full``).

``BoundedWait``: how long the reader has held back for something still to come (a marker's
record from the pipe, the collectives that cover a step), so that it waits a bounded time.

Usage::

    pace = RingPace(ring.capacity, reader.position)
    time.sleep(pace.next_sleep(reader.position))    # after each read to the head
    wait = BoundedWait()
    if wait.waiting(MARKER_WAIT_SECONDS): ...       # still within the bound: hold back
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["FILL_PER_SLEEP", "MIN_POLL_SECONDS", "POLL_SECONDS", "BoundedWait", "RingPace"]

#: The longest sleep.
POLL_SECONDS = 0.25
#: The shortest sleep, for the fastest loops.
MIN_POLL_SECONDS = 0.002
#: The share of the ring that may fill while the reader sleeps.
FILL_PER_SLEEP = 0.25


class RingPace:
    """The reader's sleeps, from how fast the ring filled since the last one."""

    def __init__(self, capacity_bytes: int, position: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be > 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._clock = clock
        self._slept_at = clock()
        self._slept_position = position

    def next_sleep(self, position: int) -> float:
        """The sleep now that the reader has read to ``position`` (bytes ever read):
        ``POLL_SECONDS``, or less where the ring, filling at the rate it did since the last
        sleep, would be over ``FILL_PER_SLEEP`` full by then; never under
        ``MIN_POLL_SECONDS``."""
        now = self._clock()
        read_bytes, seconds = position - self._slept_position, now - self._slept_at
        self._slept_at, self._slept_position = now, position
        if read_bytes <= 0 or seconds <= 0:
            return POLL_SECONDS
        fills_in = FILL_PER_SLEEP * self.capacity_bytes * seconds / read_bytes
        return max(MIN_POLL_SECONDS, min(POLL_SECONDS, fills_in))


class BoundedWait:
    """A wait for something still to come, bounded: ``waiting`` is True from its first call
    until ``seconds`` have passed since it (then False once, and the wait starts over);
    ``reset`` when what was awaited came."""

    def __init__(self) -> None:
        self._since: float | None = None

    def waiting(self, seconds: float) -> bool:
        """Whether to go on waiting: True within ``seconds`` of the first call."""
        now = time.monotonic()
        if self._since is None:
            self._since = now
        if now - self._since < seconds:
            return True
        self._since = None
        return False

    def reset(self) -> None:
        """What was awaited came (or is given up): the next wait starts afresh."""
        self._since = None
