"""StepOrderedLog: warnings held until their step's console lines are written."""

from __future__ import annotations

import logging

from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.derived.step_ordered_log import StepOrderedLog


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _logger(name: str) -> tuple[logging.Logger, _Records]:
    logger = logging.getLogger(name)
    logger.propagate = False
    handler = _Records()
    logger.handlers[:] = [handler]
    return logger, handler


def test_a_warning_is_held_until_its_step_is_released_and_later_ones_wait() -> None:
    logger, got = _logger("test.ordered.hold")
    ordered = StepOrderedLog(logger)
    ordered.at(3)
    ordered.warning("slow step %d", 3)
    ordered.at(7)
    ordered.warning("slow step %d", 7)
    assert got.messages == [] and ordered.held == 2
    ordered.release(5)
    assert got.messages == ["slow step 3"] and ordered.held == 1
    ordered.release(7)
    assert got.messages == ["slow step 3", "slow step 7"] and ordered.held == 0


def test_release_of_everything_keeps_the_order_the_warnings_were_said_in() -> None:
    logger, got = _logger("test.ordered.all")
    ordered = StepOrderedLog(logger)
    for step in (4, 2, 9):
        ordered.at(step)
        ordered.warning("about %d", step)
    ordered.release()
    assert got.messages == ["about 4", "about 2", "about 9"]


def test_a_rate_limited_logger_on_top_holds_its_warnings_too() -> None:
    logger, got = _logger("test.ordered.rate")
    ordered = StepOrderedLog(logger)
    warn = RateLimitedLogger(ordered, 60.0)  # type: ignore[arg-type]
    ordered.at(10)
    assert warn.warning("k", "budget %s", "critical")
    assert not warn.warning("k", "budget %s", "critical")  # limited before it is held
    assert got.messages == []
    ordered.release(10)
    assert got.messages == ["budget critical"]


def test_a_failing_handler_does_not_stop_the_release() -> None:
    logger, got = _logger("test.ordered.fail")

    class Broken(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            raise RuntimeError("handler down")

        def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802
            raise RuntimeError("and its error handling too")

    logger.handlers.insert(0, Broken())
    ordered = StepOrderedLog(logger)
    ordered.at(1)
    ordered.warning("first")
    ordered.warning("second")
    ordered.release()
    assert ordered.held == 0
