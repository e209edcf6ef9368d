"""Real OTLP trace receivers for tests: a gRPC server and an HTTP server, both on 127.0.0.1.

Nothing here is mocked: `GrpcOtlpReceiver` is a grpcio server implementing opentelemetry-proto's
`TraceService.Export`, and `HttpOtlpReceiver` is a `ThreadingHTTPServer` accepting
`POST /v1/traces` with an `application/x-protobuf` body (optionally gzip/deflate encoded), as an
OpenTelemetry Collector would. Both decode what arrives into plain `ReceivedSpan` records so tests
can assert on names, ids, parent links, attributes, events, status and resource attributes.

Both can play a sick collector, switchable at any time through `.mode`:
- ``"ok"``: accept and store every request;
- ``"unavailable"``: reject (gRPC ``UNAVAILABLE`` / HTTP 503), storing nothing;
- ``"reject"``: reject with ``.reject_code`` (an HTTP status such as 401 or 500, or a gRPC
  status code such as ``"RESOURCE_EXHAUSTED"``), storing nothing;
- ``"hang"``: wait up to ``hang_seconds`` before answering (interrupted when the receiver closes,
  so teardown stays fast), then accept like ``"ok"`` unless the client gave up meanwhile (a
  cancelled gRPC call, a closed HTTP connection): as a collector, it keeps nothing a client
  abandoned.

And it can go away and come back on the same port, as a restarting collector does:
``down()`` stops listening and closes every connection (requests in progress are answered
first), ``up()`` listens again; ``Flapping(receiver, down_seconds, up_seconds)`` does that
on a schedule from a thread and records when the receiver was up.

Usage::

    with GrpcOtlpReceiver() as receiver:
        exporter = OTLPSpanExporter(endpoint=receiver.endpoint, insecure=True)
        ...
        spans = receiver.wait_for_spans(3, timeout_seconds=5)
"""

from __future__ import annotations

import gzip
import select
import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterable
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import (
    trace_service_pb2,
    trace_service_pb2_grpc,
)
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

__all__ = [
    "MODES",
    "Flapping",
    "GrpcOtlpReceiver",
    "HttpOtlpReceiver",
    "ReceivedSpan",
    "decode_any_value",
    "decode_attributes",
    "decode_request",
]

MODES = ("ok", "unavailable", "hang", "reject")
TRACES_PATH = "/v1/traces"
# Bounds so no test can hang on a receiver: the longest "hang" we allow, and teardown waits.
_MAX_HANG_SECONDS = 30.0
_STOP_GRACE_SECONDS = 1.0
_CANCEL_GRACE_SECONDS = 0.3  # under the stop grace: the answer still goes out


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as a collector received it, decoded into plain Python values."""

    name: str
    trace_id: str  # 32 lowercase hex chars
    span_id: str  # 16 lowercase hex chars
    parent_span_id: str | None  # 16 hex chars, None for a root span
    start_time_unix_nano: int
    end_time_unix_nano: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status_code: int  # 0 unset, 1 ok, 2 error (opentelemetry.proto.trace.v1.Status.StatusCode)
    status_message: str
    resource_attributes: dict[str, Any]
    scope_name: str
    # Extras beyond the minimum, handy for link/kind assertions.
    kind: int = 0  # Span.SpanKind: 0 unspecified, 1 internal, 2 server, 3 client, ...
    # (trace_id, span_id, attributes) of each link
    links: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    scope_version: str = ""

    @property
    def duration_seconds(self) -> float:
        """End minus start, in seconds."""
        return (self.end_time_unix_nano - self.start_time_unix_nano) / 1e9

    @property
    def is_root(self) -> bool:
        """True when the span has no parent."""
        return self.parent_span_id is None


def decode_any_value(value: common_pb2.AnyValue) -> Any:
    """Turn an OTLP AnyValue into str/bool/int/float/bytes/list/dict (None when empty)."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [decode_any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return decode_attributes(value.kvlist_value.values)
    return getattr(value, which)


