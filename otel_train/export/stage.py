"""Span export that never slows training, never grows without bound, and never loses
spans silently.

``BoundedBatchSpanProcessor`` is the export stage of the pipeline (after the derived-metrics
processors): a bounded queue drained by its own thread in batches. We use it instead of the
SDK's ``BatchSpanProcessor`` for three measured reasons: the SDK's processor does not expose
how many spans it dropped (we must count and report every drop), its shutdown waits for the
exporter's whole retry schedule (about 28 s with the collector down, measured with
``benchmarks/bench_shutdown.py``), and it cannot give up on an export that hangs.

With the single-attempt OTLP exporters of ``otlp_transport.py`` it also rides out collector
restarts: an undelivered batch goes back to the front of the queue (only the queue's bound
drops spans, oldest first, counted), the worker backs off exponentially with jitter, and a
cheap TCP probe notices within a quarter second that a collector which refused connections
is back. No span is sent twice: a request that timed out after it was sent is counted as
dropped (and un-counted should its answer still come). ``benchmarks/bench_collector_down.py
--flapping`` measures it against a collector down 3 s / up 3 s for a minute.

``JsonLinesSpanExporter`` writes one JSON object per span per line (the SDK's ``to_json``
shape). The embedded default is ``otlp_json_file.OtlpJsonFileSpanExporter`` (the
OpenTelemetry file format), so a first run needs no collector.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_train.common.drop_counter import DropCounter
from otel_train.export.otlp.transport import (
    DEFAULT_MAX_REQUEST_BYTES,
    ExportOutcome,
    PendingSend,
)
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.records.span_rows import (
    C_FLAGS,
    R_FLAGS,
    RowSpanFactory,
    check_row,
    record_span_count,
    rows_from_record,
)

_log = logging.getLogger("otel_train")
# Retry schedule after a batch could not be delivered: 0.5 s doubling to 5 s, +-20% jitter
# (so ranks that lost the same collector do not come back in lockstep).
_BACKOFF_INITIAL_SECONDS = 0.5
_BACKOFF_MAX_SECONDS = 5.0
# While the collector's port refuses connections it is probed this often: a TCP connect,
# far cheaper than encoding and sending a batch, and it notices the collector is back
# within a fraction of a second.
_PROBE_INTERVAL_SECONDS = 0.25
_PROBE_TIMEOUT_SECONDS = 0.2
# A batch the collector keeps refusing while it is reachable is dropped after this many
# tries, so that one poison batch cannot hold back the rest.
_MAX_TRIES_WHILE_REACHABLE = 5
# The collector accepts connections but the send could not connect: retried at most this
# often (it came back as we failed, or something answers on its port that is not for us).
_RACE_RETRY_SECONDS = 1.0
_MIN_REQUEST_BYTES = 64 * 1024
_WAIT_SLICE_SECONDS = 0.05
_TIMEOUT_SLACK_SECONDS = 0.5
_WORKER_MARGIN_SECONDS = 0.05


class BoundedBatchSpanProcessor(SpanProcessor):
    """Batches sampled spans to an exporter from its own thread, within fixed bounds.

    With a single-attempt OTLP exporter (otlp_transport.py) it also rides out collector
    outages: a batch that could not be delivered goes back to the front of the queue, the
    worker backs off (exponential, capped, with jitter) and, while the collector's port
    refuses connections, probes it every quarter second so the first batch goes out as soon
    as it is back. Requests are split to stay under ``max_request_bytes``.
    """

    def __init__(
        self,
        exporter: SpanExporter,
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
        # Exporters that send once and report what happened (we retry); others retry inside
        # export() themselves and are called as the SDK would.
        self._single = callable(getattr(exporter, "start_send", None))
        self._max_request = int(max_request_bytes or getattr(exporter, "max_request_bytes", 0)
                                or DEFAULT_MAX_REQUEST_BYTES)
        self._timeout = float(export_timeout_seconds
                              or getattr(exporter, "timeout_seconds", 0) or 10.0)
        self._queue: deque[ReadableSpan] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._deadline: float | None = None  # monotonic; set by shutdown
        self._in_flight = 0
        self._lock = threading.Lock()  # hand-over of the accounting between worker and shutdown
        self._idle = threading.Condition()
        self._warn = RateLimitedLogger(_log)
        self.exported = 0
        self.export_failures = 0
        # Backoff after a batch could not be delivered: when to try again, the current step,
        # and whether the collector's port refused the probe (then it is probed until back).
        self._retry_at = 0.0
        self._backoff_seconds = 0.0
        self._collector_down = False
        self._seen_down = False  # the probe failed since the last failure
        self._failed_at = 0.0
        self._tries = 0
        self._abandoned = False  # set when shutdown gave up on a stuck (plain) exporter
        self._factory: RowSpanFactory | None = None  # use_rows: records and rows taken too
        self._takes_rows = False  # ... and queued as rows, the exporter encoding them
        # ... or a record straight to its Span messages (the exporter's encode_record): the
        # queue then holds encoded spans, no row made (the exporter process's OTLP path).
        self._encode_record: Any = None
        self._thread: threading.Thread | None = threading.Thread(
            target=self._run, name="otel-train-export", daemon=True)
        try:
            self._thread.start()
        except RuntimeError:
            # Python 3.12.0 and 3.12.1 start no thread in an atexit handler (a run whose
            # exporter process never started takes over there): spans are queued, and
            # shutdown exports them from its own thread, within its bound.
            self._thread = None

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Nothing to do at start."""

    def on_end(self, span: ReadableSpan) -> None:
        """Queue a sampled span; when the queue is full the oldest span is dropped (counted)."""
        if span.context.trace_flags.sampled:
            self._enqueue(span)

    def use_rows(self, factory: RowSpanFactory) -> None:
        """Take span records and rows (span_rows.py) through :meth:`on_records`: queued as
        rows when the exporter encodes rows itself (its ``use_rows``: no ``ReadableSpan`` is
        made; a record is encoded straight to its spans' bytes where the exporter can send
        them, ``takes_records``), else as the spans ``factory`` makes of them."""
        self._factory = factory
        if hasattr(self._exporter, "use_rows"):
            self._exporter.use_rows(factory.resource, factory.scope, factory.run_constants)
            self._takes_rows = True
            if getattr(self._exporter, "takes_records", False):
                self._encode_record = self._exporter.encode_record

    def on_records(self, records: Sequence[tuple[Any, ...]],
                   rows: Sequence[tuple[Any, ...]] = ()) -> None:
        """Queue the spans of span records (steps) and of span rows (user spans), in order;
        one that cannot be made or encoded is counted (``build_error``), never the batch.
        An unsampled record (it fed the metrics only) is never exported."""
        encode = self._encode_record
        encoded: list[bytes] = []  # the spans' bytes: queued at once, after the records
        for rec in records:
            if not rec[C_FLAGS] & 1:
                continue
            try:
                made = rows_from_record(rec) if encode is None else encode(rec)
            except Exception as exc:
                self._bad(exc, record_span_count(rec))
                continue
            if encode is None:
                for row in made:
                    self._on_row(row)
            else:
                encoded += made
        if encoded:
            self._enqueue_all(encoded)
        for row in rows:
            self._on_row(row)

    def _on_row(self, row: tuple[Any, ...]) -> None:
        try:
            check_row(row)
            if self._takes_rows:
                if row[R_FLAGS] & 1:  # sampled
                    self._enqueue(row)
            else:
                self.on_end(self._factory.span(row))
        except Exception as exc:
            self._bad(exc)

    def _bad(self, exc: Exception, spans: int = 1) -> None:
        self._drops.add("build_error", spans)
        self._warn.warning("build", "otel-train: could not export a span: %r", exc)

    def _enqueue(self, span: Any) -> None:
        if self._stopping:
            self._drops.add("shutdown_timeout")
            return
        q = self._queue
        q.append(span)
        if len(q) > self._max_queue:
            self._drop_oldest(1)
        if len(q) == self._batch:
            # Once per batch, not per span: the exporter drains everything queued when it
            # wakes, and while it backs off from a failed collector a wake per span would
            # cut its waits short (one Event.set per span, each a lock and a notify).
            self._wake.set()

    def _enqueue_all(self, spans: list[Any]) -> None:
        """Queue a frame's spans at once (one extend, one bound check, one wake at most)."""
        if self._stopping:
            self._drops.add("shutdown_timeout", len(spans))
            return
        q = self._queue
        before = len(q)
        q.extend(spans)
        after = len(q)
        if after > self._max_queue:
            self._drop_oldest(after - self._max_queue)
        if before < self._batch <= after:  # as _enqueue: when a batch's worth is queued
            self._wake.set()

    def _drop_oldest(self, n: int) -> None:
        """Drop the ``n`` oldest queued spans (the newest are the most useful), counted."""
        q = self._queue
        dropped = 0
        for _ in range(n):
            try:
                q.popleft()
            except IndexError:  # the export thread took them meanwhile
                break
            dropped += 1
        if dropped:
            self._drops.add("export_queue_full", dropped)
            self._warn.warning(
                "queue", "otel-train: export queue full (%d spans): the exporter is "
                "slower than training or the collector is away; dropping the oldest "
                "spans (counted in otel_train_spans_dropped_total)", self._max_queue,
            )

    # -- the worker -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                self._pause()
                self._export_available()
                if self._stopping and (not self._queue or self._past_deadline()):
                    return
        finally:
            with self._lock:
                if not self._abandoned:
                    lost = len(self._queue)
                    self._queue.clear()
                    self._drops.add("shutdown_timeout", lost)
            with self._idle:
                self._idle.notify_all()

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _pause(self) -> None:
        """Wait for the next batch: the interval when healthy, the backoff after a failure."""
        if not self._retry_at:
            self._wake.wait(self._interval)
            self._wake.clear()
            return
        exporter: Any = self._exporter
        while True:
            now = time.monotonic()
            end = self._retry_at
            if self._deadline is not None:
                end = min(end, self._deadline)
            if now >= end:
                return
            if self._collector_down:
                up = exporter.probe(_PROBE_TIMEOUT_SECONDS)
                if up is False:
                    self._seen_down = True
                elif up and (self._seen_down
                             or now - self._failed_at >= _RACE_RETRY_SECONDS):
                    # Back: reconnect at once rather than after the transport's own backoff.
                    # (Seen down then up; or up at once: it came back as we failed, or it
                    # accepts connections but not ours, so tried again no faster than 1/s.)
                    exporter.reconnect()
                    self._collector_down = False
                    self._retry_at = time.monotonic()
                    return
            self._wake.wait(min(_PROBE_INTERVAL_SECONDS, max(0.0, end - now)))
            self._wake.clear()

    def _export_available(self) -> None:
        q = self._queue
        while q:
            if self._stopping and self._past_deadline():
                return
            batch: list[ReadableSpan] = []
            take, popleft = batch.append, q.popleft
            try:  # a batch of thousands of spans: one pop per span, no test per span
                for _ in range(min(len(q), self._batch)):
                    take(popleft())
            except IndexError:  # the producer dropped the oldest meanwhile
                pass
            if not batch:
                return
            with self._lock:
                self._in_flight = len(batch)
            go_on = self._send_once(batch) if self._single else self._send_plain(batch)
            with self._lock:
                self._in_flight = 0
            with self._idle:
                self._idle.notify_all()
            if not go_on:
                return

    def _send_plain(self, batch: list[ReadableSpan]) -> bool:
        """An ordinary SpanExporter: one blocking export() (it retries on its own)."""
        try:
            result = self._exporter.export(batch)
        except Exception as exc:
            result = SpanExportResult.FAILURE
            self._warn.warning("export-exc", "otel-train: span export raised %r", exc)
        with self._lock:
            if self._abandoned:
                # Shutdown gave up on this batch and counted it as shutdown_timeout; it
                # arrived after all, so the count is corrected: every span counted once.
                if result is SpanExportResult.SUCCESS:
                    self.exported += len(batch)
                    self._drops.retract("shutdown_timeout", len(batch))
                abandoned = True
            else:
                abandoned = False
                if result is SpanExportResult.SUCCESS:
                    self.exported += len(batch)
                else:
                    self.export_failures += 1
                    self._drops.add("export_failed", len(batch))
        if abandoned:
            self._close_exporter()  # shutdown left that to us, so as not to cancel it
            return False
        if result is not SpanExportResult.SUCCESS:
            self._warn.warning(
                "export-failed", "otel-train: span export failed (%d spans dropped, counted in "
                "otel_train_spans_dropped_total{reason=\"export_failed\"}); is the collector "
                "reachable?", len(batch))
        return True

    def _send_once(self, batch: list[ReadableSpan]) -> bool:
        """Send with a single-attempt exporter; False when the worker must back off."""
        exporter: Any = self._exporter
        parts: list[list[ReadableSpan]] = [batch]
        while parts:
            part = parts.pop(0)
            try:
                body = exporter.encode(part)
            except Exception as exc:
                self._fail(part, f"encoding failed: {exc!r}")
                continue
            if len(body) > self._max_request:
                if len(part) > 1:  # split: no request may exceed the receiver's limit
                    half = len(part) // 2
                    parts[0:0] = [part[:half], part[half:]]
                else:
                    self._fail(part, f"one span encodes to {len(body)} bytes, over the "
                               f"{self._max_request}-byte request limit")
                continue
            timeout = self._timeout
            if self._deadline is not None:  # shutting down: no request outlives its bound
                timeout = max(0.05, min(timeout, self._deadline - time.monotonic()))
            pending = exporter.start_send(part, body, timeout)
            outcome = self._await(pending)
            if outcome is None:  # gave up on it: its timeout, or shutdown's deadline
                stopping = self._stopping and self._past_deadline()
                reason = "shutdown_timeout" if stopping else "export_failed"
                self._count_given_up(pending, part, reason)
                self._requeue(parts)
                if not stopping:
                    self._back_off(f"no answer within {self._timeout:.1f} s")
                return False
            if outcome is ExportOutcome.SENT:
                with self._lock:
                    self.exported += len(part)
                self._retry_at = self._backoff_seconds = 0.0
                self._tries = 0
                continue
            if outcome is ExportOutcome.TOO_LARGE:
                learnt = pending.limit_bytes or max(_MIN_REQUEST_BYTES, len(body) // 2)
                self._max_request = max(_MIN_REQUEST_BYTES, min(self._max_request, learnt))
                if len(part) > 1 and len(body) > self._max_request:
                    parts.insert(0, part)  # split again under the limit the receiver told us
                else:
                    self._fail(part, f"the collector refused a {len(body)}-byte request as "
                               "too large")
                continue
            if outcome is ExportOutcome.REJECTED:
                self._fail(part, f"the collector rejected it ({pending.detail})")
                continue
            if outcome is ExportOutcome.UNKNOWN:
                # It may have arrived: sending it again could deliver it twice.
                self._count_given_up(pending, part, "export_failed")
                self._requeue(parts)
                self._back_off(pending.detail or "no answer")
                return False
            # RETRY: not delivered; it goes back to the front of the queue.
            self._back_off(pending.detail, pending.unreachable)
            self._tries = 0 if self._collector_down else self._tries + 1
            if self._tries >= _MAX_TRIES_WHILE_REACHABLE:
                # The collector is up yet keeps refusing this batch: don't let it block.
                self._tries = 0
                self._fail(part, f"refused {_MAX_TRIES_WHILE_REACHABLE} times "
                           f"({pending.detail})")
                self._requeue(parts)
            else:
                self._requeue([part, *parts])
            return False
        return True

    def _await(self, pending: PendingSend) -> ExportOutcome | None:
        """The send's outcome, waiting at most the export timeout and never past shutdown."""
        limit = time.monotonic() + self._timeout + _TIMEOUT_SLACK_SECONDS
        while True:
            end = limit if self._deadline is None else min(limit, self._deadline)
            outcome = pending.wait(min(_WAIT_SLICE_SECONDS, max(0.0, end - time.monotonic())))
            if outcome is not None:
                return outcome
            if time.monotonic() >= end:
                return None

    def _count_given_up(self, pending: PendingSend, part: list[ReadableSpan],
                        reason: str) -> None:
        """Count ``part`` dropped; if it turns out delivered after all, un-count it."""
        n = len(part)
        with self._lock:
            self.export_failures += 1
            self._drops.add(reason, n)

        def late(outcome: ExportOutcome) -> None:
            if outcome is ExportOutcome.SENT:
                with self._lock:
                    self.exported += n
                    self._drops.retract(reason, n)

        pending.give_up(late, cancel=True)

    def _fail(self, part: list[ReadableSpan], why: str) -> None:
        with self._lock:
            self.export_failures += 1
            self._drops.add("export_failed", len(part))
        self._warn.warning(
            "export-failed", "otel-train: span export failed: %s; %d span(s) dropped "
            "(counted in otel_train_spans_dropped_total{reason=\"export_failed\"})",
            why, len(part))

    def _requeue(self, parts: list[list[ReadableSpan]]) -> None:
        """Put undelivered spans back at the front, oldest first; trim to the bound."""
        q = self._queue
        for part in reversed(parts):
            q.extendleft(reversed(part))
        over = len(q) - self._max_queue
        dropped = 0
        while over > 0:
            try:
                q.popleft()
            except IndexError:
                break
            over -= 1
            dropped += 1
        self._drops.add("export_queue_full", dropped)

    def _back_off(self, detail: str, unreachable: bool = False) -> None:
        self._backoff_seconds = min(_BACKOFF_MAX_SECONDS,
                                    max(_BACKOFF_INITIAL_SECONDS, self._backoff_seconds * 2))
        self._failed_at = now = time.monotonic()
        self._retry_at = now + self._backoff_seconds * random.uniform(0.8, 1.2)
        probe = getattr(self._exporter, "probe", None)
        self._seen_down = probe is not None and probe(_PROBE_TIMEOUT_SECONDS) is False
        self._collector_down = self._seen_down or (unreachable and probe is not None)
        self._warn.warning(
            "export-retry", "otel-train: span export did not go through (%s); %d span(s) "
            "kept queued, retrying in %.1f s%s", detail or "no detail", len(self._queue),
            self._backoff_seconds,
            " or as soon as the collector accepts connections" if self._collector_down else "")

    # -- flush and shutdown -----------------------------------------------------------------
    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export what is queued now; True when it all went out within the timeout."""
        deadline = time.monotonic() + timeout_millis / 1000
        self._wake.set()
        with self._idle:
            while self._queue or self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or not self._thread.is_alive():
                    return False
                self._wake.set()
                self._idle.wait(min(left, 0.05))
        return True

    def shutdown(self, timeout_seconds: float = 2.0) -> None:  # type: ignore[override]
        """Export what can be within ``timeout_seconds``; count the rest as dropped.

        Returns within ``timeout_seconds`` whatever the collector does: an export still in
        flight at the deadline is given up (a gRPC call is cancelled), counted as
        ``shutdown_timeout``, and un-counted should it still arrive.
        """
        if self._stopping:
            return
        start = time.monotonic()
        deadline = start + max(0.0, timeout_seconds)
        # The worker stops a little before the deadline, so that it has accounted for
        # everything by the time this returns.
        self._deadline = deadline - min(_WORKER_MARGIN_SECONDS, timeout_seconds * 0.1)
        self._stopping = True
        self._retry_at = 0.0  # one more attempt right away (it fails fast if still down)
        self._wake.set()
        if self._thread is None:  # no export thread could start: the worker's loop, here
            self._run()
        else:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread is not None and self._thread.is_alive():
            # A plain exporter is stuck (collector hanging): give up on what is left.
            with self._lock:
                self._abandoned = True
                lost = len(self._queue) + self._in_flight
                self._queue.clear()
                self._drops.add("shutdown_timeout", lost)
            _log.warning(
                "otel-train: span export did not finish within %.1fs; %d span(s) dropped",
                timeout_seconds, lost,
            )
            # Closing the exporter now would cancel that export (and a collector that was
            # merely slow would get the spans we count as lost): the export thread closes it
            # when the export returns, and corrects the count if it went through.
            return
        with self._lock:  # a span that slipped in while the worker was finishing
            lost = len(self._queue)
            self._queue.clear()
            self._drops.add("shutdown_timeout", lost)
        # The exporter's own shutdown may block (gRPC channel close): bound it too.
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


class JsonLinesSpanExporter(SpanExporter):
    """Writes each span as one line of JSON (the SDK's ``ReadableSpan.to_json`` shape)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Append the spans, one JSON object per line, and flush."""
        lines = [span.to_json(indent=None) for span in spans]
        with self._lock:
            if self._file is None:
                return SpanExportResult.FAILURE
            self._file.write("\n".join(lines) + "\n")
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Close the file."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Lines are flushed on every export."""
        return True


def read_spans_jsonl(path: str | os.PathLike[str]) -> list[dict[str, object]]:
    """Read back a JSON-lines span file (for tests, the CLI and notebooks)."""
    out: list[dict[str, object]] = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out
