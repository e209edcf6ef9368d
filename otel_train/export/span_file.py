"""Spans to local files in the OpenTelemetry file format: OTLP JSON lines, rotated and capped.

Each line is one ``ExportTraceServiceRequest`` in the OTLP/JSON mapping (lowerCamelCase
keys, trace and span ids as hex, 64-bit integers as strings, enums as numbers), spans grouped
by resource then scope, as the specification's file exporter writes them; the Collector's
``otlpjsonfile`` receiver reads such files (``deploy/otel-collector-replay.yaml``). One line per
export batch (the export stage sends up to ``export_batch_size`` spans, several steps, a
second), so the resource and scope are written once per line, not once per span.

Files rotate at ``max_file_bytes``: ``spans.jsonl`` first, then ``spans.1.jsonl``,
``spans.2.jsonl``... (``spans-rank3.jsonl``, ``spans-rank3.1.jsonl`` on rank 3). When the
files of one exporter pass ``max_total_bytes`` the oldest closed ones are removed; what was
removed is counted (``removed_files``, ``removed_spans``), logged, and written beside them in
``<stem>.removed.json`` for the report. With ``compression="gzip"`` every file is a gzip
stream (``.jsonl.gz``), flushed at each line so a run in progress can be read.

Usage::

    exporter = OtlpJsonFileSpanExporter("run/spans.jsonl", max_file_bytes=256 << 20)
    items = exporter.span_items(factory)            # what the export stage queues
    exporter.export(items.from_record(rec))

``otel_train.rundir.span_files`` reads these files back.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanKind, StatusCode

from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.export.encode_cache import ForeignScope, IdentityCache, KeyValueCache, by_scope
from otel_train.records.span_rows import R_SCOPE, RowSpanFactory, row_scope, rows_from_record

_log = logging.getLogger("otel_train")
DEFAULT_MAX_FILE_BYTES = 256 * 1024 * 1024
COMPRESSIONS = ("none", "gzip")
_SPAN_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3,
              SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
_STATUS_CODES = frozenset(c.value for c in StatusCode)
_ERROR = StatusCode.ERROR.value
_FLAGS_LOCAL = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, as the OTLP exporters set it
_FLAGS_REMOTE = 0x300
_ROW_KIND = {k.value: n for k, n in _SPAN_KIND.items()}  # a row's SpanKind value -> OTLP
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _any_value(value: Any) -> str:
    """An AnyValue in the OTLP/JSON mapping, as JSON text."""
    if isinstance(value, bool):
        return '{"boolValue":true}' if value else '{"boolValue":false}'
    if isinstance(value, str):
        return '{"stringValue":' + _dumps(value) + "}"
    if isinstance(value, int):
        return '{"intValue":"' + str(value) + '"}'
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            text = "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
            return '{"doubleValue":"' + text + '"}'
        return '{"doubleValue":' + repr(value) + "}"
    if isinstance(value, bytes):
        import base64
        return '{"bytesValue":"' + base64.b64encode(value).decode("ascii") + '"}'
    if isinstance(value, Mapping):
        inner = ",".join(_key_value(str(k), v) for k, v in value.items())
        return '{"kvlistValue":{"values":[' + inner + "]}}"
    if isinstance(value, Sequence):
        return '{"arrayValue":{"values":[' + ",".join(_any_value(v) for v in value) + "]}}"
    raise TypeError(f"Invalid type {type(value)} of value {value}")


def _key_value(key: str, value: Any) -> str:
    return '{"key":' + _dumps(key) + ',"value":' + _any_value(value) + "}"


class ScopedSpanText(ForeignScope, str):
    """A span's JSON text, of a user span's own scope."""


class OtlpJsonEncoder:
    """Span rows -> OTLP/JSON span text -> one ``ExportTraceServiceRequest`` line; caches
    repeated attributes."""

    def __init__(self) -> None:
        self._kv: KeyValueCache[str] = KeyValueCache(_key_value)
        self._resources: IdentityCache[str] = IdentityCache()
        self._scopes: IdentityCache[str] = IdentityCache()
        self._last_constants: tuple[Mapping[str, Any], str] | None = None

    def attributes(self, attrs: Mapping[str, Any] | None) -> str:
        """A JSON array of KeyValue (without the brackets)."""
        if not attrs:
            return ""
        return ",".join(self._kv.encode(attrs.items()))

    def _resource(self, resource: Any) -> str:
        return self._resources.get(resource, self._resource_text)

    def _resource_text(self, resource: Any) -> str:
        text = '"resource":{"attributes":[' + self.attributes(resource.attributes) + "]}"
        if resource.schema_url:
            text += ',"schemaUrl":' + _dumps(resource.schema_url)
        return text

    def _scope(self, scope: Any) -> str:
        return self._scopes.get(scope, self._scope_text)

    def _scope_text(self, scope: Any) -> str:
        parts = []
        if scope is not None:
            if scope.name:
                parts.append('"name":' + _dumps(scope.name))
            if scope.version:
                parts.append('"version":' + _dumps(scope.version))
            if scope.attributes:
                parts.append('"attributes":[' + self.attributes(scope.attributes) + "]")
        text = '"scope":{' + ",".join(parts) + "}"
        if scope is not None and scope.schema_url:
            text += ',"schemaUrl":' + _dumps(scope.schema_url)
        return text

    def _event(self, name: str, time_ns: int, attrs: Mapping[str, Any] | None) -> str:
        ev = '{"timeUnixNano":"%d","name":%s' % (time_ns or 0, _dumps(name))
        if attrs:
            ev += ',"attributes":[' + self.attributes(attrs) + "]"
        return ev + "}"

    def _link(self, trace_id: int, span_id: int, attrs: Mapping[str, Any] | None) -> str:
        """A link of a row: its context is remote, as the row factory makes it."""
        lk = '{"traceId":"%032x","spanId":"%016x"' % (trace_id, span_id)
        if attrs:
            lk += ',"attributes":[' + self.attributes(attrs) + "]"
        return lk + ',"flags":%d}' % _FLAGS_REMOTE

    @staticmethod
    def _status(status: tuple[int, str | None] | None) -> str:
        """The span's closing ``status`` member (and the span's closing brace), as the SDK's
        ``Status`` keeps a row's: an unknown code is UNSET; only an ERROR keeps its text."""
        st = []
        if status is not None:
            code, description = status
            if description and code == _ERROR:
                st.append('"message":' + _dumps(description))
            if code and code in _STATUS_CODES:
                st.append('"code":%d' % code)
        return ',"status":{' + ",".join(st) + "}}"

    def _constants_block(self, constants: Mapping[str, Any]) -> str:
        """The run's constant attributes as one piece of JSON text, kept for the last mapping
        seen (a run hands the same one every time; its values never change)."""
        last = self._last_constants
        if last is None or last[0] is not constants:
            last = self._last_constants = (constants, self.attributes(constants))
        return last[1]

    def row(self, row: tuple[Any, ...], constants: Mapping[str, Any]) -> str:
        """One Span object as JSON text from a span row (span_rows.py): the text the SDK
        span ``RowSpanFactory.span(row)`` has in the OTLP/JSON mapping."""
        (name, trace_id, span_id, _flags, parent_id, remote, start, end, attrs, status,
         events, kind, scope, links) = row
        parts = ['{"traceId":"%032x","spanId":"%016x"' % (trace_id, span_id)]
        if parent_id:
            parts.append(',"parentSpanId":"%016x"' % parent_id)
        parts.append(',"flags":%d' % (_FLAGS_REMOTE if parent_id and remote else _FLAGS_LOCAL))
        parts.append(',"name":' + _dumps(name or ""))
        parts.append(',"kind":%d' % _ROW_KIND.get(kind, 1))
        parts.append(',"startTimeUnixNano":"%d","endTimeUnixNano":"%d"' % (start, end))
        text = self._row_attributes(attrs, scope, constants)
        if text:
            parts.append(',"attributes":[' + text + "]")
        if events:
            parts.append(',"events":[' + ",".join(
                self._event(n, t, a) for n, t, a in events) + "]")
        if links:
            parts.append(',"links":[' + ",".join(
                self._link(t, sid, a) for t, sid, _f, a in links) + "]")
        parts.append(self._status(status))
        return "".join(parts)

    def _row_attributes(self, attrs: Mapping[str, Any], scope: Any,
                        constants: Mapping[str, Any]) -> str:
        """A row's attributes; otel-train's own spans (no scope) carry the run's constants
        first, a row's own value taking a constant's place."""
        if scope is not None:
            return self.attributes(attrs)
        if attrs and not constants.keys().isdisjoint(attrs):
            merged = dict(constants)
            merged.update(attrs)
            return self.attributes(merged)
        block = self._constants_block(constants)
        own = self.attributes(attrs)
        return block + "," + own if block and own else block or own

    def row_text(self, row: tuple[Any, ...], constants: Mapping[str, Any]) -> str:
        """One row as a span's JSON text for :meth:`request`; a :class:`ScopedSpanText`
        when the row has a scope of its own."""
        return ScopedSpanText.tagged(self.row(row, constants), row[R_SCOPE])

    def request(self, texts: Sequence[str], resource: Any, scope: Any) -> str:
        """One line: spans' JSON texts (:meth:`row_text`), otel-train's under ``scope``, the
        others under their own."""
        scopes = ",".join(
            "{" + self._scope(scope if key is None else row_scope(key)) + ',"spans":['
            + ",".join(group) + "]}" for key, group in by_scope(texts).items())
        return ('{"resourceSpans":[{' + self._resource(resource) + ',"scopeSpans":[' + scopes
                + "]}]}")

    def request_rows(self, rows: Sequence[tuple[Any, ...]], resource: Any, scope: Any,
                     constants: Mapping[str, Any]) -> str:
        """One line from span rows."""
        return self.request([self.row_text(row, constants) for row in rows], resource, scope)


