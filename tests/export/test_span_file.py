"""The span file is the OpenTelemetry file format: OTLP JSON lines that opentelemetry-proto's
JSON mapping decodes into exactly the request the SDK's OTLP encoder builds; files rotate,
are capped (oldest removed, counted) and optionally gzip, and a half-written line is skipped."""

from __future__ import annotations

import base64
import gzip
import json
import os
import stat

import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from span_samples import _records_and_rows
from train_helpers import clean_env, read_file_spans, start_test_run  # noqa: F401

from otel_train.export.span_file import OtlpJsonEncoder, OtlpJsonFileSpanExporter, rotated_files
from otel_train.rundir.span_files import read_otlp_json_lines, read_span_dicts, span_files


def _hex_ids_to_base64(obj):
    """OTLP/JSON writes ids as hex; protobuf's generic JSON mapping expects base64 bytes."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str):
                out[k] = base64.b64encode(bytes.fromhex(v)).decode("ascii")
            else:
                out[k] = _hex_ids_to_base64(v)
        return out
    if isinstance(obj, list):
        return [_hex_ids_to_base64(v) for v in obj]
    return obj


def _decode_line(line: dict) -> ExportTraceServiceRequest:
    msg = ExportTraceServiceRequest()
    json_format.ParseDict(_hex_ids_to_base64(line), msg)  # unknown keys would raise
    return msg


class _Spans:
    """Span rows of steps of every shape and of user spans, with the run's row factory."""

    def __init__(self, tmp_path) -> None:
        self.rows, self.user_rows, self.factory = _records_and_rows(tmp_path / "src")

    def texts(self, exporter: OtlpJsonFileSpanExporter, rows) -> list[str]:
        """``rows`` as the export stage queues them for ``exporter``."""
        items = exporter.span_items(self.factory)
        return [items.from_row(row) for row in rows]

    def line(self, rows) -> str:
        """The line ``rows`` are written as."""
        f = self.factory
        return OtlpJsonEncoder().request_rows(rows, f.resource, f.scope, f.run_constants)


def test_each_line_decodes_with_the_proto_json_mapping_to_what_the_sdk_encodes(tmp_path):
    made = _Spans(tmp_path)
    ours, user = made.rows, made.user_rows  # user: links, events, remote parents, statuses
    exporter = OtlpJsonFileSpanExporter(tmp_path / "spans.jsonl")
    for batch in (ours, user, ours + user):  # several scopes in one line
        exporter.export(made.texts(exporter, batch))
    exporter.shutdown()
    lines = (tmp_path / "spans.jsonl").read_text().splitlines()
    assert len(lines) == 3
    for line, rows in zip(lines, (ours, user, ours + user)):
        decoded = _decode_line(json.loads(line))
        assert decoded == encode_spans(made.factory.spans(rows))
        # And back: the proto re-serialised to JSON parses to the same message.
        again = ExportTraceServiceRequest()
        json_format.Parse(json_format.MessageToJson(decoded), again)
        assert again == decoded


def test_the_resource_is_written_once_per_line_not_once_per_span(tmp_path):
    made = _Spans(tmp_path)
    exporter = OtlpJsonFileSpanExporter(tmp_path / "spans.jsonl")
    exporter.export(made.texts(exporter, made.rows))
    exporter.shutdown()
    (line,) = read_otlp_json_lines(tmp_path / "spans.jsonl")
    (rs,) = line["resourceSpans"]
    (ss,) = rs["scopeSpans"]
    assert len(ss["spans"]) == len(made.rows) > 15
    assert (tmp_path / "spans.jsonl").read_text().count('"service.name"') == 1
    first = ss["spans"][0]
    assert len(first["traceId"]) == 32 and len(first["spanId"]) == 16  # hex, per OTLP/JSON
    assert isinstance(first["startTimeUnixNano"], str)  # 64-bit integers as strings


def test_files_rotate_at_the_size_and_the_oldest_are_removed_over_the_cap(tmp_path):
    made = _Spans(tmp_path)
    spans = made.rows
    one_line = len(made.line(spans))
    exporter = OtlpJsonFileSpanExporter(tmp_path / "run" / "spans.jsonl",
                                        max_file_bytes=one_line * 2,
                                        max_total_bytes=one_line * 5)
    for _ in range(12):
        exporter.export(made.texts(exporter, spans))
    exporter.shutdown()
    files = rotated_files(tmp_path / "run" / "spans.jsonl")
    names = [p.name for p in files]
    # Two lines per file: six full files and a fresh one; the four oldest were removed to
    # stay within the cap (five lines' worth), leaving two full files and the new one.
    assert names == ["spans.4.jsonl", "spans.5.jsonl", "spans.6.jsonl"]
    assert sum(p.stat().st_size for p in files) <= one_line * 5 + one_line
    assert (exporter.removed_files, exporter.removed_spans) == (4, 8 * len(spans))
    removed = json.loads((tmp_path / "run" / "spans.removed.json").read_text())
    assert removed["removed_files"] == 4 and removed["removed_spans"] == 8 * len(spans)
    assert len(read_span_dicts(tmp_path / "run")) == 4 * len(spans)  # what is left, in order
    assert span_files(tmp_path / "run") == files


