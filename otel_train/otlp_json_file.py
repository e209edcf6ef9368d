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
    for request in read_otlp_json_lines("run/spans.jsonl"): ...   # dicts, one per line
    spans = read_span_dicts("run/")                               # every span, flattened
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags

from otel_train.otlp_encoding import row_scope, row_status
from otel_train.rate_limited_log import RateLimitedLogger

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
        from otel_train.costs import write_json_atomic
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


# -- reading ------------------------------------------------------------------------------

def _iter_lines(path: Path) -> Iterator[bytes]:
    """Complete lines of a (possibly gzip, possibly still growing) file."""
    with open(path, "rb") as fh:
        gz = path.name.endswith(".gz")
        dec = zlib.decompressobj(31) if gz else None
        rest = b""
        # Small compressed reads: gzip of these lines inflates ~20-40x, and the whole chunk
        # is held twice while it is split into lines (memory must not grow with the run).
        size = (64 << 10) if gz else (1 << 20)
        while True:
            chunk = fh.read(size)
            if not chunk:
                break
            if dec is not None:
                out = []
                while chunk:
                    try:
                        out.append(dec.decompress(chunk))
                    except zlib.error:
                        chunk = b""  # a corrupt or half-written tail: keep what decoded
                        break
                    chunk = dec.unused_data
                    if dec.eof:  # the next gzip member (a file appended to after a restart)
                        dec = zlib.decompressobj(31)
                chunk = b"".join(out)
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            yield from lines
        # A last line without its newline is being written right now: skip it.


