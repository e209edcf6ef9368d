"""A plain SDK ``SpanExporter`` writing one JSON object per span per line, and its reader.

``JsonLinesSpanExporter`` writes the SDK's ``ReadableSpan.to_json`` shape, for applications
that want that format (it is public: ``otel_train.sdk.JsonLinesSpanExporter``). The span file a run
writes by default is the OpenTelemetry file format instead (``span_file.py``).

Usage::

    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter("spans.jsonl")))
    spans = read_spans_jsonl("spans.jsonl")
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


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
