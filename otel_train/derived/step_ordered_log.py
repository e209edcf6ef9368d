"""Warnings about a step, held until the console has printed that step's lines.

The derived-metrics chain takes a frame of steps one processor at a time (``on_views``):
the slow-step and budget processors see the whole frame before the console writes its first
line. Logged at once, a warning about step 120 would come before the fast line of step 100
of the same frame. With the console on, the chain gives those processors this log instead of
the ``otel_train`` logger: it holds each warning with the step it was said about, and the
console releases the held ones once it has written the lines of that step (``release``), so
the console and the warnings read in step order. Nothing is held without a console.

Usage::

    ordered = StepOrderedLog(logging.getLogger("otel_train"))
    slow = SlowStepSpanProcessor(..., logger=ordered)   # it says ``ordered.at(view.step)``
    console = ConsoleReportSpanProcessor(..., ordered_log=ordered)  # releases after each step
"""

from __future__ import annotations

import logging
from typing import Any


class StepOrderedLog:
    """A logger stand-in that holds each record with its step until ``release``."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._held: list[tuple[int | None, int, str, tuple[Any, ...]]] = []
        self._step: int | None = None  # the step the next record is about

    def at(self, step: int | None) -> None:
        """The records logged from now on are about ``step``."""
        self._step = step

    def log(self, level: int, msg: str, *args: Any) -> None:
        """Hold a record until its step's lines are written."""
        self._held.append((self._step, level, msg, args))

    def warning(self, msg: str, *args: Any) -> None:
        """Hold a warning until its step's lines are written."""
        self.log(logging.WARNING, msg, *args)

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 - the logging.Logger name
        """As the logger it stands in for."""
        return self._logger.isEnabledFor(level)

    @property
    def held(self) -> int:
        """Records not yet released."""
        return len(self._held)

    def release(self, through_step: int | None = None) -> None:
        """Log the held records about steps up to ``through_step`` (None: all), in order."""
        held = self._held
        if not held:
            return
        if through_step is None:
            ready, self._held = held, []
        else:
            ready = [r for r in held if r[0] is None or r[0] <= through_step]
            if len(ready) == len(held):
                self._held = []
            else:
                self._held = [r for r in held if not (r[0] is None or r[0] <= through_step)]
        for _, level, msg, args in ready:
            try:
                self._logger.log(level, msg, *args)
            except Exception:  # a failing handler must not stop the chain
                pass
