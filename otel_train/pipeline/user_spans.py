"""The edge in: user spans opened with the OTel API become span rows as they end.

With otel-train's run-scoped provider, a span a user opens inside a phase is an SDK span; its
provider hands it to :class:`UserSpanRows` when it ends, which makes it a row at once
(``span_rows.row_from_span``) and keeps it, bounded, until the span worker's next drain takes
it with the steps' records (``span_worker.py``). From there it travels the route every span
travels.

Usage::

    user_rows = UserSpanRows(drops, max_rows=16384)
    sdk_provider.add_span_processor(user_rows)
    rows = user_rows.take()        # in the span worker
    user_rows.close()              # the worker stopped: later spans are counted, not kept
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from otel_train.common.drop_counter import DropCounter
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.records.span_rows import row_from_span

_log = logging.getLogger("otel_train")


class UserSpanRows(SpanProcessor):
    """Rows of the user spans that ended since the last drain, the oldest dropped past the
    bound (counted)."""

    def __init__(self, drops: DropCounter, max_rows: int) -> None:
        self._drops = drops
        self._max_rows = max_rows
        self._rows: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()  # spans end on the training thread, drains elsewhere
        self._closed = False
        self._warn = RateLimitedLogger(_log)

    @property
    def waiting(self) -> int:
        """Rows waiting for the next drain."""
        return len(self._rows)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Nothing to do at start."""

    def on_end(self, span: ReadableSpan) -> None:
        """Make a sampled span a row and keep it; never raises into the caller."""
        try:
            if not span.context.trace_flags.sampled:
                return
            row = row_from_span(span)
        except Exception as exc:
            self._drops.add("build_error")
            self._warn.warning("row", "otel-train: could not export a span: %r", exc)
            return
        if row is None:
            return
        with self._lock:
            if self._closed:
                self._drops.add("shutdown_timeout")
                return
            self._rows.append(row)
            over = len(self._rows) - self._max_rows
            if over > 0:
                del self._rows[:over]
                self._drops.add("export_queue_full", over)

    def take(self) -> list[tuple[Any, ...]]:
        """The rows kept so far, no longer kept."""
        with self._lock:
            rows, self._rows = self._rows, []
        return rows

    def close(self) -> None:
        """From now on a span that ends is counted (``shutdown_timeout``), not kept."""
        with self._lock:
            self._closed = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """The span worker's drain takes the rows (``RunTelemetry.flush`` drains first)."""
        return True

    def shutdown(self) -> None:
        """Nothing of its own to stop."""