def decode_attributes(key_values: Iterable[common_pb2.KeyValue]) -> dict[str, Any]:
    """Turn repeated OTLP KeyValue into a dict."""
    return {kv.key: decode_any_value(kv.value) for kv in key_values}


def _hex_or_none(raw: bytes) -> str | None:
    """Hex-encode an id; empty bytes (and the all-zero id) mean no id."""
    if not raw or not any(raw):
        return None
    return raw.hex()


def decode_request(request: trace_service_pb2.ExportTraceServiceRequest) -> list[ReceivedSpan]:
    """Flatten an ExportTraceServiceRequest into ReceivedSpans, in wire order."""
    out: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource_attributes = decode_attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope
            for span in scope_spans.spans:
                out.append(_decode_span(span, resource_attributes, scope.name, scope.version))
    return out


def _decode_span(
    span: trace_pb2.Span, resource_attributes: dict[str, Any], scope_name: str, scope_version: str
) -> ReceivedSpan:
    """Decode one protobuf Span."""
    return ReceivedSpan(
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=_hex_or_none(span.parent_span_id),
        start_time_unix_nano=span.start_time_unix_nano,
        end_time_unix_nano=span.end_time_unix_nano,
        attributes=decode_attributes(span.attributes),
        events=[(event.name, decode_attributes(event.attributes)) for event in span.events],
        status_code=int(span.status.code),
        status_message=span.status.message,
        # Each span gets its own copy so a test mutating one cannot affect another.
        resource_attributes=dict(resource_attributes),
        scope_name=scope_name,
        kind=int(span.kind),
        links=[
            (link.trace_id.hex(), link.span_id.hex(), decode_attributes(link.attributes))
            for link in span.links
        ],
        scope_version=scope_version,
    )


