"""Timestamps of the collectives a run's steps issue: appended where they happen, read later.

A DDP communication hook (``integrations/comm.py``) calls ``begin`` when a gradient bucket is
handed to the process group (on the thread running backward) and ``end`` when its future
completes (on the process group's own thread); the ``torch.distributed`` wrapper does the
same around an explicit call. Each costs one ``perf_counter_ns`` and one append or item
store: nothing is summed, looked up or locked here. The span worker takes a finished step's
entries (``take``) and turns them into the step's ``train.comm.*`` attributes
(``records/comm_summary.py``). Bounded: the oldest entries go first (counted).

Usage::

    log = CollectiveLog()
    entry = log.begin("allreduce", nbytes, KIND_OVERLAPPED)   # training / autograd thread
    log.end(entry)                                             # when its future completes
    entries, dropped = log.take(step.start_ns, step.end_ns)    # span worker
"""

from __future__ import annotations

import time
from collections import deque
from time import perf_counter_ns

# How the step waits for a collective (the entry's last field):
KIND_OVERLAPPED = 0  # runs while backward computes (DDP buckets): exposed = after compute ends
KIND_BLOCKING = 1  # the calling thread waits for all of it (a blocking dist.* call)
KIND_ASYNC = 2  # async_op=True: the wait is in the caller's work.wait(), not measured

# Entry fields: a list, so the completion thread can store its end in place.
E_OP, E_BYTES, E_START, E_END, E_KIND = range(5)


class CollectiveLog:
    """A bounded list of [op, bytes, start_ns, end_ns (0 while running), kind] entries."""

    def __init__(self, max_entries: int = 16384) -> None:
        # deque.append and popleft are atomic in CPython: writers and the one reader take
        # no lock; a full deque drops its oldest entry inside append (a run whose steps are
        # never drained), so only the reader ever pops.
        self._entries: deque[list] = deque(maxlen=max_entries)
        self._max = max_entries
        self.dropped = 0

    def begin(self, op: str, nbytes: int, kind: int) -> list:
        """An entry started now; pass it to ``end`` when the collective completes."""
        entry = [op, nbytes, perf_counter_ns(), 0, kind]
        entries = self._entries
        if len(entries) == self._max:
            self.dropped += 1  # the oldest goes: counted, approximately under races
        entries.append(entry)
        return entry

    @staticmethod
    def end(entry: list) -> None:
        """The collective completed now (any thread)."""
        entry[E_END] = perf_counter_ns()

    def __bool__(self) -> bool:
        return bool(self._entries)

    def take(self, start_ns: int, end_ns: int) -> list[list]:
        """The entries that began in [start_ns, end_ns]; older ones (between steps) are let go.

        Steps are taken in order, so entries that began after ``end_ns`` stay for the next.
        """
        entries = self._entries
        taken: list[list] = []
        while entries:
            first = entries[0]
            if first[E_START] > end_ns:
                break
            entries.popleft()
            if first[E_START] >= start_ns:
                taken.append(first)
        return taken

    def take_completed(self) -> tuple[list[list], int]:
        """The entries at the front that completed, oldest first, and the time before which
        every entry is in them (the first one still running began after it; now if none
        runs): what the training process sends the exporter process, which builds the
        ring's steps (export/process/ring_feed.py)."""
        entries = self._entries
        taken: list[list] = []
        while entries and entries[0][E_END]:
            taken.append(entries.popleft())
        return taken, (entries[0][E_START] - 1 if entries else perf_counter_ns())

    def wait_running(self, timeout_seconds: float) -> bool:
        """Wait (``timeout_seconds`` at most) until the entries running now have completed:
        a collective's end is set by its done-callback on the process group's thread, which
        can run after the step that waited for it has ended. True when none runs."""
        entries = self._entries
        deadline = perf_counter_ns() + int(timeout_seconds * 1e9)
        while True:
            running = [e for e in entries if not e[E_END]]
            if not running:
                return True
            if perf_counter_ns() >= deadline:
                return False
            time.sleep(0.001)

    def extend(self, entries: list[list]) -> None:
        """Entries taken in another process (``take_completed``), in order."""
        self._entries.extend(entries)
