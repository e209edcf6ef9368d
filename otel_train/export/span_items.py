"""What the export stage queues: one kind of item per exporter, made from span records and rows.

The stage (``stage.BoundedBatchSpanProcessor``) takes span records (steps) and span rows (user
spans) and queues, for its exporter, the item that exporter sends: OTLP encoded spans
(``otlp.encoding``: ``bytes``), OTLP/JSON span text (``span_file``: ``str``), or span rows for
an exporter outside otel-train that needs SDK ``ReadableSpan``s, made from the rows when the
batch is exported (:class:`ReadableSpanEdge`: the console exporter, an application's
exporter). An exporter says which by :meth:`SpanItemExporter.span_items`; the stage never
looks at an item to find out what it is.

Usage::

    items = exporter.span_items(factory)       # or ReadableSpanEdge(sdk_exporter, factory)
    queued = items.from_record(rec) + [items.from_row(row)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_train.records.span_rows import RowSpanFactory, rows_from_record


class SpanItems(Protocol):
    """Makes an exporter's queue items from span records and span rows."""

    def from_record(self, rec: tuple[Any, ...]) -> list[Any]:
        """The items of one span record's spans, in the order they ended."""

    def from_row(self, row: tuple[Any, ...]) -> Any:
        """The item of one span row."""


class SpanItemExporter(Protocol):
    """An exporter the stage drives with items it made (see the module docstring)."""

    def span_items(self, factory: RowSpanFactory) -> SpanItems:
        """The items this exporter takes, for spans of ``factory``'s resource and scope."""

    def shutdown(self) -> None:
        """Release what the exporter holds."""


class SpanRowItems:
    """Items that are span rows (span_rows.py), for an exporter that makes SDK spans."""

    @staticmethod
    def from_record(rec: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """The record's rows (its phases' span ids drawn here)."""
        return rows_from_record(rec)

    @staticmethod
    def from_row(row: tuple[Any, ...]) -> tuple[Any, ...]:
        """The row itself."""
        return row


class ReadableSpanEdge:
    """A plain SDK ``SpanExporter`` behind the stage: rows are queued, and the batch becomes
    ``ReadableSpan``s (``RowSpanFactory``) only when it is exported, for that exporter."""

    def __init__(self, exporter: SpanExporter, factory: RowSpanFactory) -> None:
        self.exporter = exporter
        self._factory = factory

    def span_items(self, factory: RowSpanFactory) -> SpanItems:
        """Span rows."""
        self._factory = factory
        return SpanRowItems()

    def export(self, rows: Sequence[tuple[Any, ...]]) -> SpanExportResult:
        """Export the rows' spans through the SDK exporter."""
        return self.exporter.export(self._factory.spans(rows))

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """The SDK exporter's flush."""
        return bool(self.exporter.force_flush(timeout_millis))

    def shutdown(self) -> None:
        """The SDK exporter's shutdown."""
        self.exporter.shutdown()