class _ReceiverBase:
    """Storage, waiting and sick-mode logic shared by both transports."""

    def __init__(self, mode: str = "ok", hang_seconds: float = 5.0,
                 reject_code: int | str | None = None, keep_spans: bool = True) -> None:
        """Validate options and set up thread-safe storage.

        ``keep_spans=False`` parses each request in full (protobuf's C parser, as a
        collector validates what it receives) but only counts its spans: no Python object
        per span, so a benchmark's receiver costs its machine about what a collector would.
        """
        self._check_mode(mode)
        self.keep_spans = keep_spans
        self._span_count = 0
        self.reject_code = reject_code
        if not 0 <= hang_seconds <= _MAX_HANG_SECONDS:
            raise ValueError(f"hang_seconds must be within [0, {_MAX_HANG_SECONDS}]")
        self._mode = mode
        self.hang_seconds = float(hang_seconds)
        self._cond = threading.Condition()
        self._requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self._spans: list[ReceivedSpan] = []
        self._headers: list[dict[str, str]] = []
        self._requests_count = 0
        self._closing = threading.Event()  # interrupts "hang" so close() is never slow
        self._port: int | None = None

    # -- configuration ---------------------------------------------------------------------
    @staticmethod
    def _check_mode(mode: str) -> None:
        """Reject unknown modes early."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")

    @property
    def mode(self) -> str:
        """Current behaviour: "ok", "unavailable" or "hang"."""
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        """Switch behaviour at runtime (e.g. to test recovery after an outage)."""
        self._check_mode(value)
        self._mode = value

    @property
    def port(self) -> int:
        """The bound TCP port on 127.0.0.1."""
        if self._port is None:
            raise RuntimeError("receiver is not started")
        return self._port

    @property
    def endpoint(self) -> str:
        """Base URL, e.g. http://127.0.0.1:PORT."""
        return f"http://127.0.0.1:{self.port}"

    # -- results ---------------------------------------------------------------------------
    @property
    def requests_count(self) -> int:
        """Export requests that arrived, in any mode (rejected and retried ones included)."""
        with self._cond:
            return self._requests_count

    def requests(self) -> list[trace_service_pb2.ExportTraceServiceRequest]:
        """The accepted requests, raw protobuf."""
        with self._cond:
            return list(self._requests)

    def request_headers(self) -> list[dict[str, str]]:
        """Headers (HTTP) or metadata (gRPC) of each accepted request, keys lower-cased."""
        with self._cond:
            return [dict(h) for h in self._headers]

    def spans(self, name: str | None = None) -> list[ReceivedSpan]:
        """Every span of every accepted request, in arrival order; optionally only `name`."""
        with self._cond:
            spans = list(self._spans)
        return spans if name is None else [s for s in spans if s.name == name]

    def span_count(self) -> int:
        """Spans accepted so far (counted with ``keep_spans`` either way)."""
        with self._cond:
            return self._span_count

    def wait_for_spans(
        self,
        predicate_or_count: int | Callable[[list[ReceivedSpan]], bool],
        timeout_seconds: float = 5.0,
    ) -> list[ReceivedSpan]:
        """Wait until >= count spans arrived (or predicate(all spans) is true); return all spans.

        Raises TimeoutError (with what did arrive) when the condition is not met in time.
        """
        if isinstance(predicate_or_count, int):
            wanted = predicate_or_count

            def predicate(spans: list[ReceivedSpan]) -> bool:
                return len(spans) >= wanted

            description = f"{wanted} span(s)"
        else:
            predicate = predicate_or_count
            description = "predicate"
        deadline = time.monotonic() + timeout_seconds
        with self._cond:
            while True:
                spans = list(self._spans)
                if predicate(spans):
                    return spans
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    names = [s.name for s in spans]
                    raise TimeoutError(
                        f"waited {timeout_seconds}s for {description}; got {len(spans)} span(s) "
                        f"{names[:20]} from {self._requests_count} request(s)"
                    )
                # Bounded wait; _record notifies on every accepted request.
                self._cond.wait(min(remaining, 0.1))

    def wait_for_requests(self, count: int = 1, timeout_seconds: float = 5.0) -> int:
        """Wait until >= ``count`` requests arrived, in any mode (a hanging one counts as it
        arrives); return the count, which may be short of ``count`` after the timeout."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            with self._cond:
                got = self._requests_count
            left = deadline - time.monotonic()
            if got >= count or left <= 0:
                return got
            time.sleep(min(left, 0.01))  # arrivals are counted without a notify

    def clear(self) -> None:
        """Forget all received requests, spans, headers and the request count."""
        with self._cond:
            self._requests.clear()
            self._spans.clear()
            self._headers.clear()
            self._requests_count = 0

    # -- transport hooks -------------------------------------------------------------------
    def _count_arrival(self) -> str:
        """Count a request and return the mode in force when it arrived."""
        with self._cond:
            self._requests_count += 1
        return self._mode

    def _hang(self, client_gone: Callable[[], bool]) -> bool:
        """Block for hang_seconds (less if the receiver closes); True if the client left."""
        deadline = time.monotonic() + self.hang_seconds
        while not self._closing.is_set():
            if client_gone():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._closing.wait(min(left, 0.05))
        if self._closing.is_set():
            # Closing: a client that has just cancelled may not be seen as gone yet (gRPC's
            # cancel reaches the server asynchronously); a moment, bounded, before answering.
            end = time.monotonic() + _CANCEL_GRACE_SECONDS
            while time.monotonic() < end:
                if client_gone():
                    return True
                time.sleep(0.01)
        return client_gone()

    # -- outages ---------------------------------------------------------------------------
    @property
    def is_up(self) -> bool:
        """True while listening."""
        return self._is_up()

    def _is_up(self) -> bool:
        raise NotImplementedError

    def down(self) -> None:
        """Stop listening and drop every connection (the port then refuses connections)."""
        raise NotImplementedError

    def up(self) -> None:
        """Listen again on the same port."""
        raise NotImplementedError

    def _record(
        self, request: trace_service_pb2.ExportTraceServiceRequest, headers: dict[str, str]
    ) -> None:
        """Store an accepted request and wake waiters."""
        if not self.keep_spans:
            count = sum(len(scope.spans) for resource in request.resource_spans
                        for scope in resource.scope_spans)
            with self._cond:
                self._span_count += count
                self._cond.notify_all()
            return
        spans = decode_request(request)
        with self._cond:
            self._requests.append(request)
            self._headers.append(headers)
            self._spans.extend(spans)
            self._span_count += len(spans)
            self._cond.notify_all()

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> _ReceiverBase:
        """Start serving; returns self."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop serving (bounded)."""
        raise NotImplementedError

    def __enter__(self) -> _ReceiverBase:
        """Start on entering the block."""
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        """Close on leaving the block."""
        self.close()


