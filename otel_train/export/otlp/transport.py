"""OTLP span exporters that make exactly one attempt per call and never block past a bound.

The SDK's OTLP exporters retry inside ``export()`` for up to their whole timeout (10 s by
default, sleeping 1, 2, 4 s between attempts), and an export in flight cannot be interrupted.
With a collector that restarts, the export thread then sits in those sleeps while the
collector is already back. ``BoundedBatchSpanProcessor`` (export/stage.py) owns retrying instead:
it keeps what is queued, backs off, and probes the collector cheaply. For that it needs
exporters that send once and say what happened:

- :class:`ExportOutcome` ``SENT``, ``RETRY`` (not delivered, safe to send again),
  ``REJECTED`` (the collector refused it for good), ``UNKNOWN`` (timed out after it was sent:
  it may have arrived, so it is never sent twice), ``TOO_LARGE`` (over the receiver's limit).
- ``start_send(items, body, timeout_seconds)`` returns a :class:`PendingSend` the caller waits
  on in slices, so a shutdown can give up on it at its own deadline (gRPC: the call is
  cancelled; HTTP: the request's daemon thread is left to finish or die with the process).
- ``probe(timeout_seconds)``: a TCP connect to the endpoint's host and port, to notice within a
  fraction of a second that a collector which was down is back.

The SDK exporter objects are still built (they read every ``OTEL_EXPORTER_OTLP_*`` setting:
headers, compression, certificates, credential providers); only their send loop is bypassed.

Usage::

    exporter = SingleAttemptGrpcSpanExporter(endpoint="http://127.0.0.1:4317", timeout=10)
    items = exporter.span_items(factory)          # what the export stage queues
    batch = items.from_record(rec)
    pending = exporter.start_send(batch, exporter.encode(batch), 10.0)
    outcome = pending.wait(10.0)        # None while still in flight
"""

from __future__ import annotations

import enum
import logging
import re
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.sdk.trace.export import SpanExportResult

from otel_train.common import sdk_private
from otel_train.common.sdk_config import DEFAULT_MAX_REQUEST_BYTES, redact_url
from otel_train.export.otlp.encoding import _Encoder
from otel_train.export.otlp.span_fields import OtlpSpanFields
from otel_train.export.otlp.failure_words import (
    grpc_error_words,
    http_error_words,
    http_status_words,
)
from otel_train.export.otlp.http_sender import ReusedSenderThreads, use_lean_http_transport
from otel_train.export.span_items import SpanItems, SpanRowItems
from otel_train.records.span_rows import RowSpanFactory

_log = logging.getLogger("otel_train")
_TRACE_EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
# A collector that comes back is reconnected to within a second (gRPC's own reconnect
# backoff otherwise grows to 120 s and would keep failing calls after the collector is up).
_GRPC_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
_HTTP_RETRYABLE = frozenset((429, 502, 503, 504))
_LIMIT_RE = re.compile(r"vs\.?\s*(\d+)")
# How gRPC words UNAVAILABLE when no connection could be made (not a collector's answer).
_GRPC_CONNECT_FAILURES = ("failed to connect", "Connection refused", "connections to all",
                          "Socket closed", "Connection reset")


class ExportOutcome(enum.Enum):
    """What one send attempt did."""

    SENT = "sent"
    RETRY = "retry"
    REJECTED = "rejected"
    UNKNOWN = "unknown"
    TOO_LARGE = "too_large"


class PendingSend:
    """One request in flight: wait on it in slices, give up on it, learn its late outcome."""

    def __init__(self, cancel: Callable[[], None] | None = None) -> None:
        # Held until the outcome is known: a wait is one timed acquire (one C call; an
        # Event's wait runs a Condition's Python, ~25 us of CPU on a cold thread).
        self._done = threading.Lock()
        self._done.acquire()
        self._lock = threading.Lock()
        self._outcome: ExportOutcome | None = None
        self.detail = ""
        self.limit_bytes: int | None = None  # a receiver limit learnt from a TOO_LARGE answer
        self.unreachable = False  # no connection could be made (vs. an answer that refused)
        self._cancel = cancel
        self._late: Callable[[ExportOutcome], None] | None = None

    def finish(self, outcome: ExportOutcome, detail: str = "") -> None:
        """Record the outcome (called by the transport, from any thread)."""
        with self._lock:
            if self._outcome is not None:
                return
            self._outcome, self.detail = outcome, detail
            late = self._late
        self._done.release()
        if late is not None:
            try:
                late(outcome)
            except Exception:
                _log.debug("late export callback failed", exc_info=True)

    def wait(self, timeout_seconds: float) -> ExportOutcome | None:
        """The outcome, or None when it is still in flight after ``timeout_seconds``."""
        if self._outcome is None and self._done.acquire(True, max(0.0, timeout_seconds)):
            self._done.release()  # known: any later wait returns at once too
        return self._outcome

    def give_up(self, late: Callable[[ExportOutcome], None], cancel: bool) -> None:
        """Stop waiting; ``late(outcome)`` is called if it completes after all."""
        with self._lock:
            outcome = self._outcome
            if outcome is None:
                self._late = late
        if outcome is not None:
            late(outcome)
            return
        if cancel and self._cancel is not None:
            try:
                self._cancel()
            except Exception:
                _log.debug("cancelling an export failed", exc_info=True)


