"""Counting dropped telemetry by reason: nothing is dropped silently, nothing here raises."""

from __future__ import annotations

import threading

# Every reason the library counts (exported at 0 until they happen): ``record_queue_full``
# (steps recorded faster than the background could build them), ``export_queue_full``
# (exporter slower than training), ``export_failed`` (the collector refused or was
# unreachable), ``shutdown_timeout`` (still queued or in flight when the shutdown bound ran
# out), ``build_error``, ``step_ring_full`` (step_ring="on": steps ended faster than the
# background read the ring).
DROP_REASONS = ("record_queue_full", "export_queue_full", "export_failed", "shutdown_timeout",
                "build_error", "step_ring_full")


class DropCounter:
    """Counts telemetry that was dropped, by reason; nothing is dropped silently.

    The reasons the library uses are :data:`DROP_REASONS`.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, reason: str, count: int = 1) -> None:
        """Count ``count`` spans dropped for ``reason``."""
        if count <= 0:
            return
        with self._lock:
            self._counts[reason] = self._counts.get(reason, 0) + count

    def retract(self, reason: str, count: int) -> None:
        """Un-count spans counted for ``reason`` that turned out delivered after all.

        Used once: spans in flight when shutdown gave up, whose export later succeeded; by
        then the metrics endpoint is closed and only ``counts()`` is read.
        """
        with self._lock:
            left = self._counts.get(reason, 0) - count
            if left > 0:
                self._counts[reason] = left
            else:
                self._counts.pop(reason, None)

    def counts(self) -> dict[str, int]:
        """A snapshot of the counts by reason."""
        with self._lock:
            return dict(self._counts)

    @property
    def total(self) -> int:
        """All spans dropped, any reason."""
        with self._lock:
            return sum(self._counts.values())