class _TraceServicer(trace_service_pb2_grpc.TraceServiceServicer):
    """gRPC TraceService that forwards to its receiver."""

    def __init__(self, receiver: GrpcOtlpReceiver) -> None:
        """Keep the owning receiver."""
        self._receiver = receiver

    def Export(  # noqa: N802 (name fixed by the generated service)
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        """Handle one export according to the receiver's mode."""
        receiver = self._receiver
        mode = receiver._count_arrival()
        if mode == "unavailable":
            context.abort(grpc.StatusCode.UNAVAILABLE, "otlp test receiver: simulated outage")
        if mode == "reject":
            code = receiver.reject_code or "RESOURCE_EXHAUSTED"
            status = code if isinstance(code, grpc.StatusCode) else grpc.StatusCode[str(code)]
            context.abort(status, "otlp test receiver: rejected")
        if mode == "hang" and receiver._hang(lambda: not context.is_active()):
            return trace_service_pb2.ExportTraceServiceResponse()  # cancelled: keep nothing
        headers = {key.lower(): str(value) for key, value in context.invocation_metadata()}
        receiver._record(request, headers)
        return trace_service_pb2.ExportTraceServiceResponse()


class GrpcOtlpReceiver(_ReceiverBase):
    """A real OTLP/gRPC trace receiver on 127.0.0.1 (free port); use as a context manager."""

    def __init__(self, mode: str = "ok", hang_seconds: float = 5.0, max_workers: int = 4,
                 reject_code: int | str | None = None, keep_spans: bool = True) -> None:
        """Configure; the server starts in start()/__enter__."""
        super().__init__(mode=mode, hang_seconds=hang_seconds, reject_code=reject_code,
                         keep_spans=keep_spans)
        self._max_workers = max_workers
        self._server: grpc.Server | None = None

    def start(self) -> GrpcOtlpReceiver:
        """Bind a free port on 127.0.0.1 and start serving."""
        if self._server is not None:
            return self
        self._closing.clear()
        self._listen(0)
        return self

    def _listen(self, port: int) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._max_workers))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceServicer(self), server)
        bound = 0
        for _ in range(50):  # the same port right after a stop: retry briefly
            bound = server.add_insecure_port(f"127.0.0.1:{port}")
            if bound or port == 0:
                break
            time.sleep(0.02)
        if bound == 0:
            raise RuntimeError(f"could not bind port {port} on 127.0.0.1")
        server.start()
        self._server = server
        self._port = bound

    def _is_up(self) -> bool:
        return self._server is not None

    def down(self) -> None:
        """Stop serving (requests in progress get their answer); the port refuses."""
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace=_STOP_GRACE_SECONDS).wait(timeout=_STOP_GRACE_SECONDS + 1.0)

    def up(self) -> None:
        """Serve again on the same port."""
        if self._server is None:
            self._listen(self.port)

    def close(self) -> None:
        """Stop the server; in-flight hangs are released first so this stays fast."""
        server, self._server = self._server, None
        if server is None:
            return
        self._closing.set()
        server.stop(grace=_STOP_GRACE_SECONDS).wait(timeout=_STOP_GRACE_SECONDS + 1.0)

    def __enter__(self) -> GrpcOtlpReceiver:
        """Start on entering the block."""
        return self.start()


