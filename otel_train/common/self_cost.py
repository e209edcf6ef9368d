"""The library's own CPU cost (``otel_train_instrumentation_overhead_ratio``)."""

from __future__ import annotations

import threading


class SelfCostMeter:
    """The library's own CPU cost, in nanoseconds, monotonically increasing.

    Background threads add their measured thread CPU time; the hot path is accounted as
    ``phases x calibrated cost per phase`` (measuring it on the hot path would double it).
    """

    def __init__(self, hot_path_ns_per_span: float = 0.0) -> None:
        self.hot_path_ns_per_span = hot_path_ns_per_span
        self._lock = threading.Lock()
        self._background_ns = 0
        self._hot_path_ns = 0.0

    def add_background_ns(self, ns: int) -> None:
        """Add CPU time a background thread spent on telemetry."""
        with self._lock:
            self._background_ns += ns

    def add_hot_path_spans(self, spans: int) -> None:
        """Account the estimated hot-path cost of ``spans`` recorded spans."""
        with self._lock:
            self._hot_path_ns += spans * self.hot_path_ns_per_span

    @property
    def total_ns(self) -> int:
        """Background plus estimated hot-path CPU time so far."""
        with self._lock:
            return int(self._background_ns + self._hot_path_ns)