def _probe_tcp(host: str | None, port: int | None, timeout_seconds: float) -> bool | None:
    """True when a TCP connection to host:port opens (None: nothing to probe)."""
    if not host or not port:
        return None
    try:
        with socket.create_connection((host, port), timeout=timeout_seconds):
            return True
    except OSError:
        return False


class _SingleAttemptBase:
    """Shared parts: the queue items and their encoding, size limit, probe target."""

    def __init__(self, sdk_exporter: Any, timeout_seconds: float, max_request_bytes: int,
                 host: str | None, port: int | None, secrets: Sequence[str]) -> None:
        self.sdk_exporter = sdk_exporter
        # Credentials (URL userinfo, header values) never reach a log message.
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self.timeout_seconds = float(timeout_seconds)
        self.max_request_bytes = int(max_request_bytes)
        self._host, self._port = host, port
        self._encoder = _Encoder()  # requests are joined on the export thread: own caches
        self._closed = False
        self._factory: RowSpanFactory | None = None
        self._sends_bytes = True  # every send carries the encoded body (else SDK spans)
        self.where = f"{host}:{port}" if host else "the collector"  # for warnings

    def scrub(self, text: str) -> str:
        """``text`` with every known credential replaced by ``***``."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def span_items(self, factory: RowSpanFactory) -> SpanItems:
        """What the stage queues: encoded spans, joined into a request as they are; span
        rows where the send goes through the SDK exporter's own ``export`` (it takes SDK
        spans, made from the rows at send time)."""
        self._factory = factory
        if self._sends_bytes:
            return OtlpSpanFields(factory.run_constants)
        return SpanRowItems()

    def encode(self, items: Sequence[Any]) -> bytes:
        """The request body (ExportTraceServiceRequest bytes) of a batch of items."""
        factory = self._factory
        if factory is None:
            raise RuntimeError("span_items() was not called: nothing says what the items are")
        if self._sends_bytes:
            return self._encoder.request(items, factory.resource, factory.scope)
        return self._encoder.request_rows(items, factory.resource, factory.scope,
                                          factory.run_constants)

    def probe(self, timeout_seconds: float) -> bool | None:
        """Is the collector's port accepting connections? (None: cannot tell)."""
        return _probe_tcp(self._host, self._port, timeout_seconds)

    def reconnect(self) -> None:
        """Drop cached connections after an outage (the next send connects afresh)."""

    def start_send(self, items: Sequence[Any], body: bytes,
                   timeout_seconds: float) -> PendingSend:
        """Send ``body`` once; returns at once with a handle to wait on."""
        raise NotImplementedError

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing is buffered here."""
        return True


class SingleAttemptGrpcSpanExporter(_SingleAttemptBase):
    """OTLP/gRPC: one call per send, on the SDK exporter's channel and metadata."""

    def __init__(self, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 secrets: Sequence[str] = (), **sdk_kwargs: Any) -> None:
        sdk_kwargs.setdefault("channel_options", _GRPC_CHANNEL_OPTIONS)
        sdk = sdk_private.grpc_exporter_checked(_sdk_grpc_exporter(**sdk_kwargs))
        target = sdk_private.otlp_endpoint(sdk)
        host, port = _split_host_port(target, 4317)
        super().__init__(sdk, sdk_private.grpc_timeout_seconds(sdk), max_request_bytes, host,
                         port, secrets)
        self.where = self.scrub(redact_url(str(sdk_kwargs.get("endpoint") or target)))
        self._lock = threading.Lock()
        self._call: Any = None
        self._bind_call()

    def _bind_call(self) -> None:
        channel = sdk_private.grpc_channel(self.sdk_exporter)
        # Raw bytes in and out: the body is already encoded, and the (empty) answer is unused.
        self._call = channel.unary_unary(_TRACE_EXPORT_METHOD) if channel is not None else None

    def reconnect(self) -> None:
        """A fresh channel: gRPC's own reconnect backoff must not delay a recovered collector."""
        sdk = self.sdk_exporter
        with self._lock:
            if self._closed:
                return
            try:
                old = sdk_private.grpc_renew_channel(sdk)
                self._bind_call()
            except Exception:
                _log.debug("gRPC channel re-creation failed", exc_info=True)
                return
        if old is not None:
            try:
                old.close()
            except Exception:
                _log.debug("closing the old gRPC channel failed", exc_info=True)

    def start_send(self, items: Sequence[Any], body: bytes,
                   timeout_seconds: float) -> PendingSend:
        """Start one Export call with a deadline of ``timeout_seconds``."""
        import grpc

        call = self._call
        if call is None or self._closed:
            pending = PendingSend()
            pending.finish(ExportOutcome.REJECTED, "exporter closed")
            return pending
        metadata = sdk_private.grpc_metadata(self.sdk_exporter)
        timeout = max(0.001, timeout_seconds)
        if not threading.main_thread().is_alive():
            # Interpreter exit (the run's exit flush): a future completes on a gRPC thread,
            # which Python 3.12.0 and 3.12.1 refuse to start there (after the request went
            # out, so its outcome would be lost); a blocking call needs none.
            pending = PendingSend()
            try:
                call(body, timeout=timeout, metadata=metadata)
            except grpc.RpcError as exc:
                self._finish(pending, exc)
            except Exception as exc:  # e.g. the channel was closed under us by shutdown
                pending.finish(ExportOutcome.RETRY, grpc_error_words(None, str(exc)))
            else:
                pending.finish(ExportOutcome.SENT)
            return pending
        try:
            future = call.future(body, timeout=timeout, metadata=metadata)
        except Exception as exc:  # e.g. the channel was closed under us by shutdown
            pending = PendingSend()
            pending.finish(ExportOutcome.RETRY, grpc_error_words(None, str(exc)))
            return pending
        pending = PendingSend(cancel=future.cancel)

        def done(fut: Any) -> None:
            if fut.cancelled():
                pending.finish(ExportOutcome.UNKNOWN, "cancelled")
                return
            exc = fut.exception()
            if exc is None:
                pending.finish(ExportOutcome.SENT)
                return
            self._finish(pending, exc)

        future.add_done_callback(done)
        return pending

    def _finish(self, pending: PendingSend, exc: BaseException) -> None:
        """A failed call's outcome, from its status code and details."""
        import grpc

        code = exc.code() if isinstance(exc, grpc.RpcError) else None  # type: ignore[attr-defined]
        details = (exc.details() if isinstance(exc, grpc.RpcError)  # type: ignore[attr-defined]
                   else repr(exc)) or ""
        outcome = _grpc_outcome(code, details)
        pending.unreachable = code is grpc.StatusCode.UNAVAILABLE and any(
            text in details for text in _GRPC_CONNECT_FAILURES)
        if outcome is ExportOutcome.TOO_LARGE:
            match = _LIMIT_RE.search(details)
            if match:
                pending.limit_bytes = int(match.group(1))
        pending.finish(outcome, self.scrub(grpc_error_words(getattr(code, "name", None),
                                                            details)))

    def shutdown(self) -> None:
        """Close the channel (cancels what is still in flight on it)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            channel = sdk_private.grpc_channel(self.sdk_exporter)
            sdk_private.grpc_mark_shut_down(self.sdk_exporter)
            if channel is not None:
                channel.close()
        except Exception:
            _log.debug("gRPC exporter shutdown failed", exc_info=True)


def _sdk_grpc_exporter(**kwargs: Any) -> Any:
    """The SDK's OTLP/gRPC span exporter: it reads every ``OTEL_EXPORTER_OTLP_*`` setting and
    holds the channel; its own export loop is never used."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(**kwargs)


