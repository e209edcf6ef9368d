"""Real OTLP metrics receivers for tests (gRPC and HTTP on 127.0.0.1), and a collector-shaped
Prometheus endpoint serving what they received.

``GrpcOtlpMetricsReceiver`` is a grpcio server implementing opentelemetry-proto's
``MetricsService.Export``; ``HttpOtlpMetricsReceiver`` accepts ``POST /v1/metrics`` with an
``application/x-protobuf`` body (gzip/deflate too), as an OpenTelemetry Collector does. What
arrives is decoded into ``ReceivedMetric`` records (name, unit, kind, temporality, points).

``prometheus_name`` applies the OpenTelemetry-to-Prometheus name translation the Collector's
``prometheus`` / ``prometheusremotewrite`` exporters use (non-alphanumerics to ``_``; unit
suffix: ``s`` -> ``seconds``, ``By`` -> ``bytes``, ``1`` on a gauge -> ``ratio``, ``{...}``
dropped; ``_total`` on monotonic sums), written from the translation rules, independently
of otel_train. ``ExpositionServer`` serves the latest cumulative points as Prometheus text
on 127.0.0.1, so a real Prometheus can scrape metrics that took the OTLP path (the Collector's
``prometheus`` exporter, in miniature).

Usage::

    with GrpcOtlpMetricsReceiver() as rx:
        ... export to rx.endpoint ...
        rx.wait_for_metric("otel_train.steps")
        latest = rx.latest_points()          # {(prom name, labels): value} of the last export
"""

from __future__ import annotations

import gzip
import re
import threading
import time
import zlib
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from otlp_receivers import decode_attributes

METRICS_PATH = "/v1/metrics"
_UNITS = {"s": "seconds", "ms": "milliseconds", "By": "bytes", "1": "ratio",
          "%": "percent", "m": "meters"}
CUMULATIVE = 2  # AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = 1


@dataclass
class ReceivedPoint:
    """One data point: attributes and a value (number) or histogram fields."""

    attributes: dict[str, Any]
    value: float | None = None
    count: int = 0
    sum: float = 0.0
    bounds: list[float] = field(default_factory=list)
    bucket_counts: list[int] = field(default_factory=list)
    exemplar_trace_ids: list[str] = field(default_factory=list)


@dataclass
class ReceivedMetric:
    """One metric of one export request."""

    name: str
    unit: str
    kind: str  # gauge | sum | histogram | exponential_histogram | summary
    monotonic: bool
    temporality: int  # 0 unspecified (gauges), 1 delta, 2 cumulative
    points: list[ReceivedPoint]
    resource_attributes: dict[str, Any]
    scope_name: str


def prometheus_name(name: str, unit: str, kind: str, monotonic: bool) -> str:
    """The Collector's OTel-to-Prometheus metric name (with type and unit suffixes)."""
    base = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    unit = re.sub(r"\{[^}]*\}", "", unit or "").strip()
    suffix = ""
    if unit == "1":
        suffix = "ratio" if kind == "gauge" else ""
    elif unit:
        main, _, per = unit.partition("/")
        suffix = _UNITS.get(main, re.sub(r"[^a-zA-Z0-9]", "_", main))
        if per:
            suffix += "_per_" + {"s": "second", "m": "minute", "h": "hour"}.get(per, per)
        # An annotation alone ("{token}/s") leaves only the rate: no empty unit word.
        suffix = suffix.strip("_")
    if suffix and not base.endswith("_" + suffix):
        base += "_" + suffix
    if kind == "sum" and monotonic and not base.endswith("_total"):
        base += "_total"
    return base