class JsonSpanTexts:
    """The span file's queue items: each span's JSON text, made where records arrive."""

    def __init__(self, run_constants: Mapping[str, Any]) -> None:
        self._encoder = OtlpJsonEncoder()
        self._constants = dict(run_constants)

    def from_record(self, rec: tuple[Any, ...]) -> list[str]:
        """The JSON texts of one record's spans (its rows')."""
        row_text, constants = self._encoder.row_text, self._constants
        return [row_text(row, constants) for row in rows_from_record(rec)]

    def from_row(self, row: tuple[Any, ...]) -> str:
        """One span row's JSON text."""
        return self._encoder.row_text(row, self._constants)


def _split_name(path: Path) -> tuple[str, str]:
    """('spans', '.jsonl.gz') for spans.jsonl.gz; ('spans', '.jsonl') for spans.jsonl."""
    name = path.name
    for suffix in (".jsonl.gz", ".jsonl", ".json.gz", ".json", ".gz"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)], suffix
    return name, ""


def rotated_files(path: str | os.PathLike[str]) -> list[Path]:
    """The files of one exporter whose first file is ``path``, oldest first."""
    path = Path(path)
    stem, suffix = _split_name(path)
    pattern = re.compile(re.escape(stem) + r"(?:\.(\d+))?" + re.escape(suffix) + "$")
    found: list[tuple[int, Path]] = []
    if path.parent.is_dir():
        for p in path.parent.iterdir():
            m = pattern.match(p.name)
            if m:
                found.append((int(m.group(1) or 0), p))
    return [p for _, p in sorted(found)]


