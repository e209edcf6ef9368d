"""Reading span files back: OTLP JSON lines (``export/span_file.py`` writes them).

Half-written lines (a run still writing, a crash) are skipped; gzip files are read as streams
in small chunks, so memory does not grow with the run.

Usage::

    for request in read_otlp_json_lines("run/spans.jsonl"): ...   # dicts, one per line
    spans = read_span_dicts("run/")                               # every span, flattened
"""

from __future__ import annotations

import json
import os
import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from otel_train.export.span_file import rotated_files

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
    "train.gpu.memory_used_bytes", "train.truncated", "train.truncated.reason"])


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
