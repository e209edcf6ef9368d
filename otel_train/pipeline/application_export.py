"""When the application already has an SDK TracerProvider: where its spans go, and the edge
into its pipeline.

Under ``opentelemetry-instrument`` (or any app that installs a TracerProvider with an OTLP
exporter) otel-train has two ways to send its spans. With ``trace_export="own"`` (the default)
it keeps its bounded, drop-counting export stage and sends to **where the application
sends**: the endpoint, headers, TLS settings, timeout and compression of the application's
OTLP span exporter, found among its provider's span processors
(:func:`exporter_like_application`). When the application exports somewhere else (console,
in-memory, a vendor exporter), nothing is found, or ``trace_export="application"``, the spans
join the application's own pipeline (:class:`ApplicationProviderSink`): there, and only there,
otel-train's span records become SDK ``ReadableSpan``s, since the application's processors
take nothing else.

Usage::

    found = exporter_like_application(provider)   # (exporter, "OTLP grpc -> host:4317") | None
    sink = ApplicationProviderSink(provider, factory)
    sink.on_records(records)                       # from the span worker
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

from otel_train.common import sdk_private
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.export.otlp.transport import (
    SingleAttemptGrpcSpanExporter,
    SingleAttemptHttpSpanExporter,
)
from otel_train.records.span_rows import C_FLAGS, RowSpanFactory, rows_from_record

_log = logging.getLogger("otel_train")


class ApplicationProviderSink:
    """The edge into an application's TracerProvider: each sampled span record's rows become
    ``ReadableSpan``s and go to the provider's span processors."""

    def __init__(self, provider: TracerProvider, factory: RowSpanFactory) -> None:
        self._target = sdk_private.active_span_processor(provider)
        self._factory = factory
        self._warn = RateLimitedLogger(_log)

    def on_records(self, records: Sequence[tuple[Any, ...]],
                   rows: Sequence[tuple[Any, ...]] = ()) -> None:
        """Hand the records' spans (and rows) on, in the order they ended; never raises."""
        target = self._target
        if target is None:
            return
        for rec in records:
            if rec[C_FLAGS] & 1:  # unsampled: it fed the metrics only
                self._hand_on(target, rows_from_record(rec))
        self._hand_on(target, rows)

    def close(self) -> None:
        """Nothing is held here."""

    def _hand_on(self, target: Any, rows: Sequence[tuple[Any, ...]]) -> None:
        for span in self._factory.spans(rows):
            try:
                target.on_end(span)
            except Exception as exc:  # the application's processor must never stop the flow
                self._warn.warning("app-proc", "otel-train: the application's span "
                                   "processor failed: %r", exc)


def _processors(provider: TracerProvider) -> Iterator[Any]:
    """The span processors installed on ``provider`` (nested multi-processors flattened)."""
    stack = [sdk_private.active_span_processor(provider)]
    while stack:
        proc = stack.pop()
        if proc is None:
            continue
        inner = sdk_private.inner_span_processors(proc)
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


def exporter_like_application(provider: TracerProvider) -> tuple[Any, str] | None:
    """otel-train's single-attempt OTLP exporter aimed where the application's exporter sends.

    Returns None (the caller falls back to the application's pipeline) when the application
    has no OTLP span exporter, or its settings cannot be read on this SDK version.
    """
    app = application_otlp_exporter(provider)
    if app is None:
        return None
    try:
        endpoint = sdk_private.otlp_endpoint(app)
        if ".grpc." in type(app).__module__:
            exporter: Any = SingleAttemptGrpcSpanExporter(**sdk_private.grpc_settings(app))
            return exporter, f"OTLP grpc -> {endpoint} (the application's exporter)"
        client = sdk_private.http_client(app)
        if client is None:  # an SDK before the HTTP client: its settings are not readable
            return None
        exporter = SingleAttemptHttpSpanExporter(
            endpoint=endpoint, compression=sdk_private.http_compression(app) or None)
        # The application's HTTP client carries its headers, TLS, session and timeout.
        exporter.share_client(client)
        return exporter, f"OTLP http/protobuf -> {endpoint} (the application's exporter)"
    except sdk_private.SdkPrivateMismatch as exc:
        _log.warning("otel-train: %s; its spans join the application's pipeline", exc)
        return None
    except Exception as exc:  # the application's settings do not make an exporter
        _log.info("otel-train: could not reuse the application's OTLP exporter settings "
                  "(%r); spans join the application's pipeline", exc)
        return None