class _OtlpHttpHandler(BaseHTTPRequestHandler):
    """Handles POST /v1/traces; anything else is 404/405/415/400 like a strict collector."""

    server: _OtlpHttpServer
    protocol_version = "HTTP/1.1"  # keep-alive, as the OTel HTTP exporter's session expects

    def do_POST(self) -> None:  # noqa: N802 (http.server naming)
        """Decode and store an export request, or play sick."""
        server = self.server
        with server.lock:
            server.active += 1
        try:
            self._post()
        finally:
            with server.lock:
                server.active -= 1

    def _post(self) -> None:
        receiver = self.server.receiver
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        if self.server.going_down:
            self.close_connection = True  # a collector shutting down: no answer, nothing kept
            return
        if self.path.split("?", 1)[0] != TRACES_PATH:
            self._reply(404, b"not found", "text/plain")
            return
        mode = receiver._count_arrival()
        if mode == "unavailable":
            self._reply(503, b"otlp test receiver: simulated outage", "text/plain")
            return
        if mode == "reject":
            self._reply(int(receiver.reject_code or 500), b"otlp test receiver: rejected",
                        "text/plain")
            return
        if mode == "hang" and receiver._hang(self._client_gone):
            self.close_connection = True
            return
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip()
        if content_type != "application/x-protobuf":
            self._reply(415, b"only application/x-protobuf is supported", "text/plain")
            return
        try:
            body = self._decompress(body, (self.headers.get("Content-Encoding") or "").lower())
            request = trace_service_pb2.ExportTraceServiceRequest()
            request.ParseFromString(body)
        except Exception as exc:  # noqa: BLE001 (a bad body is the client's error: answer 400)
            self._reply(400, f"bad request: {exc}".encode(), "text/plain")
            return
        headers = {key.lower(): value for key, value in self.headers.items()}
        receiver._record(request, headers)
        response = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self._reply(200, response, "application/x-protobuf")

    def _client_gone(self) -> bool:
        """True when the client closed its end of the connection."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        """OTLP has no GET; answer 405."""
        self._reply(405, b"method not allowed", "text/plain")

    @staticmethod
    def _decompress(body: bytes, encoding: str) -> bytes:
        """Undo Content-Encoding gzip/deflate; identity otherwise."""
        if encoding == "gzip":
            return gzip.decompress(body)
        if encoding == "deflate":
            return zlib.decompress(body)
        if encoding in ("", "identity"):
            return body
        raise ValueError(f"unsupported Content-Encoding {encoding!r}")

    def _reply(self, code: int, body: bytes, content_type: str) -> None:
        """Send a complete response with Content-Length."""
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (base signature)
        """Keep test output quiet."""


class _OtlpHttpServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that knows its receiver."""

    daemon_threads = True  # a stuck handler must never block interpreter exit or close()
    allow_reuse_address = True

    def __init__(self, receiver: HttpOtlpReceiver, port: int = 0) -> None:
        """Bind 127.0.0.1 on ``port`` (0: a free one)."""
        self.receiver = receiver
        self.going_down = False
        self.connections: set[socket.socket] = set()
        self.active = 0  # requests being handled
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", port), _OtlpHttpHandler)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """Track each connection, so that down() can close the kept-alive ones."""
        with self.lock:
            self.connections.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.lock:
                self.connections.discard(request)

    def drop_connections(self) -> None:
        """Refuse further requests, let those in progress answer, close every connection."""
        with self.lock:
            self.going_down = True
        deadline = time.monotonic() + _STOP_GRACE_SECONDS
        while self.active and time.monotonic() < deadline:
            time.sleep(0.005)
        with self.lock:
            conns = list(self.connections)
        for conn in conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class HttpOtlpReceiver(_ReceiverBase):
    """A real OTLP/HTTP (protobuf) trace receiver on 127.0.0.1 (free port); a context manager."""

    def __init__(self, mode: str = "ok", hang_seconds: float = 5.0,
                 reject_code: int | str | None = None, keep_spans: bool = True) -> None:
        """Configure; the server starts in start()/__enter__."""
        super().__init__(mode=mode, hang_seconds=hang_seconds, reject_code=reject_code,
                         keep_spans=keep_spans)
        self._server: _OtlpHttpServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def traces_endpoint(self) -> str:
        """Full signal URL, e.g. http://127.0.0.1:PORT/v1/traces."""
        return self.endpoint + TRACES_PATH

    def start(self) -> HttpOtlpReceiver:
        """Bind a free port on 127.0.0.1 and serve from a daemon thread."""
        if self._server is not None:
            return self
        self._closing.clear()
        self._listen(0)
        return self

    def _listen(self, port: int) -> None:
        server: _OtlpHttpServer | None = None
        for _ in range(50):  # the same port right after a stop: retry briefly
            try:
                server = _OtlpHttpServer(self, port)
                break
            except OSError:
                if port == 0:
                    raise
                time.sleep(0.02)
        if server is None:
            raise RuntimeError(f"could not bind port {port} on 127.0.0.1")
        self._port = server.server_address[1]
        thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"otlp-http-receiver-{self._port}",
            daemon=True,
        )
        thread.start()
        self._server, self._thread = server, thread

    def _stop(self) -> None:
        server, self._server = self._server, None
        thread, self._thread = self._thread, None
        if server is None:
            return
        server.shutdown()  # returns once serve_forever's loop (poll 0.05 s) has exited
        server.server_close()
        server.drop_connections()
        if thread is not None:
            thread.join(timeout=_STOP_GRACE_SECONDS)

    def _is_up(self) -> bool:
        return self._server is not None

    def down(self) -> None:
        """Stop listening and close every connection; the port refuses connections."""
        self._stop()

    def up(self) -> None:
        """Listen again on the same port."""
        if self._server is None:
            self._listen(self.port)

    def close(self) -> None:
        """Stop serving; in-flight hangs are released first so this stays fast."""
        if self._server is None:
            return
        self._closing.set()
        self._stop()

    def __enter__(self) -> HttpOtlpReceiver:
        """Start on entering the block."""
        return self.start()


