"""Warnings that never flood a training log: once per key, or once per interval per key."""

from __future__ import annotations

import logging
import threading
import time

_log = logging.getLogger("otel_train")
_warned: set[str] = set()


def warn_once(key: str, msg: str, *args: object) -> None:
    """Log a warning only the first time ``key`` is seen in this process."""
    if key in _warned:
        return
    _warned.add(key)
    _log.warning(msg, *args)


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