def _sdk_http_exporter(**kwargs: Any) -> Any:
    """The SDK's OTLP/HTTP span exporter: it reads every ``OTEL_EXPORTER_OTLP_*`` setting and
    holds the HTTP client."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(**kwargs)


def _grpc_outcome(code: Any, details: str) -> ExportOutcome:
    import grpc

    sc = grpc.StatusCode
    if code is sc.RESOURCE_EXHAUSTED and "larger than max" in details:
        return ExportOutcome.TOO_LARGE
    if code in (sc.UNAVAILABLE, sc.RESOURCE_EXHAUSTED, sc.ABORTED, sc.OUT_OF_RANGE,
                sc.DATA_LOSS):
        return ExportOutcome.RETRY  # the retryable codes of the OTLP specification
    if code in (sc.DEADLINE_EXCEEDED, sc.CANCELLED):
        return ExportOutcome.UNKNOWN  # it may have been received: never sent twice
    return ExportOutcome.REJECTED


class SingleAttemptHttpSpanExporter(_SingleAttemptBase):
    """OTLP/HTTP: one POST per send, on a (reused) daemon thread, with the SDK client's
    settings; through a lean HTTP/1.1 POST where it stands in exactly for requests
    (http_sender.py)."""

    def __init__(self, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 secrets: Sequence[str] = (), **sdk_kwargs: Any) -> None:
        sdk = _sdk_http_exporter(**sdk_kwargs)
        client = sdk_private.http_client(sdk)
        url = sdk_private.otlp_endpoint(sdk)
        parts = urlsplit(url)
        default_port = 443 if parts.scheme == "https" else 80
        try:
            port = parts.port or default_port
        except ValueError:
            port = None
        timeout = (sdk_private.http_client_timeout_seconds(client) if client is not None
                   else 0.0) or 10.0
        super().__init__(sdk, timeout, max_request_bytes, parts.hostname, port, secrets)
        self.where = self.scrub(redact_url(url))
        self._client = client
        # The SDK client's private single-request path (1.45+); otherwise its retrying export.
        self._direct = client is not None
        self._sends_bytes = self._direct  # otherwise the SDK's export() re-encodes spans
        self.lean_transport = self._direct and use_lean_http_transport(sdk, sdk_kwargs)
        self._owns_client = True
        self._senders = ReusedSenderThreads("otel-train-otlp-http")

    def share_client(self, client: Any) -> None:
        """Send through ``client``, an application's exporter's (its headers, TLS, session
        and timeout); it stays open when this exporter shuts down."""
        sdk_private.use_http_client(self.sdk_exporter, client)
        self._client = client
        self._direct = client is not None
        self._sends_bytes = self._direct
        self.lean_transport = False
        self._owns_client = False
        self.timeout_seconds = ((sdk_private.http_client_timeout_seconds(client)
                                 if client is not None else 0.0) or self.timeout_seconds)

    def start_send(self, items: Sequence[Any], body: bytes,
                   timeout_seconds: float) -> PendingSend:
        """POST ``body`` once from a daemon thread (a hung request never holds the caller)."""
        pending = PendingSend()
        if self._closed:
            pending.finish(ExportOutcome.REJECTED, "exporter closed")
            return pending
        self._senders.submit(self._post, (pending, items, body, timeout_seconds))
        return pending

    def _post(self, pending: PendingSend, items: Sequence[Any], body: bytes,
              timeout_seconds: float) -> None:
        try:
            if not self._direct:  # the SDK's own export takes SDK spans: the rows' spans
                assert self._factory is not None
                spans = self._factory.spans(items)
                ok = self.sdk_exporter.export(spans) is SpanExportResult.SUCCESS
                pending.finish(ExportOutcome.SENT if ok else ExportOutcome.REJECTED)
                return
            result = sdk_private.http_send_once(self._client, body, timeout_seconds)
            outcome, detail = _http_outcome(result)
            pending.unreachable = outcome is ExportOutcome.RETRY and getattr(
                result, "status_code", None) is None
            pending.finish(outcome, self.scrub(detail))
        except Exception as exc:
            pending.finish(ExportOutcome.RETRY, self.scrub(http_error_words(exc)))

    def shutdown(self) -> None:
        """Close the HTTP session."""
        if self._closed:
            return
        self._closed = True
        self._senders.close()
        try:
            if self._owns_client and self._client is not None:
                sdk_private.http_transport(self._client).close()
        except Exception:
            _log.debug("HTTP exporter shutdown failed", exc_info=True)


def _http_outcome(result: Any) -> tuple[ExportOutcome, str]:
    status = getattr(result, "status_code", None)
    if status is not None:
        if 200 <= status < 300:
            return ExportOutcome.SENT, ""
        detail = http_status_words(status)
        if status == 413:
            return ExportOutcome.TOO_LARGE, detail
        if status in _HTTP_RETRYABLE:
            return ExportOutcome.RETRY, detail
        return ExportOutcome.REJECTED, detail
    error = getattr(result, "error", None)
    error = getattr(error, "reason", None) or error  # urllib3 wraps the cause in MaxRetryError
    name = type(error).__name__
    if name in ("ReadTimeout", "ReadTimeoutError"):  # requests / urllib3
        # Sent, no answer in time: it may have arrived.
        return ExportOutcome.UNKNOWN, http_error_words(error)
    # Refused, reset, DNS or TLS failure: nothing was accepted (the SDK retries these too).
    return ExportOutcome.RETRY, http_error_words(error)


def _split_host_port(target: str, default_port: int) -> tuple[str | None, int | None]:
    """host and port of a gRPC target such as ``collector:4317`` or ``[::1]:4317``."""
    if not target or target.startswith(("unix:", "unix-abstract:")):
        return None, None
    if "://" in target:
        target = target.split("://", 1)[1]
    target = target.rsplit("@", 1)[-1].split("/", 1)[0]
    if target.startswith("["):
        host, _, rest = target[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif target.count(":") == 1:
        host, port_text = target.split(":")
    else:
        host, port_text = target, ""
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        return host or None, None
    return host or None, port
