"""Export: the bounded stage, OTLP encoding and transport, the exporter process, the span file.

``BoundedBatchSpanProcessor`` and ``JsonLinesSpanExporter`` stay importable from here
(``otel_train.export.BoundedBatchSpanProcessor``), as they are part of the public API.
"""

from __future__ import annotations

from otel_train.export.stage import BoundedBatchSpanProcessor, JsonLinesSpanExporter

__all__ = ["BoundedBatchSpanProcessor", "JsonLinesSpanExporter"]