def _decode(request: metrics_service_pb2.ExportMetricsServiceRequest) -> list[ReceivedMetric]:
    out: list[ReceivedMetric] = []
    for rm in request.resource_metrics:
        resource = decode_attributes(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data") or ""
                data = getattr(m, kind) if kind else None
                points: list[ReceivedPoint] = []
                for dp in (data.data_points if data is not None else []):
                    attrs = decode_attributes(dp.attributes)
                    if kind in ("gauge", "sum"):
                        which = dp.WhichOneof("value")
                        points.append(ReceivedPoint(attrs, float(getattr(dp, which))))
                    elif kind == "histogram":
                        points.append(ReceivedPoint(
                            attrs, None, int(dp.count), float(dp.sum),
                            list(dp.explicit_bounds), [int(c) for c in dp.bucket_counts],
                            [e.trace_id.hex() for e in dp.exemplars if e.trace_id]))
                    else:
                        points.append(ReceivedPoint(attrs, None, int(dp.count), float(dp.sum)))
                out.append(ReceivedMetric(
                    m.name, m.unit, kind, bool(getattr(data, "is_monotonic", False)),
                    int(getattr(data, "aggregation_temporality", 0)), points, resource,
                    sm.scope.name))
    return out


class _MetricsReceiverBase:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._requests: list[list[ReceivedMetric]] = []
        self._headers: list[dict[str, str]] = []
        self._port: int | None = None

    @property
    def port(self) -> int:
        """The bound port."""
        if self._port is None:
            raise RuntimeError("receiver is not started")
        return self._port

    @property
    def endpoint(self) -> str:
        """Base URL, e.g. http://127.0.0.1:PORT."""
        return f"http://127.0.0.1:{self.port}"

    def _record(self, request: metrics_service_pb2.ExportMetricsServiceRequest,
                headers: dict[str, str]) -> None:
        metrics = _decode(request)
        with self._cond:
            self._requests.append(metrics)
            self._headers.append(headers)
            self._cond.notify_all()

    def requests(self) -> list[list[ReceivedMetric]]:
        """Decoded export requests, in arrival order."""
        with self._cond:
            return list(self._requests)

    def request_headers(self) -> list[dict[str, str]]:
        """Headers / metadata of each request (keys lower-cased)."""
        with self._cond:
            return [dict(h) for h in self._headers]

    def metrics(self, name: str | None = None) -> list[ReceivedMetric]:
        """Every received metric (optionally only ``name``), in arrival order."""
        with self._cond:
            flat = [m for req in self._requests for m in req]
        return flat if name is None else [m for m in flat if m.name == name]

    def wait_for(self, predicate: Callable[[list[ReceivedMetric]], bool],
                 timeout_seconds: float = 10.0) -> list[ReceivedMetric]:
        """Wait (bounded) until ``predicate(all metrics)``; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout_seconds
        with self._cond:
            while True:
                flat = [m for req in self._requests for m in req]
                if predicate(flat):
                    return flat
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"waited {timeout_seconds}s; got "
                                       f"{sorted({m.name for m in flat})}")
                self._cond.wait(min(left, 0.1))

    def wait_for_metric(self, name: str, timeout_seconds: float = 10.0) -> ReceivedMetric:
        """The first metric called ``name`` to arrive."""
        self.wait_for(lambda ms: any(m.name == name for m in ms), timeout_seconds)
        return self.metrics(name)[0]

    def latest(self) -> dict[str, ReceivedMetric]:
        """Per metric name, its last received version."""
        out: dict[str, ReceivedMetric] = {}
        for m in self.metrics():
            out[m.name] = m
        return out

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class _MetricsServicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: GrpcOtlpMetricsReceiver) -> None:
        self._receiver = receiver

    def Export(self, request: Any, context: grpc.ServicerContext) -> Any:
        """Store one export request."""
        headers = {k.lower(): str(v) for k, v in context.invocation_metadata()}
        self._receiver._record(request, headers)
        return metrics_service_pb2.ExportMetricsServiceResponse()


class GrpcOtlpMetricsReceiver(_MetricsReceiverBase):
    """A real OTLP/gRPC metrics receiver on 127.0.0.1 (free port)."""

    def start(self) -> GrpcOtlpMetricsReceiver:
        """Bind and serve."""
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(
            _MetricsServicer(self), server)
        self._port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server = server
        return self

    def close(self) -> None:
        """Stop (bounded)."""
        server = getattr(self, "_server", None)
        self._server = None
        if server is not None:
            server.stop(grace=0.5).wait(timeout=2.0)


class _HttpHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        """Decode and store one export request."""
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path.split("?", 1)[0] != METRICS_PATH:
            return self._reply(404, b"not found", "text/plain")
        if (self.headers.get("Content-Type") or "").split(";")[0].strip() != \
                "application/x-protobuf":
            return self._reply(415, b"protobuf only", "text/plain")
        enc = (self.headers.get("Content-Encoding") or "").lower()
        try:
            if enc == "gzip":
                body = gzip.decompress(body)
            elif enc == "deflate":
                body = zlib.decompress(body)
            request = metrics_service_pb2.ExportMetricsServiceRequest()
            request.ParseFromString(body)
        except Exception as exc:  # noqa: BLE001
            return self._reply(400, str(exc).encode(), "text/plain")
        self.server.receiver._record(  # type: ignore[attr-defined]
            request, {k.lower(): v for k, v in self.headers.items()})
        self._reply(200, metrics_service_pb2.ExportMetricsServiceResponse()
                    .SerializeToString(), "application/x-protobuf")

    def _reply(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


def _serve(handler: type[BaseHTTPRequestHandler], owner: Any) -> tuple[Any, threading.Thread]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    server.receiver = owner  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              daemon=True)
    thread.start()
    return server, thread


class HttpOtlpMetricsReceiver(_MetricsReceiverBase):
    """A real OTLP/HTTP (protobuf) metrics receiver on 127.0.0.1 (free port)."""

    @property
    def metrics_endpoint(self) -> str:
        """Full signal URL."""
        return self.endpoint + METRICS_PATH

    def start(self) -> HttpOtlpMetricsReceiver:
        """Bind and serve."""
        self._server, self._thread = _serve(_HttpHandler, self)
        self._port = self._server.server_address[1]
        return self

    def close(self) -> None:
        """Stop."""
        server = getattr(self, "_server", None)
        self._server = None
        if server is not None:
            server.shutdown()
            server.server_close()


# -- a collector-shaped Prometheus endpoint ------------------------------------------------

def _labels(attrs: dict[str, Any], extra: dict[str, str] | None = None) -> str:
    items = {re.sub(r"[^a-zA-Z0-9_]", "_", k): str(v) for k, v in attrs.items()}
    items.update(extra or {})
    body = ",".join(f'{k}="{v}"'.replace("\n", " ") for k, v in sorted(items.items()))
    return "{" + body + "}" if body else ""


def _fmt(v: float) -> str:
    if v == float("inf"):
        return "+Inf"
    return repr(float(v))


def exposition(metrics: dict[str, ReceivedMetric]) -> str:
    """Prometheus text of the latest cumulative points (what the Collector would serve)."""
    lines: list[str] = []
    for m in metrics.values():
        if m.kind not in ("gauge", "sum", "histogram") or m.temporality == DELTA:
            continue
        name = prometheus_name(m.name, m.unit, m.kind, m.monotonic)
        ptype = {"gauge": "gauge", "histogram": "histogram"}.get(
            m.kind, "counter" if m.monotonic else "gauge")
        lines.append(f"# TYPE {name.removesuffix('_total') if ptype == 'counter' else name}"
                     f" {ptype}")
        for p in m.points:
            if m.kind != "histogram":
                lines.append(f"{name}{_labels(p.attributes)} {_fmt(p.value or 0.0)}")
                continue
            acc = 0
            for bound, n in zip(list(p.bounds) + [float("inf")], p.bucket_counts):
                acc += n
                lines.append(f"{name}_bucket{_labels(p.attributes, {'le': _fmt(bound)})} {acc}")
            lines.append(f"{name}_sum{_labels(p.attributes)} {_fmt(p.sum)}")
            lines.append(f"{name}_count{_labels(p.attributes)} {p.count}")
    return "\n".join(lines) + "\n"


class _ExpositionHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        """Serve /metrics."""
        body = exposition(self.server.receiver.latest()).encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


class ExpositionServer:
    """Serves ``exposition(receiver.latest())`` on 127.0.0.1 (a free port) at /metrics."""

    def __init__(self, receiver: _MetricsReceiverBase) -> None:
        self.receiver = receiver
        self._server: Any = None

    @property
    def target(self) -> str:
        """host:port for a Prometheus scrape config."""
        return f"127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> ExpositionServer:
        self._server, _ = _serve(_ExpositionHandler, self.receiver)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
