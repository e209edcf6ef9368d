"""The exporter an export plan names: OTLP (one attempt per call), the span file, console.

OTLP and the span file encode span records and rows themselves (``span_items.SpanItemExporter``);
the console exporter is the SDK's, a plain ``SpanExporter`` that the export stage feeds SDK
spans made at export time (``span_items.ReadableSpanEdge``).

Usage::

    exporter = create_exporter(plan_export(options, status_dir, rank, world_size))
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter

from otel_train.common.rate_limited_log import warn_once
from otel_train.common.sdk_config import ExportPlan, _header_names_and_values, url_secrets
from otel_train.export.span_items import SpanItemExporter


def create_exporter(plan: ExportPlan, env: Mapping[str, str] | None = None
                    ) -> SpanItemExporter | SpanExporter | None:
    """The exporter for ``plan`` (None for 'none').

    OTLP exporters make one attempt per call (export/otlp/transport.py): retrying, backoff and
    probing belong to ``BoundedBatchSpanProcessor``, which never blocks on them.
    """
    env = os.environ if env is None else env
    if plan.kind == "otlp":
        from otel_train.export.otlp.transport import (
            SingleAttemptGrpcSpanExporter,
            SingleAttemptHttpSpanExporter,
        )
        secrets = url_secrets(plan.endpoint) + _header_names_and_values(env)[1]
        kwargs: dict[str, Any] = {"timeout": plan.timeout_seconds,
                                  "max_request_bytes": plan.max_request_bytes,
                                  "secrets": secrets}
        # The SDK's exporters read every OTEL_EXPORTER_OTLP_* setting themselves; the spans
        # are encoded by otel-train's own encoder (export/otlp/encoding.py), from records.
        if plan.protocol == "grpc":
            if plan.endpoint:
                kwargs["endpoint"] = _grpc_endpoint(plan.endpoint)
            return SingleAttemptGrpcSpanExporter(**kwargs)
        if plan.endpoint:
            endpoint = plan.endpoint
            if not plan.endpoint_is_signal_specific:
                endpoint = endpoint.rstrip("/")
                if not endpoint.endswith("/v1/traces"):
                    endpoint += "/v1/traces"
            kwargs["endpoint"] = endpoint  # userinfo here is sent as HTTP basic auth
        return SingleAttemptHttpSpanExporter(**kwargs)
    if plan.kind == "jsonl":
        # The OpenTelemetry file format (OTLP JSON lines), as the spec's file exporter.
        from otel_train.export.span_file import OtlpJsonFileSpanExporter
        assert plan.path is not None
        return OtlpJsonFileSpanExporter(plan.path, plan.max_file_bytes, plan.max_total_bytes,
                                        plan.compression)
    if plan.kind == "console":
        return ConsoleSpanExporter()
    return None


def _grpc_endpoint(endpoint: str) -> str:
    """The endpoint without userinfo: gRPC has no URL credentials (and would log them)."""
    try:
        parts = urlsplit(endpoint)
    except ValueError:
        return endpoint
    if "@" not in parts.netloc:
        return endpoint
    warn_once("grpc-userinfo", "otel-train: credentials in an OTLP/gRPC endpoint URL are not "
              "sent (gRPC has no URL credentials); pass them as a header in "
              "OTEL_EXPORTER_OTLP_HEADERS, e.g. authorization=Basic%%20...")
    return urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[1], parts.path, parts.query,
                       parts.fragment))
