"""Span export that never slows training, never grows without bound, and never loses
spans silently.

``BoundedBatchSpanProcessor`` is the export stage of the pipeline (after the derived-metrics
processors): a bounded queue drained by its own thread in batches. We use it instead of the
SDK's ``BatchSpanProcessor`` for three measured reasons: the SDK's processor does not expose
how many spans it dropped (we must count and report every drop), its shutdown waits for the
exporter's whole retry schedule (about 28 s with the collector down, measured with
``benchmarks/bench_shutdown.py``), and it cannot give up on an export that hangs.

``JsonLinesSpanExporter`` is the embedded default: one JSON object per span per line in a
local file, so a first run needs no collector.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_train.drop_counter import DropCounter
from otel_train.rate_limited_log import RateLimitedLogger

_log = logging.getLogger("otel_train")


class BoundedBatchSpanProcessor(SpanProcessor):
    """Batches sampled spans to an exporter from its own thread, within fixed bounds."""

    def __init__(
        self,
        exporter: SpanExporter,
        drops: DropCounter,
        max_queue_size: int = 16384,
        max_batch_size: int = 512,
        interval_seconds: float = 1.0,
    ) -> None:
        self._exporter = exporter
        self._drops = drops
        self._max_queue = max_queue_size
        self._batch = max_batch_size
        self._interval = interval_seconds
        self._queue: deque[ReadableSpan] = deque()
        self._wake = threading.Event()
        self._stopping = False
        self._in_flight = 0
        self._idle = threading.Condition()
        self._warn = RateLimitedLogger(_log)
        self.exported = 0
        self.export_failures = 0
        # Circuit breaker: after a failed export, spans are dropped (and counted) at once,
        # without queueing or encoding, until a retry time; the next batch probes again.
        self._open_until = 0.0
        self._backoff_seconds = 0.0
        self._abandoned = False  # set when shutdown gave up on a stuck export
        self._thread = threading.Thread(target=self._run, name="otel-train-export", daemon=True)
        self._thread.start()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Nothing to do at start."""

    def on_end(self, span: ReadableSpan) -> None:
        """Queue a sampled span; count it as dropped when the queue is full."""
        if not span.context.trace_flags.sampled:
            return
        if self._open_until and time.monotonic() < self._open_until:
            self._drops.add("export_failed")
            return
        q = self._queue
        if self._stopping:
            self._drops.add("shutdown_timeout")
            return
        if len(q) >= self._max_queue:
            self._drops.add("export_queue_full")
            self._warn.warning(
                "queue", "otel-train: export queue full (%d spans): the exporter is slower "
                "than training; dropping spans (counted in otel_train_spans_dropped_total)",
                self._max_queue,
            )
            return
        q.append(span)
        if len(q) >= self._batch:
            self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            self._export_available()
            if self._stopping and not self._queue:
                return

    def _export_available(self) -> None:
        q = self._queue
        while q:
            batch: list[ReadableSpan] = []
            while q and len(batch) < self._batch:
                batch.append(q.popleft())
            self._in_flight = len(batch)
            try:
                result = self._exporter.export(batch)
            except Exception as exc:
                result = SpanExportResult.FAILURE
                self._warn.warning("export-exc", "otel-train: span export raised %r", exc)
            self._in_flight = 0
            if self._abandoned:
                # Shutdown gave up on this batch and counted it as shutdown_timeout; it
                # arrived after all, so the count is corrected: every span counted once.
                if result is SpanExportResult.SUCCESS:
                    self.exported += len(batch)
                    self._drops.retract("shutdown_timeout", len(batch))
                self._close_exporter()  # shutdown left that to us, so as not to cancel it
                return
            if result is SpanExportResult.SUCCESS:
                self.exported += len(batch)
                self._open_until = 0.0
                self._backoff_seconds = 0.0
            else:
                self.export_failures += 1
                # Open the breaker (5 s, doubling to 60 s): what is queued now would only
                # fail too, so count it dropped instead of spending CPU encoding it.
                self._backoff_seconds = min(60.0, max(5.0, self._backoff_seconds * 2))
                self._open_until = time.monotonic() + self._backoff_seconds
                lost = len(batch) + len(q)
                q.clear()
                self._drops.add("export_failed", lost)
                self._warn.warning(
                    "export-failed", "otel-train: span export failed (%d spans dropped, "
                    "counted in otel_train_spans_dropped_total{reason=\"export_failed\"}); "
                    "is the collector reachable? retrying in %.0f s", lost,
                    self._backoff_seconds,
                )
            with self._idle:
                self._idle.notify_all()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Export what is queued now; True when it all went out within the timeout."""
        deadline = time.monotonic() + timeout_millis / 1000
        self._wake.set()
        with self._idle:
            while self._queue or self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.set()
                self._idle.wait(min(left, 0.05))
        return True

    def shutdown(self, timeout_seconds: float = 2.0) -> None:  # type: ignore[override]
        """Export what can be within ``timeout_seconds``; count the rest as dropped."""
        if self._stopping:
            return
        deadline = time.monotonic() + timeout_seconds
        self._stopping = True
        self._wake.set()
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            # The exporter is stuck (collector hanging): give up on what is left.
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
        # The exporter's own shutdown may block (gRPC channel close): bound it too.
        closer = threading.Thread(target=self._close_exporter, daemon=True,
                                  name="otel-train-export-close")
        closer.start()
        closer.join(max(0.05, deadline - time.monotonic()))

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
