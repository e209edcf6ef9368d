"""The collectives' entries a ring step waits for in the exporter process.

Where the training process times collectives (``Run.collective_log``), a step's record
carries the exposed communication time of the collectives inside it; their entries come from
the training process in frames (``ChildRingFeed.add_collectives``), complete up to a time.
A step ending after that time waits for the next frame, bounded: after the wait it is built
without them. The run says it times collectives in the ring's header before the first step
that waits for them (``StepRingReader.collectives_timed``).

Usage::

    comm = CollectivesWait(builder, reader)
    comm.add(entries, complete_ns)                 # a frame's entries
    if comm.timed() and comm.pending(step.end_ns, wait_seconds):
        ...                                        # not yet: read again later
"""

from __future__ import annotations

from typing import Any

from otel_train.export.process.ring_pace import BoundedWait
from otel_train.recording.collectives import CollectiveLog

__all__ = ["CollectivesWait"]


class CollectivesWait:
    """Whether a ring step waits for the collectives' entries that cover it (see the module
    docstring); the entries go to the builder's log."""

    def __init__(self, builder: Any, reader: Any) -> None:
        self._builder = builder
        self._reader = reader
        self._complete_ns = 0  # the entries are complete up to this time
        self._wait = BoundedWait()

    def timed(self) -> bool:
        """The run times collectives (entries came, or the writer said so)."""
        return self._builder.collectives is not None or self._reader.collectives_timed()

    def add(self, entries: list[list[Any]], complete_ns: int) -> None:
        """Collectives' entries, complete up to ``complete_ns``."""
        log = self._builder.collectives
        if log is None:
            log = self._builder.collectives = CollectiveLog()
        log.extend(entries)
        self._complete_ns = max(self._complete_ns, complete_ns)

    def pending(self, end_ns: int, wait_seconds: float) -> bool:
        """The run times collectives and their entries do not cover a step ending at
        ``end_ns`` yet: it waits (``wait_seconds`` at most, then it is built without)."""
        if self._builder.collectives is None:
            if not self._reader.collectives_timed():
                return False
            self._builder.collectives = CollectiveLog()  # their entries are to come
        if end_ns <= self._complete_ns:
            self._wait.reset()
            return False
        return self._wait.waiting(wait_seconds)  # past it: built without them