def read_otlp_json_lines(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Each ExportTraceServiceRequest (a dict) of one file; half-written lines are skipped."""
    for line in _iter_lines(Path(path)):
        line = line.strip()
        if not line:
            continue
        try:
            yield json.loads(line)
        except ValueError:
            continue  # a torn line (the writer was killed mid-write)


def span_files(run_dir: str | os.PathLike[str]) -> list[Path]:
    """Every span file of a run directory (all ranks), each rank's files oldest first."""
    run_dir = Path(run_dir)
    if run_dir.is_file():
        return rotated_files(run_dir)
    firsts = [p for p in sorted(run_dir.glob("spans*.json*"))
              if re.fullmatch(r"spans(-rank\d+)?\.jsonl(\.gz)?", p.name)]
    seen: set[Path] = set()
    out: list[Path] = []
    for first in firsts:
        for p in rotated_files(first):
            if p not in seen:
                seen.add(p)
                out.append(p)
    # Files whose first one was removed by the cap still belong to the run.
    for p in sorted(run_dir.glob("spans*.jsonl*")):
        if p not in seen and re.fullmatch(r"spans(-rank\d+)?(\.\d+)?\.jsonl(\.gz)?", p.name):
            seen.add(p)
            out.append(p)
    return out


def any_value(value: Mapping[str, Any]) -> Any:
    """An OTLP/JSON AnyValue as a Python value."""
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [any_value(v) for v in value["arrayValue"].get("values", ())]
    if "kvlistValue" in value:
        return {kv["key"]: any_value(kv.get("value", {}))
                for kv in value["kvlistValue"].get("values", ())}
    if "bytesValue" in value:
        import base64
        return base64.b64decode(value["bytesValue"])
    return None


def attributes_dict(attrs: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    """An OTLP/JSON attribute list as a dict."""
    return {kv["key"]: any_value(kv.get("value", {})) for kv in attrs or ()}


def iter_span_dicts(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every span of a file or run directory as an OTLP/JSON span dict, plus ``resource``
    (a dict of the resource's attributes)."""
    p = Path(path)
    files = span_files(p) if p.is_dir() else [p]
    for f in files:
        for request in read_otlp_json_lines(f):
            for rs in request.get("resourceSpans", ()):
                resource = attributes_dict(rs.get("resource", {}).get("attributes"))
                for ss in rs.get("scopeSpans", ()):
                    for span in ss.get("spans", ()):
                        span["resource"] = resource
                        yield span


def read_span_dicts(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every span of a file or run directory (see :func:`iter_span_dicts`)."""
    return list(iter_span_dicts(path))


# -- a fast path for reading our own lines ---------------------------------------------------
# The report reads millions of spans: json.loads plus walking each attribute list costs ~60
# µs per span here. Lines this module wrote have a fixed key order, so a regular expression
# over the raw bytes finds each span's ids, name, times and the few train.* attributes the
# report needs at a fraction of that. Any line it cannot account for in full (another
# writer's key order, links, escapes it does not expect) goes through json.loads instead.
_SPAN_RE = re.compile(
    rb'\{"traceId":"[0-9a-f]{32}","spanId":"([0-9a-f]{16})"(?:,"traceState":"(?:[^"\\]|\\.)*")?'
    rb'(?:,"parentSpanId":"([0-9a-f]{16})")?,"flags":\d+,"name":"((?:[^"\\]|\\.)*)",'
    rb'"kind":\d+,"startTimeUnixNano":"(\d+)","endTimeUnixNano":"(\d+)"')


def attribute_pattern(keys: Sequence[str]) -> re.Pattern[bytes]:
    """A pattern finding the KeyValues of ``keys`` in a line this module wrote."""
    alternatives = b"|".join(re.escape(k.encode()) for k in keys)
    return re.compile(rb'\{"key":"(' + alternatives + rb')","value":\{"(\w+)":'
                      rb'("(?:[^"\\]|\\.)*"|[^}]*)\}\}')


_ATTR_RE = attribute_pattern([
    "train.step", "train.rank", "train.phase.kind", "train.dataloader", "train.slow",
    "train.loss", "train.device.synced", "train.gpu.utilization_ratio",
    "train.gpu.memory_used_bytes"])


def _fast_value(kind: bytes, raw: bytes) -> Any:
    if kind == b"stringValue":
        return json.loads(raw) if b"\\" in raw else raw[1:-1].decode("utf-8")
    if kind == b"intValue":
        return int(raw.strip(b'"'))
    if kind == b"boolValue":
        return raw == b"true"
    if kind == b"doubleValue":
        return float(raw.strip(b'"'))
    return None


def fast_span_fields(line: bytes, attr_re: re.Pattern[bytes] = _ATTR_RE,
                     ) -> list[tuple[str, str, str, int, int, dict[str, Any]]] | None:
    """(span id, parent id or '', name, start ns, end ns, train.* attributes found by
    ``attr_re``) per span of a line this module wrote; None when the line needs the full
    JSON parser."""
    matches = list(_SPAN_RE.finditer(line))
    if len(matches) != line.count(b'"startTimeUnixNano"') or b'"links"' in line:
        return None
    out = []
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        attrs = {k.decode(): _fast_value(t, v) for k, t, v in attr_re.findall(line, m.end(), end)}
        if line.find(b'"status":{"message"', m.end(), end) >= 0 or line.find(
                b'"code":2}', m.end(), end) >= 0:
            attrs["error"] = True
        name = m.group(3)
        out.append((m.group(1).decode(), (m.group(2) or b"").decode(),
                    json.loads(b'"' + name + b'"') if b"\\" in name else name.decode("utf-8"),
                    int(m.group(4)), int(m.group(5)), attrs))
    return out


def span_fields(span: Mapping[str, Any]) -> tuple[str, str, str, int, int, dict[str, Any]]:
    """The same fields as :func:`fast_span_fields`, from a span dict."""
    attrs = {}
    for kv in span.get("attributes", ()):
        key = kv["key"]
        if key.startswith("train."):
            attrs[key] = any_value(kv.get("value", {}))
    if span.get("status", {}).get("code") == 2:
        attrs["error"] = True
    return (span.get("spanId", ""), span.get("parentSpanId", "") or "", span.get("name", ""),
            int(span.get("startTimeUnixNano", 0)), int(span.get("endTimeUnixNano", 0)), attrs)


def iter_line_span_fields(line: bytes, attr_re: re.Pattern[bytes] = _ATTR_RE,
                          ) -> Iterator[tuple[str, str, str, int, int, dict[str, Any]]]:
    """Every span of one line as fields (fast path, else the JSON parser)."""
    fast = fast_span_fields(line, attr_re)
    if fast is not None:
        yield from fast
        return
    request = json.loads(line)
    for rs in request.get("resourceSpans", ()):
        for ss in rs.get("scopeSpans", ()):
            for span in ss.get("spans", ()):
                yield span_fields(span)
