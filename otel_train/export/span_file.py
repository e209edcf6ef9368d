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

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

from otel_train.export.otlp.encoding import row_scope, row_status
from otel_train.common.rate_limited_log import RateLimitedLogger

_log = logging.getLogger("otel_train")
DEFAULT_MAX_FILE_BYTES = 256 * 1024 * 1024
COMPRESSIONS = ("none", "gzip")
_SPAN_KIND = {SpanKind.INTERNAL: 1, SpanKind.SERVER: 2, SpanKind.CLIENT: 3,
              SpanKind.PRODUCER: 4, SpanKind.CONSUMER: 5}
_FLAGS_LOCAL = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, as the OTLP exporters set it
_FLAGS_REMOTE = 0x300
_MAX_CACHED = 8192
_SCALARS = frozenset((str, bool, int, float))
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


class OtlpJsonEncoder:
    """Spans -> one OTLP/JSON ``ExportTraceServiceRequest`` line; caches repeated attributes."""

    def __init__(self) -> None:
        self._kv: dict[tuple[str, type, Any], str] = {}
        self._resources: dict[int, tuple[Any, str]] = {}
        self._scopes: dict[int, tuple[Any, str]] = {}

    def attributes(self, attrs: Mapping[str, Any] | None) -> str:
        """A JSON array of KeyValue (without the brackets)."""
        if not attrs:
            return ""
        cache = self._kv
        out = []
        for key, value in attrs.items():
            t = type(value)
            if t in _SCALARS:
                ck = (key, t, value)
                kv = cache.get(ck)
                if kv is None:
                    kv = _key_value(key, value)
                    if len(cache) >= _MAX_CACHED:
                        cache.clear()
                    cache[ck] = kv
            else:
                try:
                    kv = _key_value(key, value)
                except Exception as exc:  # the SDK logs and skips such an attribute too
                    _log.debug("otel-train: cannot encode attribute %s: %r", key, exc)
                    continue
            out.append(kv)
        return ",".join(out)

    def _resource(self, resource: Any) -> str:
        hit = self._resources.get(id(resource))
        if hit is not None and hit[0] is resource:
            return hit[1]
        text = '"resource":{"attributes":[' + self.attributes(resource.attributes) + "]}"
        if resource.schema_url:
            text += ',"schemaUrl":' + _dumps(resource.schema_url)
        self._resources[id(resource)] = (resource, text)
        return text

    def _scope(self, scope: Any) -> str:
        hit = self._scopes.get(id(scope))
        if hit is not None and hit[0] is scope:
            return hit[1]
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
        self._scopes[id(scope)] = (scope, text)
        return text

    def span(self, span: ReadableSpan) -> str:
        """One Span object as JSON text."""
        ctx = span.context
        parent = span.parent
        parts = ['{"traceId":"%032x","spanId":"%016x"' % (ctx.trace_id, ctx.span_id)]
        state = ctx.trace_state
        if state:
            parts.append(',"traceState":' + _dumps(",".join(f"{k}={v}" for k, v in state.items())))
        if parent is not None:
            parts.append(',"parentSpanId":"%016x"' % parent.span_id)
        parts.append(',"flags":%d' % (_FLAGS_REMOTE if parent is not None and parent.is_remote
                                      else _FLAGS_LOCAL))
        parts.append(',"name":' + _dumps(span.name or ""))
        parts.append(',"kind":%d' % _SPAN_KIND[span.kind])
        parts.append(',"startTimeUnixNano":"%d","endTimeUnixNano":"%d"'
                     % (span.start_time or 0, span.end_time or 0))
        if span.attributes:
            parts.append(',"attributes":[' + self.attributes(span.attributes) + "]")
        # Our spans hold plain dicts (never truncated); the SDK's dropped_* checks cost.
        plain = type(getattr(span, "_attributes", None)) is dict
        if not plain and span.dropped_attributes:
            parts.append(',"droppedAttributesCount":%d' % span.dropped_attributes)
        if span.events:
            parts.append(',"events":[' + ",".join(map(self._event, span.events)) + "]")
        if not plain and span.dropped_events:
            parts.append(',"droppedEventsCount":%d' % span.dropped_events)
        if span.links:
            parts.append(',"links":[' + ",".join(map(self._link, span.links)) + "]")
        if not plain and span.dropped_links:
            parts.append(',"droppedLinksCount":%d' % span.dropped_links)
        parts.append(self._status(span.status))
        return "".join(parts)

    def _event(self, event: Any) -> str:
        ev = '{"timeUnixNano":"%d","name":%s' % (event.timestamp or 0, _dumps(event.name))
        if event.attributes:
            ev += ',"attributes":[' + self.attributes(event.attributes) + "]"
        if event.dropped_attributes:
            ev += ',"droppedAttributesCount":%d' % event.dropped_attributes
        return ev + "}"

    def _link(self, link: Any) -> str:
        lc = link.context
        lk = '{"traceId":"%032x","spanId":"%016x"' % (lc.trace_id, lc.span_id)
        if link.attributes:
            lk += ',"attributes":[' + self.attributes(link.attributes) + "]"
        if link.dropped_attributes:
            lk += ',"droppedAttributesCount":%d' % link.dropped_attributes
        return lk + ',"flags":%d}' % (_FLAGS_REMOTE if lc.is_remote else _FLAGS_LOCAL)

    def _status(self, status: Any) -> str:
        """The span's closing ``status`` member (and the span's closing brace)."""
        st = []
        if status is not None:
            if status.description:
                st.append('"message":' + _dumps(status.description))
            if status.status_code.value:
                st.append('"code":%d' % status.status_code.value)
        return ',"status":{' + ",".join(st) + "}}"

    def row(self, row: tuple[Any, ...], constants: Mapping[str, Any], block: str) -> str:
        """One Span object as JSON text from a span row (span_rows.py): the same text as
        ``span(RowSpanFactory.span(row))``, with no span made."""
        (name, trace_id, span_id, _flags, parent_id, remote, start, end, attrs, status,
         events, kind, scope, links) = row
        parts = ['{"traceId":"%032x","spanId":"%016x"' % (trace_id, span_id)]
        if parent_id:
            parts.append(',"parentSpanId":"%016x"' % parent_id)
        parts.append(',"flags":%d' % (_FLAGS_REMOTE if parent_id and remote else _FLAGS_LOCAL))
        parts.append(',"name":' + _dumps(name or ""))
        parts.append(',"kind":%d' % _ROW_KIND.get(kind, 1))
        parts.append(',"startTimeUnixNano":"%d","endTimeUnixNano":"%d"' % (start, end))
        if scope is None:  # otel-train's own span: the run's constants first
            if attrs and not constants.keys().isdisjoint(attrs):
                merged = dict(constants)
                merged.update(attrs)
                text = self.attributes(merged)
            elif attrs:
                own = self.attributes(attrs)
                text = block + "," + own if block and own else block or own
            else:
                text = block
            if text:
                parts.append(',"attributes":[' + text + "]")
        elif attrs:
            parts.append(',"attributes":[' + self.attributes(attrs) + "]")
        # Events, links and statuses are rare (failures, user spans): made as the factory
        # makes them, then written by the span path's own code.
        if events:
            parts.append(',"events":[' + ",".join(
                self._event(Event(n, a, timestamp=t)) for n, t, a in events) + "]")
        if links:
            parts.append(',"links":[' + ",".join(
                self._link(Link(SpanContext(t, sid, True, TraceFlags(f)), a))
                for t, sid, f, a in links) + "]")
        parts.append(',"status":{}}' if status is None else self._status(row_status(status)))
        return "".join(parts)

    def request_rows(self, rows: Sequence[tuple[Any, ...]], resource: Any, scope: Any,
                     constants: Mapping[str, Any]) -> str:
        """One line from span rows: the same text as ``request`` of the rows' spans
        (``RowSpanFactory(resource, scope, constants)``)."""
        block = self.attributes(constants)
        by_scope: dict[Any, list[str]] = {}
        encode = self.row
        for row in rows:
            by_scope.setdefault(row[12], []).append(encode(row, constants, block))
        scopes = ",".join(
            "{" + self._scope(scope if key is None else row_scope(key)) + ',"spans":['
            + ",".join(encoded) + "]}" for key, encoded in by_scope.items())
        return ('{"resourceSpans":[{' + self._resource(resource) + ',"scopeSpans":[' + scopes
                + "]}]}")

    def request(self, spans: Sequence[ReadableSpan]) -> str:
        """One line: the spans grouped by resource, then by scope."""
        groups: dict[int, tuple[Any, dict[int, tuple[Any, list[str]]]]] = {}
        for span in spans:
            scope = span.instrumentation_scope or None
            by_scope = groups.setdefault(id(span.resource), (span.resource, {}))[1]
            by_scope.setdefault(id(scope), (scope, []))[1].append(self.span(span))
        out = []
        for resource, by_scope in groups.values():
            scopes = ",".join("{" + self._scope(scope) + ',"spans":[' + ",".join(encoded) + "]}"
                              for scope, encoded in by_scope.values())
            out.append("{" + self._resource(resource) + ',"scopeSpans":[' + scopes + "]}")
        return '{"resourceSpans":[' + ",".join(out) + "]}"


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


class OtlpJsonFileSpanExporter(SpanExporter):
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
        self._rows: tuple[Any, Any, dict[str, Any]] | None = None
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

    def use_rows(self, resource: Any, scope: Any, run_constants: Mapping[str, Any]) -> None:
        """Take span rows (span_rows.py) as well as spans: rows are written as the same
        text their ``RowSpanFactory(resource, scope, run_constants)`` spans would give, with
        no span made (the exporter process's path)."""
        self._rows = (resource, scope, dict(run_constants))

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        """Append one line (an ExportTraceServiceRequest) holding ``spans``; rotate if due."""
        if not spans:
            return SpanExportResult.SUCCESS
        if self._rows is not None and type(spans[0]) is tuple:
            line = self._encoder.request_rows(spans, *self._rows)
        else:
            line = self._encoder.request(spans)
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
            current[2] += len(spans)
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
