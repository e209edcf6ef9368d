"""Bookkeeping shared by every background part: drops, the library's own cost, and
rate-limited warnings. Nothing here ever raises into training.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class DropCounter:
    """Counts telemetry that was dropped, by reason; nothing is dropped silently.

    Reasons used by the library: ``record_queue_full`` (steps recorded faster than the
    background could build them), ``export_queue_full`` (exporter slower than training),
    ``export_failed`` (the collector refused or was unreachable), ``shutdown_timeout``
    (still queued or in flight when the shutdown bound ran out), ``build_error``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._listeners: list[Callable[[str, int], None]] = []

    def add(self, reason: str, count: int = 1) -> None:
        """Count ``count`` spans dropped for ``reason``."""
        if count <= 0:
            return
        with self._lock:
            self._counts[reason] = self._counts.get(reason, 0) + count
            listeners = tuple(self._listeners)
        for listener in listeners:
            try:
                listener(reason, count)
            except Exception:  # a listener must never break the counting
                logging.getLogger("otel_train").debug("drop listener failed", exc_info=True)

    def retract(self, reason: str, count: int) -> None:
        """Un-count spans counted for ``reason`` that turned out delivered after all.

        Used once: spans in flight when shutdown gave up, whose export later succeeded. The
        listeners (a Prometheus counter, which never decreases) are not told; by then the
        metrics endpoint is closed and only ``counts()`` is read.
        """
        with self._lock:
            left = self._counts.get(reason, 0) - count
            if left > 0:
                self._counts[reason] = left
            else:
                self._counts.pop(reason, None)

    def add_listener(self, listener: Callable[[str, int], None]) -> None:
        """Call ``listener(reason, count)`` on every drop (e.g. to feed a Prometheus counter)."""
        with self._lock:
            self._listeners.append(listener)

    def counts(self) -> dict[str, int]:
        """A snapshot of the counts by reason."""
        with self._lock:
            return dict(self._counts)

    @property
    def total(self) -> int:
        """All spans dropped, any reason."""
        with self._lock:
            return sum(self._counts.values())


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

    @property
    def background_ns(self) -> int:
        """Background CPU time so far."""
        with self._lock:
            return self._background_ns


class RateLimitedLogger:
    """Logs a message at most once per ``interval_seconds`` per key, counting the rest."""

    def __init__(self, logger: logging.Logger, interval_seconds: float = 60.0) -> None:
        self._logger = logger
        self._interval = interval_seconds
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def log(self, level: int, key: str, msg: str, *args: object) -> bool:
        """Log unless ``key`` was logged within the interval; True when it was logged."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._interval:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return False
            self._last[key] = now
            suppressed = self._suppressed.pop(key, 0)
        if suppressed:
            msg = msg + " (%d similar message(s) suppressed)"
            args = (*args, suppressed)
        self._logger.log(level, msg, *args)
        return True

    def warning(self, key: str, msg: str, *args: object) -> bool:
        """Rate-limited warning."""
        return self.log(logging.WARNING, key, msg, *args)