class Flapping:
    """Takes a receiver down and up on a schedule from a thread (a restarting collector).

    ``up_intervals()`` are the (start, end) ``time.monotonic()`` windows the receiver was
    listening, so a test can tell which spans were emitted while it was up.
    """

    def __init__(self, receiver: _ReceiverBase, down_seconds: float, up_seconds: float,
                 start_down: bool = True) -> None:
        """Configure; the schedule runs between __enter__ and __exit__."""
        if not (0 < down_seconds <= 60 and 0 < up_seconds <= 60):
            raise ValueError("down_seconds and up_seconds must be within (0, 60]")
        self._receiver = receiver
        self._down, self._up = down_seconds, up_seconds
        self._start_down = start_down
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._intervals: list[list[float]] = []
        self._thread = threading.Thread(target=self._run, name="otlp-flapping", daemon=True)
        self.outages = 0

    def _mark_up(self) -> None:
        with self._lock:
            self._intervals.append([time.monotonic(), float("inf")])

    def _mark_down(self) -> None:
        with self._lock:
            if self._intervals and self._intervals[-1][1] == float("inf"):
                self._intervals[-1][1] = time.monotonic()

    def _run(self) -> None:
        going_down = self._start_down
        while not self._stop.is_set():
            if going_down:
                self._mark_down()
                self._receiver.down()
                self.outages += 1
                self._stop.wait(self._down)
            else:
                self._receiver.up()
                self._mark_up()
                self._stop.wait(self._up)
            going_down = not going_down

    def up_intervals(self) -> list[tuple[float, float]]:
        """The windows the receiver was up (the last may end at +inf: still up)."""
        with self._lock:
            return [(a, b) for a, b in self._intervals]

    def was_up_at(self, t: float) -> bool:
        """Was the receiver listening at monotonic time ``t``?"""
        return any(a <= t < b for a, b in self.up_intervals())

    def __enter__(self) -> Flapping:
        """Start the schedule (the receiver must be started)."""
        if self._receiver.is_up:
            self._mark_up()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Stop the schedule and leave the receiver up."""
        self._stop.set()
        self._thread.join(timeout=self._down + self._up + 5)
        if not self._receiver.is_up:
            self._receiver.up()
            self._mark_up()
