"""When the application already has an SDK TracerProvider: our own export stage, its endpoint.

Under ``opentelemetry-instrument`` (or any app that installs a TracerProvider with an OTLP
exporter), otel-train's spans used to join the application's pipeline: usually the SDK's
``BatchSpanProcessor``, which does not say how many spans it dropped, encodes with the SDK's
slower encoder and, at 1,000 ranks, competes with the application's own spans in one queue.
With ``trace_export="own"`` (the default) otel-train keeps its bounded, drop-counting,
fast-encoding export stage and sends to **where the application sends**: the endpoint,
headers, TLS settings, timeout and compression of the application's OTLP span exporter,
found among its provider's span processors. When the application exports somewhere else
(console, in-memory, a vendor exporter) or nothing is found, the spans join its pipeline as
before; ``trace_export="application"`` always does.

Usage::

    found = exporter_like_application(provider)   # (exporter, "OTLP grpc -> host:4317") | None
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

from otel_train.export.otlp.encoding import make_grpc_exporter, make_http_exporter

_log = logging.getLogger("otel_train")


def _processors(provider: TracerProvider) -> Iterator[Any]:
    """The span processors installed on ``provider`` (nested multi-processors flattened)."""
    stack = [getattr(provider, "_active_span_processor", None)]
    while stack:
        proc = stack.pop()
        if proc is None:
            continue
        inner = getattr(proc, "_span_processors", None)
        if inner is not None:
            stack.extend(reversed(list(inner)))
        else:
            yield proc


def _exporter_of(proc: Any) -> Any:
    try:
        return getattr(proc, "span_exporter", None)  # Batch (property) and Simple processors
    except Exception:
        return None


def application_otlp_exporter(provider: TracerProvider) -> Any:
    """The application's first OTLP span exporter, or None."""
    for proc in _processors(provider):
        exporter = _exporter_of(proc)
        module = type(exporter).__module__ if exporter is not None else ""
        if module.startswith("opentelemetry.exporter.otlp.proto."):
            return exporter
    return None


def exporter_like_application(provider: TracerProvider) -> tuple[SpanExporter, str] | None:
    """Our fast-encoding OTLP exporter aimed where the application's exporter sends.

    Returns None (the caller falls back to the application's pipeline) when the application
    has no OTLP span exporter, or its settings cannot be read on this SDK version.
    """
    app = application_otlp_exporter(provider)
    if app is None:
        return None
    try:
        if ".grpc." in type(app).__module__:
            exporter = make_grpc_exporter(
                endpoint=app._endpoint, insecure=app._insecure, credentials=app._credentials,
                headers=app._headers, timeout=app._timeout, compression=app._compression)
            return exporter, f"OTLP grpc -> {app._endpoint} (the application's exporter)"
        exporter = make_http_exporter(endpoint=app._endpoint,
                                      compression=app._compression or None)
        # The application's HTTP client carries its headers, TLS, session and timeout. Shared,
        # so our shutdown must not close it under the application.
        exporter._client = app._client
        exporter.shutdown = _mark_shut_down(exporter)  # type: ignore[method-assign]
        return exporter, f"OTLP http/protobuf -> {app._endpoint} (the application's exporter)"
    except Exception as exc:  # private fields moved in another SDK version: old behaviour
        _log.info("otel-train: could not reuse the application's OTLP exporter settings "
                  "(%r); spans join the application's pipeline", exc)
        return None


def _mark_shut_down(exporter: Any) -> Any:
    def shutdown() -> None:
        exporter._shutdown = True  # stop sending; the shared client stays open
    return shutdown