def test_gzip_files_are_readable_while_being_written_and_after_a_restart(tmp_path):
    made = _Spans(tmp_path)
    spans = made.rows
    path = tmp_path / "spans.jsonl"
    exporter = OtlpJsonFileSpanExporter(path, compression="gzip")
    assert exporter.path.name == "spans.jsonl.gz"
    exporter.export(made.texts(exporter, spans))
    # Not closed yet (a run in progress): the flushed line is already readable.
    assert len(read_span_dicts(exporter.path)) == len(spans)
    exporter.shutdown()
    again = OtlpJsonFileSpanExporter(path, compression="gzip")  # appends a gzip member
    again.export(made.texts(again, spans))
    again.shutdown()
    assert len(read_span_dicts(exporter.path)) == 2 * len(spans)
    with gzip.open(exporter.path, "rt") as fh:  # a standard gzip reader agrees
        assert len(fh.read().splitlines()) == 2
    assert os.path.getsize(exporter.path) * 4 < len(made.line(spans).encode()) * 2


def test_a_half_written_last_line_is_skipped(tmp_path):
    made = _Spans(tmp_path)
    spans = made.rows
    exporter = OtlpJsonFileSpanExporter(tmp_path / "spans.jsonl")
    exporter.export(made.texts(exporter, spans))
    exporter.shutdown()
    with open(tmp_path / "spans.jsonl", "a") as fh:
        fh.write('{"resourceSpans":[{"resource":{"attr')  # the writer was killed here
    assert len(read_span_dicts(tmp_path / "spans.jsonl")) == len(spans)


def test_bad_file_options_are_refused_naming_the_option(tmp_path):
    with pytest.raises(ValueError, match="spans_compression"):
        OtlpJsonFileSpanExporter(tmp_path / "s.jsonl", compression="zip")
    with pytest.raises(ValueError, match="spans_total_max_bytes"):
        OtlpJsonFileSpanExporter(tmp_path / "s.jsonl", max_file_bytes=100, max_total_bytes=10)


def test_a_run_writes_its_spans_in_the_file_format_with_the_umask_for_every_file(tmp_path):
    old = os.umask(0o027)
    try:
        with start_test_run(tmp_path, spans_path=None, spans_compression="gzip",
                            costs_interval_seconds=0.1) as run:
            for step in run.steps(range(3)):
                with step.phase("forward"):
                    pass
    finally:
        os.umask(old)
    assert run.spans_path == tmp_path / "spans.jsonl.gz"
    assert {s.name for s in read_file_spans(tmp_path)} == {"train.step", "data", "forward"}
    for name in ("spans.jsonl.gz", "monitoring_costs.json"):
        mode = stat.S_IMODE((tmp_path / name).stat().st_mode)
        assert mode == 0o640, (name, oct(mode))


def test_the_fast_reader_agrees_with_the_json_parser_on_every_span(tmp_path):
    from otel_train.rundir.span_files import fast_span_fields, span_fields

    made = _Spans(tmp_path)
    ours = made.rows  # data spans, monitoring, an error, a float loss
    line = made.line(ours).encode()
    fast = fast_span_fields(line)
    assert fast is not None and len(fast) == len(ours)
    slow = [span_fields(s) for rs in json.loads(line)["resourceSpans"]
            for ss in rs["scopeSpans"] for s in ss["spans"]]
    keys = {"train.step", "train.rank", "train.phase.kind", "train.dataloader", "train.slow",
            "train.loss", "train.device.synced", "error"}
    for f, s in zip(fast, slow):
        assert f[:5] == s[:5]
        assert f[5] == {k: v for k, v in s[5].items() if k in keys}
    assert any(f[5].get("error") for f in fast)
    # A line it cannot account for in full (links) goes to the JSON parser.
    assert fast_span_fields(made.line(made.user_rows).encode()) is None


def test_span_rows_are_written_as_exactly_the_text_of_the_spans_made_from_them(tmp_path):
    from otel_train.common import attributes as A

    rows, user_rows, factory = _records_and_rows(tmp_path)
    odd = rows[0][:8] + (dict(rows[0][8], **{A.RANK: 9}),) + rows[0][9:]
    bare = rows[1][:8] + ({},) + rows[1][9:]  # no attributes of its own
    every = rows + user_rows + [odd, bare]
    exporter = OtlpJsonFileSpanExporter(tmp_path / "rows.jsonl")
    items = exporter.span_items(factory)
    for batch in (rows, every, user_rows, [odd], [bare]):
        exporter.export([items.from_row(row) for row in batch])
    exporter.shutdown()
    lines = (tmp_path / "rows.jsonl").read_text().splitlines()
    for line, batch in zip(lines, (rows, every, user_rows, [odd], [bare])):
        assert _decode_line(json.loads(line)) == encode_spans(factory.spans(batch))
