"""Span export that never slows training, never grows without bound, and never loses
spans silently.

``BoundedBatchSpanProcessor`` is the export stage: a bounded queue drained by its own thread in
batches. It takes span records (steps) and span rows (user spans) through :meth:`on_records`
and queues, for its exporter, the one kind of item that exporter sends (``span_items.py``):
OTLP encoded spans, OTLP/JSON span text, or rows that become SDK spans only at export time for
a plain SDK ``SpanExporter``. It is used instead of the SDK's ``BatchSpanProcessor`` because
that one does not say how many spans it dropped (every drop must be counted and reported),
its shutdown waits for the exporter's whole retry schedule (``benchmarks/bench_shutdown.py``),
and it cannot give up on an export that hangs.

With the single-attempt OTLP exporters of ``otlp/transport.py`` it also rides out collector
restarts (``retrying_send.py``: backoff, probe, no span sent twice).

Used as an SDK span processor (``provider.add_span_processor(stage)``), it makes each
finished span a row as it ends (``on_end``).

Usage::

    stage = BoundedBatchSpanProcessor(create_exporter(plan), drops)
    stage.use_rows(factory)                 # the run's resource, scope and constants
    stage.on_records(records, user_rows)    # from the span worker or the exporter process
    stage.shutdown(2.0)
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from itertools import islice
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_train.common.drop_counter import DropCounter
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.export.json_lines import JsonLinesSpanExporter, read_spans_jsonl
from otel_train.export.otlp.transport import ExportOutcome, PendingSend
from otel_train.export.retrying_send import SingleAttemptSender
from otel_train.export.span_items import ReadableSpanEdge, SpanItems
from otel_train.records.span_rows import (
    C_FLAGS,
    R_FLAGS,
    RowSpanFactory,
    check_row,
    record_span_count,
    row_from_span,
)

__all__ = ["BoundedBatchSpanProcessor", "JsonLinesSpanExporter", "read_spans_jsonl"]

_log = logging.getLogger("otel_train")
_WORKER_MARGIN_SECONDS = 0.05
Item = TypeVar("Item")  # what the exporter sends (span_items.py): one kind per stage


class BoundedBatchSpanProcessor(SpanProcessor, Generic[Item]):
    """Batches sampled spans to an exporter from its own thread, within fixed bounds.

    A batch a single-attempt OTLP exporter could not deliver goes back to the front of the
    queue and the worker backs off (``retrying_send.SingleAttemptSender``); requests are
    split to stay under ``max_request_bytes``.
    """

    def __init__(
        self,
        exporter: Any,
        drops: DropCounter,
        max_queue_size: int = 16384,
        max_batch_size: int = 512,
        interval_seconds: float = 1.0,
        max_request_bytes: int | None = None,
        export_timeout_seconds: float | None = None,
    ) -> None:
        self._exporter = exporter
        self._drops = drops
        self._max_queue = max_queue_size
        self._batch = max_batch_size
        self._interval = interval_seconds
        # Exporters that send once and report what happened are retried here; others retry
        # inside export() themselves and are called as the SDK would.
        self._sender = (SingleAttemptSender(self, exporter, max_request_bytes,
                                            export_timeout_seconds)
                        if callable(getattr(exporter, "start_send", None)) else None)
        self._items: SpanItems | None = None  # set by use_rows: what the queue holds
        self._items_lock = threading.Lock()
        self._queue: deque[Item] = deque()
        # Held by whatever changes the queue (the worker taking a batch, the producer's
        # extend and drop of the oldest, requeue, the clears), which reads ``_queue`` under
        # it: a take copies the batch off and clears or replaces the queue, nothing between.
        self._queue_lock = threading.Lock()
        self._wake = threading.Event()
        self._drain_requested = False  # a flush: everything queued goes at the next wake
        self.stopping = False
        self.deadline: float | None = None  # monotonic; set by shutdown
        self._in_flight = 0
        self._lock = threading.Lock()  # hand-over of the accounting between worker and shutdown
        self._idle = threading.Condition()
        self._warn = RateLimitedLogger(_log)
        self.exported = 0
        self.export_failures = 0
        # Called on the export thread right after each send is accounted for (delivered or
        # counted failed), before the next: the exporter process reports its counts there,
        # so that no batch the collector confirmed goes unreported should it be killed.
        self.on_settled: Callable[[], None] | None = None
        self._abandoned = False  # set when shutdown gave up on a stuck (plain) exporter
        self._thread: threading.Thread | None = threading.Thread(
            target=self._run, name="otel-train-export", daemon=True)
        try:
            self._thread.start()
        except RuntimeError:
            # Python 3.12.0 and 3.12.1 start no thread in an atexit handler (a run whose
            # exporter process never started takes over there): spans are queued, and
            # shutdown exports them from its own thread, within its bound.
            self._thread = None

    # -- what goes in -----------------------------------------------------------------------
    def use_rows(self, factory: RowSpanFactory) -> None:
        """Spans of ``factory``'s resource, scope and run constants: the exporter says what
        it queues for them (its ``span_items``); a plain SDK ``SpanExporter`` gets rows,
        made SDK spans when they are exported (``span_items.ReadableSpanEdge``)."""
        if not callable(getattr(self._exporter, "span_items", None)):
            self._exporter = ReadableSpanEdge(self._exporter, factory)
        self._items = self._exporter.span_items(factory)

    def on_records(self, records: Sequence[tuple[Any, ...]],
                   rows: Sequence[tuple[Any, ...]] = (), skip: int = 0) -> None:
        """Queue the spans of span records (steps) and of span rows (user spans), in order;
        one that cannot be made or encoded is counted (``build_error``), never the batch.
        An unsampled record or row (it fed the metrics only) is never exported. The first
        ``skip`` spans are left out (delivered already, by an exporter process that died)."""
        items = self._items
        if items is None:
            self._bad(RuntimeError("use_rows() was not called"),
                      sum(map(record_span_count, records)) + len(rows))
            return
        out: list[Item] = []
        many = getattr(items, "from_records", None)
        if many is not None:  # the records at once (encoded spans: span ids drawn at once)
            sampled = [rec for rec in records if rec[C_FLAGS] & 1]
            if sampled:
                out = many(sampled, self._bad_record)
        else:
            for rec in records:
                if rec[C_FLAGS] & 1:
                    try:
                        out += items.from_record(rec)
                    except Exception as exc:
                        self._bad_record(rec, exc)
        for row in rows:
            try:
                check_row(row)
                if row[R_FLAGS] & 1:
                    out.append(items.from_row(row))
            except Exception as exc:
                self._bad(exc)
        if skip:
            del out[:skip]
        if out:
            self._enqueue_all(out)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Nothing to do at start."""

    def on_end(self, span: ReadableSpan) -> None:
        """A finished SDK span (the stage as an SDK span processor): its row, queued now.
        Without :meth:`use_rows`, the first span's resource and scope are the stage's."""
        if not span.context.trace_flags.sampled:
            return
        if self._items is None:
            with self._items_lock:
                if self._items is None:
                    self.use_rows(RowSpanFactory(span.resource, span.instrumentation_scope, {}))
        try:
            row = row_from_span(span)
        except Exception as exc:
            self._bad(exc)
            return
        if row is not None:
            self.on_records((), (row,))

    def _bad_record(self, rec: tuple[Any, ...], exc: Exception) -> None:
        self._bad(exc, record_span_count(rec))

    def _bad(self, exc: Exception, spans: int = 1) -> None:
        self._drops.add("build_error", spans)
        self._warn.warning("build", "otel-train: could not export a span: %r", exc)

    def _enqueue_all(self, items: list[Item]) -> None:
        """Queue items at once (one extend, one bound check, one wake at most)."""
        if self.stopping:
            self._drops.add("shutdown_timeout", len(items))
            return
        dropped = 0
        with self._queue_lock:
            q = self._queue
            before = len(q)
            q.extend(items)
            after = len(q)
            if after > self._max_queue:
                dropped = self._drop_oldest(after - self._max_queue)
        if dropped:
            self._count_dropped_oldest(dropped)
        if before < self._batch <= after:
            # Once per batch, not per span: the exporter drains everything queued when it
            # wakes, and while it backs off from a failed collector a wake per span would
            # cut its waits short.
            self._wake.set()

    def _drop_oldest(self, n: int) -> int:
        """Drop the ``n`` oldest queued spans (the newest are the most useful); how many
        were (``_queue_lock`` held: counted by the caller after it)."""
        popleft = self._queue.popleft
        dropped = 0
        for _ in range(n):
            try:
                popleft()
            except IndexError:
                break
            dropped += 1
        return dropped

    def _count_dropped_oldest(self, dropped: int) -> None:
        self._drops.add("export_queue_full", dropped)
        self._warn.warning(
            "queue", "otel-train: export queue full (%d spans): the exporter is "
            "slower than training or the collector is away; dropping the oldest "
            "spans (counted in otel_train_spans_dropped_total)", self._max_queue,
        )

    # -- accounting, for the sender ---------------------------------------------------------
    @property
    def queued(self) -> int:
        """Spans waiting in the queue."""
        return len(self._queue)

    def past_deadline(self) -> bool:
        """Shutdown's deadline has passed."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    def warn(self, key: str, message: str, *args: Any) -> None:
        """A rate-limited warning."""
        self._warn.warning(key, message, *args)

    def _settled(self) -> None:
        hook = self.on_settled
        if hook is not None:
            try:
                hook()
            except Exception:
                _log.debug("on_settled failed", exc_info=True)

    def count_exported(self, n: int) -> None:
        """``n`` spans were delivered."""
        with self._lock:
            self.exported += n
        self._settled()

    def count_failed(self, part: list[Item], why: str) -> None:
        """``part`` will never be delivered: counted as ``export_failed``, warned."""
        with self._lock:
            self.export_failures += 1
            self._drops.add("export_failed", len(part))
        self._settled()
        self._warn.warning(
            "export-failed", "otel-train: span export to %s failed: %s; %d spans dropped "
            "(counted in otel_train_spans_dropped_total{reason=\"export_failed\"})",
            getattr(self._exporter, "where", "the collector"), why, len(part))

    def count_given_up(self, pending: PendingSend, part: list[Item], reason: str) -> None:
        """Count ``part`` dropped; if it turns out delivered after all, un-count it."""
        n = len(part)
        with self._lock:
            self.export_failures += 1
            self._drops.add(reason, n)
        self._settled()

        def late(outcome: ExportOutcome) -> None:
            if outcome is ExportOutcome.SENT:
                with self._lock:
                    self.exported += n
                    self._drops.retract(reason, n)

        pending.give_up(late, cancel=True)

    def requeue(self, parts: list[list[Item]]) -> None:
        """Put undelivered spans back at the front, oldest first; trim to the bound."""
        dropped = 0
        with self._queue_lock:
            q = self._queue
            for part in reversed(parts):
                q.extendleft(reversed(part))
            over = len(q) - self._max_queue
            while over > 0:
                try:
                    q.popleft()
                except IndexError:
                    break
                over -= 1
                dropped += 1
        self._drops.add("export_queue_full", dropped)

    # -- the worker -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                drain = self._pause()
                self._export_available(drain)
                if self.stopping and (not self._queue or self.past_deadline()):
                    return
        finally:
            with self._lock:
                if not self._abandoned:
                    lost = self._clear_queue()
                    self._drops.add("shutdown_timeout", lost)
            with self._idle:
                self._idle.notify_all()

    def _pause(self) -> bool:
        """Wait for the next batch: the interval when healthy, the backoff after a failure.
        True when everything queued goes now (the interval passed, a flush, shutdown, a
        retry); False when a full batch woke the worker: full batches go, and the rest waits
        for the next one or the interval (each request has a fixed cost, so it carries a
        full batch while spans come faster than a batch an interval)."""
        sender = self._sender
        if sender is not None and sender.retry_at:
            sender.pause(self._wake, self.deadline)
            return True
        woke = self._wake.wait(self._interval)
        self._wake.clear()
        if self._drain_requested:
            self._drain_requested = False
            return True
        return not woke or self.stopping

    def _export_available(self, drain: bool = True) -> None:
        """Send the queued spans in batches: all of them (``drain``), else the full batches."""
        while len(self._queue) >= self._batch or (drain and self._queue):
            if self.stopping and self.past_deadline():
                return
            batch = self._take_batch()
            if not batch:
                return
            with self._lock:
                self._in_flight = len(batch)
            go_on = self._sender.send(batch) if self._sender else self._send_plain(batch)
            with self._lock:
                self._in_flight = 0
            with self._idle:
                self._idle.notify_all()
            if not go_on:
                return

    def _take_batch(self) -> list[Item]:
        """The oldest spans queued, up to a batch, copied off at once (not a pop per span):
        the queue emptied, or the rest of it made the queue."""
        with self._queue_lock:
            q = self._queue
            if len(q) <= self._batch:
                batch = list(q)
                q.clear()
                return batch
            batch = list(islice(q, self._batch))
            self._queue = deque(islice(q, self._batch, None))
            return batch

    def _clear_queue(self) -> int:
        """Empty the queue; how many spans it held."""
        with self._queue_lock:
            lost = len(self._queue)
            self._queue.clear()
        return lost

    def _send_plain(self, batch: list[Item]) -> bool:
        """An exporter with a blocking export() (it retries on its own)."""
        try:
            result = self._exporter.export(batch)
        except Exception as exc:
            result = SpanExportResult.FAILURE
            self._warn.warning("export-exc", "otel-train: span export raised %r", exc)
        with self._lock:
            abandoned = self._abandoned
            if result is SpanExportResult.SUCCESS:
                self.exported += len(batch)
                if abandoned:
                    # Shutdown gave up on this batch and counted it as shutdown_timeout; it
                    # arrived after all, so the count is corrected: every span counted once.
                    self._drops.retract("shutdown_timeout", len(batch))
            elif not abandoned:
                self.export_failures += 1
                self._drops.add("export_failed", len(batch))
        self._settled()
        if abandoned:
            self._close_exporter()  # shutdown left that to us, so as not to cancel it
            return False
        if result is not SpanExportResult.SUCCESS:
            self._warn.warning(
                "export-failed", "otel-train: span export failed (%d spans dropped, counted in "
                "otel_train_spans_dropped_total{reason=\"export_failed\"}); is the collector "
                "reachable?", len(batch))
        return True

    # -- flush and shutdown -----------------------------------------------------------------
    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export what is queued now; True when it all went out within the timeout."""
        deadline = time.monotonic() + timeout_millis / 1000
        self._drain_requested = True
        self._wake.set()
        with self._idle:
            while self._queue or self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return False
                self._drain_requested = True
                self._wake.set()
                self._idle.wait(min(left, 0.05))
        return True

    def shutdown(self, timeout_seconds: float = 2.0) -> None:  # type: ignore[override]
        """Export what can be within ``timeout_seconds``; count the rest as dropped.

        Returns within ``timeout_seconds`` whatever the collector does: an export still in
        flight at the deadline is given up (a gRPC call is cancelled), counted as
        ``shutdown_timeout``, and un-counted should it still arrive.
        """
        if self.stopping:
            return
        deadline = time.monotonic() + max(0.0, timeout_seconds)
        # The worker stops a little before the deadline, so that it has accounted for
        # everything by the time this returns.
        self.deadline = deadline - min(_WORKER_MARGIN_SECONDS, timeout_seconds * 0.1)
        self.stopping = True
        if self._sender is not None:
            self._sender.retry_at = 0.0  # one more attempt right away (fails fast if down)
        self._wake.set()
        if self._thread is None:  # no export thread could start: the worker's loop, here
            self._run()
        else:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread is not None and self._thread.is_alive():
            self._abandon(timeout_seconds)
            return
        with self._lock:  # a span that slipped in while the worker was finishing
            lost = self._clear_queue()
            self._drops.add("shutdown_timeout", lost)
        self._close_within(deadline)

    def _abandon(self, timeout_seconds: float) -> None:
        """A plain exporter is stuck (collector hanging): give up on what is left."""
        with self._lock:
            self._abandoned = True
            lost = self._clear_queue() + self._in_flight
            self._drops.add("shutdown_timeout", lost)
        _log.warning("otel-train: span export did not finish within %.1fs; %d span(s) dropped",
                     timeout_seconds, lost)
        # Closing the exporter now would cancel that export (and a collector that was merely
        # slow would get the spans we count as lost): the export thread closes it when the
        # export returns, and corrects the count if it went through.

    def _close_within(self, deadline: float) -> None:
        """The exporter's own shutdown may block (gRPC channel close): bound it too."""
        closer = threading.Thread(target=self._close_exporter, daemon=True,
                                  name="otel-train-export-close")
        try:
            closer.start()
        except RuntimeError:
            # No new thread at interpreter exit (Python 3.12.0, 3.12.1): left open, as
            # closing here is unbounded (a gRPC channel's close waits for a thread that
            # never started); the process is ending and its sockets close with it.
            return
        closer.join(max(0.0, deadline - time.monotonic()))

    def _close_exporter(self) -> None:
        try:
            self._exporter.shutdown()
        except Exception:
            _log.debug("exporter shutdown failed", exc_info=True)
