"""Keeping otel-train's background off the training thread's CPU (option ``background_cpus``).

otel-train's background (the exporter process, the span worker and the run's other threads)
works in bursts. Left to the scheduler, a burst can land on the CPU the training thread has
just left to wait for the GIL or for a torch kernel: when the training thread comes back, its
code and data are out of that core's caches, and each step runs longer on the CPU. With
``background_cpus="auto"`` the background may run on every CPU this process may use except
the one the training thread is on when the run starts; the training thread itself is never
pinned (nor are torch's threads, the data loader's workers or anything else of the user's).
Where the process may use one CPU only, or the platform has no ``sched_setaffinity``, nothing
is done and ``BackgroundCpus.why_not`` says why.

Usage::

    cpus = BackgroundCpus.resolve("auto")      # on the training thread, before the threads
    cpus.pin_threads([t.native_id for t in started])
    ExporterProcess(config, cpus=cpus.cpus)    # set on the child as it starts
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass

_log = logging.getLogger("otel_train")
_PROCESSOR_FIELD = 36  # /proc/<pid>/task/<tid>/stat: field 39, counted after "(comm) "


def current_cpu(native_tid: int | None = None) -> int | None:
    """The CPU the thread ran on last (the calling thread by default), None where unknown."""
    tid = native_tid or threading.get_native_id()
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return int(fields[_PROCESSOR_FIELD])
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class BackgroundCpus:
    """The CPUs otel-train's background may run on: ``cpus`` (None: wherever the scheduler
    puts it) and, when None under ``auto``, why."""

    cpus: frozenset[int] | None
    training_cpu: int | None = None
    why_not: str | None = None

    @classmethod
    def resolve(cls, mode: str) -> BackgroundCpus:
        """The background's CPUs for option ``background_cpus`` (``auto`` | ``off``); call it
        on the training thread."""
        if mode == "off":
            return cls(None, why_not="background_cpus='off'")
        if not hasattr(os, "sched_getaffinity") or not hasattr(os, "sched_setaffinity"):
            return cls(None, why_not="no sched_setaffinity on this platform")
        try:
            allowed = os.sched_getaffinity(0)
        except OSError as exc:
            return cls(None, why_not=f"sched_getaffinity failed: {exc}")
        training = current_cpu()
        if training is None or training not in allowed:
            return cls(None, why_not="the training thread's CPU is unknown")
        rest = frozenset(allowed - {training})
        if not rest:
            return cls(None, training, "this process may use one CPU only")
        return cls(rest, training)

    def pin_threads(self, native_ids: Iterable[int | None]) -> int:
        """Keep these threads (of this process) on the background's CPUs; how many were;
        never raises (a thread that has exited is skipped)."""
        if self.cpus is None:
            return 0
        pinned = 0
        for tid in native_ids:
            # A thread id outside this process's task list is not ours (any more): an exited
            # thread's id can be reused by another process's thread, which must not be pinned.
            if not tid or not os.path.exists(f"/proc/self/task/{tid}"):
                continue
            try:
                os.sched_setaffinity(tid, self.cpus)
                pinned += 1
            except OSError as exc:  # gone, or not allowed: the scheduler keeps placing it
                _log.debug("otel-train: could not set thread %s's CPUs: %r", tid, exc)
        return pinned

    def describe(self) -> str:
        """One line for the run's log: where the background runs and why."""
        if self.cpus is None:
            return f"background CPUs: the scheduler's ({self.why_not})"
        listed = ",".join(str(c) for c in sorted(self.cpus))
        return f"background CPUs: {listed} (off CPU {self.training_cpu}, where the training " \
               "thread runs)"