class OtlpJsonFileSpanExporter:
    """Writes span batches as OTLP/JSON lines to rotating, size-capped (optionally gzip) files."""

    def __init__(self, path: str | os.PathLike[str], max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
                 max_total_bytes: int | None = None, compression: str = "none") -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"option 'spans_compression'={compression!r}: must be one of "
                             f"{', '.join(COMPRESSIONS)}")
        if not isinstance(max_file_bytes, int) or max_file_bytes < 1:
            raise ValueError(f"option 'spans_file_max_bytes'={max_file_bytes!r}: must be an "
                             "integer >= 1")
        if max_total_bytes is not None and (not isinstance(max_total_bytes, int)
                                            or max_total_bytes < max_file_bytes):
            raise ValueError(f"option 'spans_total_max_bytes'={max_total_bytes!r}: must be "
                             "None or an integer >= spans_file_max_bytes")
        path = Path(path)
        if compression == "gzip" and not path.name.endswith(".gz"):
            path = path.with_name(path.name + ".gz")
        self.path = path
        self.compression = compression
        self.max_file_bytes = max_file_bytes
        self.max_total_bytes = max_total_bytes
        self.removed_files = 0
        self.removed_bytes = 0
        self.removed_spans = 0
        self._stem, self._suffix = _split_name(path)
        self._encoder = OtlpJsonEncoder()
        self._factory: RowSpanFactory | None = None
        self._lock = threading.Lock()
        self._warn = RateLimitedLogger(_log)
        path.parent.mkdir(parents=True, exist_ok=True)
        existing = rotated_files(path)
        # A restarted rank (same run id) appends to its last file instead of overwriting.
        self._files: list[list[Any]] = [[p, p.stat().st_size, 0] for p in existing]
        self._seq = len(existing) - 1 if existing else 0
        if existing:
            m = re.search(r"\.(\d+)" + re.escape(self._suffix) + "$", existing[-1].name)
            self._seq = int(m.group(1)) if m else 0
        self._file: IO[bytes] | None = None
        self._gz: Any = None
        self._open(self._file_path(self._seq))

    def _file_path(self, seq: int) -> Path:
        name = f"{self._stem}{self._suffix}" if seq == 0 else f"{self._stem}.{seq}{self._suffix}"
        return self.path.with_name(name)

    def _open(self, path: Path) -> None:
        self._file = open(path, "ab")  # noqa: SIM115  (the user's umask decides the mode)
        self._gz = zlib.compressobj(6, zlib.DEFLATED, 31) if self.compression == "gzip" else None
        if not self._files or self._files[-1][0] != path:
            self._files.append([path, self._file.tell(), 0])

    def _close_file(self) -> None:
        if self._file is None:
            return
        if self._gz is not None:
            self._file.write(self._gz.flush(zlib.Z_FINISH))
        self._file.close()
        self._files[-1][1] = os.path.getsize(self._files[-1][0])
        self._file = None

    def span_items(self, factory: RowSpanFactory) -> JsonSpanTexts:
        """What the stage queues: each span's JSON text, joined into a line as it is."""
        self._factory = factory
        return JsonSpanTexts(factory.run_constants)

    def export(self, texts: Sequence[str]) -> SpanExportResult:
        """Append one line (an ExportTraceServiceRequest) holding the spans' JSON texts;
        rotate if due."""
        if not texts:
            return SpanExportResult.SUCCESS
        if self._factory is None:
            raise RuntimeError("span_items() was not called: nothing says what the items are")
        line = self._encoder.request(texts, self._factory.resource, self._factory.scope)
        data = (line + "\n").encode("utf-8")
        with self._lock:
            if self._file is None:
                return SpanExportResult.FAILURE
            if self._gz is not None:
                # A sync flush per line: a reader of a run in progress sees whole lines.
                data = self._gz.compress(data) + self._gz.flush(zlib.Z_SYNC_FLUSH)
            self._file.write(data)
            self._file.flush()
            current = self._files[-1]
            current[1] += len(data)
            current[2] += len(texts)
            if current[1] >= self.max_file_bytes:
                self._rotate()
        return SpanExportResult.SUCCESS

    def _rotate(self) -> None:
        self._close_file()
        self._seq += 1
        self._open(self._file_path(self._seq))
        cap = self.max_total_bytes
        if cap is None:
            return
        total = sum(f[1] for f in self._files)
        removed = []
        while total > cap and len(self._files) > 1:
            path, size, count = self._files.pop(0)
            try:
                os.unlink(path)
            except OSError:
                pass
            total -= size
            removed.append(path.name)
            self.removed_files += 1
            self.removed_bytes += size
            self.removed_spans += count
        if removed:
            self._warn.warning(
                "span-file-cap", "otel-train: span files over spans_total_max_bytes=%d: "
                "removed the oldest (%s); %d file(s), %d span(s) removed so far", cap,
                ", ".join(removed), self.removed_files, self.removed_spans)
            self._write_removed()

    def _write_removed(self) -> None:
        from otel_train.common.files import write_json_atomic
        try:
            write_json_atomic(self.path.with_name(f"{self._stem}.removed.json"), {
                "removed_files": self.removed_files, "removed_bytes": self.removed_bytes,
                "removed_spans": self.removed_spans,
                "max_total_bytes": self.max_total_bytes})
        except OSError as exc:
            self._warn.warning("span-file-cap-write", "otel-train: cannot record removed span "
                               "files: %r", exc)

    def shutdown(self) -> None:
        """Finish and close the current file."""
        with self._lock:
            self._close_file()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Lines are flushed on every export."""
        return True
