"""The fast OTLP encoder produces exactly the message the SDK's encoder builds."""

from __future__ import annotations

import time

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans, Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from span_samples import _records, _records_and_rows, _sdk_spans, run_shaped_steps
from train_helpers import clean_env, start_test_run  # noqa: F401

from otel_train.export.otlp.encoding import RunConstantAttributes, _Encoder, encode_spans_fast


def _same(spans) -> None:
    ours = ExportTraceServiceRequest.FromString(encode_spans_fast(spans))
    sdk = encode_spans(spans)
    assert ours == sdk
    assert ours.SerializeToString(deterministic=True) == sdk.SerializeToString(
        deterministic=True)


def test_sdk_spans_of_every_shape_encode_exactly_as_the_sdk_encodes_them():
    _same(_sdk_spans())


def test_otel_train_step_spans_encode_exactly_as_the_sdk_encodes_them(tmp_path):
    with start_test_run(tmp_path) as run:
        run._telemetry.worker.paused = True
        run_shaped_steps(run, 3)
        records = list(run._recorder.queue)
        spans = [s for r in records for s in run._telemetry.builder.build(r)]
        run._telemetry.worker.paused = False
    assert len(spans) >= 10
    # The run constants head every span as one block the encoder caches.
    assert all(isinstance(s._attributes, RunConstantAttributes) for s in spans)
    _same(spans)
    _same(spans + _sdk_spans())  # several resources and scopes in one batch
    enc = _Encoder()
    enc.request(spans)  # the cached block is warm from here on
    assert ExportTraceServiceRequest.FromString(enc.request(spans)) == encode_spans(spans)


def test_a_run_constant_changed_on_a_finished_span_is_encoded_as_changed(tmp_path):
    from otel_train.common import attributes as A
    from otel_train.records.steps_view import set_span_attribute

    with start_test_run(tmp_path) as run:
        run._telemetry.worker.paused = True
        for step in run.steps(range(2)):
            with step.phase("forward"):
                pass
        spans = [s for r in list(run._recorder.queue) for s in run._telemetry.builder.build(r)]
        run._telemetry.worker.paused = False
    enc = _Encoder()
    enc.request(spans)  # warm: the constants' block is cached
    set_span_attribute(spans[0], A.RANK, 5)
    set_span_attribute(spans[1], A.SLOW, True)
    got = ExportTraceServiceRequest.FromString(enc.request(spans))
    assert got == encode_spans(spans)
    first = got.resource_spans[0].scope_spans[0].spans[0]
    assert {kv.key: kv.value.int_value for kv in first.attributes}[A.RANK] == 5


def test_the_attribute_cache_keeps_span_event_and_link_attributes_apart():
    spans = _sdk_spans()
    enc = _Encoder()
    first = ExportTraceServiceRequest.FromString(enc.request(spans))
    again = ExportTraceServiceRequest.FromString(enc.request(spans))  # all from the cache
    assert first == again == encode_spans(spans)


def _plain_spans():
    """ReadableSpans built directly with plain dicts, as otel-train's builder builds them, but
    with every field the fast path handles: trace state, remote parent, events, links,
    kinds, statuses, and heads of five attributes that differ only by type or by sign."""
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    resource = Resource.create({"service.name": "plain"})
    scope = InstrumentationScope("otel-train", "0.1")
    state = TraceState([("vendor", "v1")])
    remote = SpanContext(0x77, 0x88, is_remote=True, trace_flags=TraceFlags(1), trace_state=state)
    heads = [
        {"run": "r1", "rank": 0, "world": 1, "synced": True, "type": "cpu"},
        {"run": "r1", "rank": 0, "world": 1, "synced": 1, "type": "cpu"},  # 1 == True
        {"run": "r1", "rank": 0, "world": 1, "synced": 0.0, "type": "cpu"},  # floats: not cached
        {"run": "r1", "rank": 0, "world": 1, "synced": -0.0, "type": "cpu"},
        {"run": "r1", "rank": 0, "world": 1, "synced": ["a"], "type": "cpu"},  # unhashable
        {"run": "r1", "rank": 0},  # shorter than the head
    ]
    spans = []
    for i, head in enumerate(heads * 2):  # twice: the second round comes from the caches
        attrs = dict(head, **{"train.step": i, "loss": 0.5 * i, "phase": "forward"})
        ctx = SpanContext(0xABC + i // 3, 0x100 + i, False, TraceFlags(1),
                          state if i % 4 == 0 else None)
        kind = (SpanKind.INTERNAL, SpanKind.SERVER, SpanKind.CONSUMER)[i % 3]
        status = (Status(StatusCode.UNSET), Status(StatusCode.ERROR, "boom"),
                  Status(StatusCode.OK))[i % 3]
        events = (Event("exception", {"exception.type": "ValueError"}, timestamp=5 + i),) \
            if i % 2 else ()
        links = (Link(remote, {"link.attr": i}),) if i % 5 == 0 else ()
        spans.append(ReadableSpan(
            name=f"phase-{i % 4}", context=ctx, parent=remote if i % 3 == 0 else (
                None if i % 3 == 1 else SpanContext(0xABC, 0x999, False)),
            resource=resource, attributes=attrs, events=events, links=links, kind=kind,
            status=status, start_time=1_000 + i, end_time=2_000 + i,
            instrumentation_scope=scope))
    return spans


def test_plain_spans_take_the_fast_path_and_still_encode_exactly_as_the_sdk_does():
    spans = _plain_spans()
    _same(spans)
    enc = _Encoder()  # one encoder, caches warm from the first request, as an exporter's are
    assert ExportTraceServiceRequest.FromString(enc.request(spans)) == encode_spans(spans)
    assert ExportTraceServiceRequest.FromString(enc.request(spans[::-1])) == encode_spans(
        spans[::-1])


def test_a_cached_block_of_run_constant_attributes_never_stands_in_for_other_types_or_signs():
    enc = _Encoder()
    for head in ({"a": "x", "b": 1, "c": 2, "d": True, "e": "y", "f": 1},
                 {"a": "x", "b": 1, "c": 2, "d": 1, "e": "y", "f": 1},
                 {"a": "x", "b": True, "c": 2, "d": 1, "e": "y", "f": 1}):
        spans = [s for s in _plain_spans()[:1]]
        spans[0]._attributes = head
        ours = ExportTraceServiceRequest.FromString(enc.request(spans))
        assert ours == encode_spans(spans), head


def test_the_fast_encoder_is_several_times_cheaper_than_the_sdk_encoder(tmp_path):
    with start_test_run(tmp_path) as run:
        run._telemetry.worker.paused = True
        for step in run.steps(range(50)):
            with step.phase("forward"):
                pass
        spans = [s for r in list(run._recorder.queue) for s in run._telemetry.builder.build(r)]
        run._telemetry.worker.paused = False
    enc = _Encoder()
    enc.request(spans)  # warm the cache, as a running exporter is
    ours = sdk = 0
    for _ in range(5):  # interleaved, so a burst of machine noise hits both alike
        t0 = time.thread_time_ns()
        enc.request(spans)
        t1 = time.thread_time_ns()
        encode_spans(spans).SerializeToString()
        t2 = time.thread_time_ns()
        ours += t1 - t0
        sdk += t2 - t1
    # A loose bound (the benchmark prints the real ratio): it only fails if the fast path
    # stopped being fast at all.
    assert ours * 2 < sdk, (ours, sdk)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_exporters_send_our_encoding_not_the_sdks(protocol, monkeypatch, tmp_path):
    """With the SDK's encoder broken, export still works: the fast path is the one in use."""
    from otlp_receivers import GrpcOtlpReceiver, HttpOtlpReceiver

    from otel_train.export.otlp.encoding import make_grpc_exporter, make_http_exporter

    def broken(*args, **kwargs):
        raise AssertionError("the SDK's encoder was used")

    monkeypatch.setattr(
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter.encode_spans", broken)
    monkeypatch.setattr(
        "opentelemetry.exporter.otlp.proto.http.trace_exporter.encode_spans", broken)
    spans = _sdk_spans()
    receiver_cls = GrpcOtlpReceiver if protocol == "grpc" else HttpOtlpReceiver
    with receiver_cls() as receiver:
        if protocol == "grpc":
            exporter = make_grpc_exporter(endpoint=receiver.endpoint, insecure=True, timeout=5)
        else:
            exporter = make_http_exporter(endpoint=receiver.traces_endpoint, timeout=5)
        try:
            assert exporter.export(spans).name == "SUCCESS"
            got = receiver.wait_for_spans(len(spans), timeout_seconds=10)
        finally:
            exporter.shutdown()
    assert sorted(s.name for s in got) == sorted(s.name for s in spans)


def _odd_records(records):
    """The records' rarer shapes made by hand: device time on phases (events mode), a span
    id a user span asked for, an event and a failed status on a phase without attributes."""
    step = next(r for r in records if r[9] and not any(p[10] for p in r[9]))
    phases = [p[:11] + (0.0125,) for p in step[9]]
    timed = step[:9] + (phases, step[10])
    asked = step[:10] + ({0: 0xABCDEF},)
    p0 = step[9][0]
    failing = step[:9] + ([p0[:8] + ((2, "boom"), (("exception", p0[7], {"k": 1}),))
                           + p0[10:]] + list(step[9][1:]), step[10])
    # Roots with no attribute of the user's (the usual root, cached), and odd ones.
    i = step[6]["train.step"]
    roots = [{"train.step": i, "train.dataloader": "train", "train.slow": False},
             {"train.step": i, "train.dataloader": "train", "train.slow": True},
             {"train.step": i, "train.slow": False},
             {"train.step": i, "train.slow": True, "train.dataloader": "train"},  # reordered
             {"train.step": i, "train.dataloader": "train", "train.slow": 1}]  # not a bool
    # Spans over 4 KiB (a long phase name and loader): their length takes a longer varint.
    long = step[:9] + ([("f" * 5000,) + p[1:2] + ("L" * 3000,) + p[3:] for p in step[9]],
                       step[10])
    long_root = step[:6] + ({"train.step": i, "train.dataloader": "L" * 5000,
                             "train.slow": False},) + step[7:]
    return [timed, asked, failing, long, long_root] + [step[:6] + (attrs,) + step[7:]
                                                       for attrs in roots]


def _fields(spans: list[bytes]) -> list[bytes]:
    """Span messages as protobuf frames them in ScopeSpans.spans (tag, length, message)."""
    return [ScopeSpans(spans=[Span.FromString(s)]).SerializeToString() for s in spans]


def test_a_span_record_encodes_straight_to_the_bytes_its_rows_encode_to(tmp_path):
    import random

    from otel_train.records.span_rows import rows_from_record

    records, user_rows, factory = _records(tmp_path)
    records += _odd_records(records)
    shapes = {"between steps": 0, "phase attribute": 0, "plain": 0, "usual root": 0}
    enc, rec_enc = _Encoder(), _Encoder()
    consts, keys, block = enc._constants(factory.run_constants)
    for n, rec in enumerate(records):
        shapes["between steps" if rec[9] is None else "phase attribute"
               if any(p[10] for p in rec[9]) else "plain"] += 1
        shapes["usual root"] += tuple(rec[6]) in (
            ("train.step", "train.slow"), ("train.step", "train.dataloader", "train.slow"))
        random.seed(n)
        want = _fields([enc.row(r, consts, keys, block) for r in rows_from_record(rec)])
        random.seed(n)
        assert rec_enc.record(rec, factory.run_constants) == want, n
        random.seed(n)
        assert _Encoder().record(rec, factory.run_constants) == want, n  # cold caches too
    assert all(shapes.values()), shapes
    # A run constant named like a phase attribute: its rows' rules (the constant's value).
    named = dict(factory.run_constants, **{"train.phase": "constant"})
    random.seed(1)
    c2, k2, b2 = enc._constants(named)
    want = _fields([enc.row(r, c2, k2, b2) for r in rows_from_record(records[0])])
    random.seed(1)
    assert rec_enc.record(records[0], named) == want
    # And one named like a root attribute, on a usual root: the constant's value.
    usual = records[-5]
    for name in ("train.slow", "train.dataloader"):
        named = dict(factory.run_constants, **{name: "constant"})
        c2, k2, b2 = enc._constants(named)
        random.seed(2)
        want = _fields([enc.row(r, c2, k2, b2) for r in rows_from_record(usual)])
        random.seed(2)
        assert rec_enc.record(usual, named) == want, name
    # Encoded spans and user rows, mixed in one request: the rows' request, byte for byte.
    random.seed(5)
    rows = [row for rec in records for row in rows_from_record(rec)]
    random.seed(5)
    encoded = [span for rec in records for span in rec_enc.record(rec, factory.run_constants)]
    args = (factory.resource, factory.scope, factory.run_constants)
    assert (_Encoder().request_rows(encoded + user_rows, *args)
            == _Encoder().request_rows(rows + user_rows, *args))
    assert ExportTraceServiceRequest.FromString(
        _Encoder().request_rows(encoded, *args)) == encode_spans(factory.spans(rows))


def test_a_batch_of_encoded_spans_is_one_request_with_its_schema_urls_as_the_sdk_sends(
        tmp_path):
    import random

    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from otel_train.records.span_rows import RowSpanFactory, rows_from_record

    records, _, factory = _records(tmp_path)
    # The request's lengths are summed from its parts (one copy of the batch): the schema
    # URLs of the resource and the scope are inside those lengths, a long one (two-byte
    # lengths) too.
    for r_schema, s_schema in (("", ""), ("https://r/1", "https://s/" + "x" * 300)):
        schemed = RowSpanFactory(Resource(dict(factory.resource.attributes), r_schema),
                                 InstrumentationScope("otel_train", "1.0", s_schema),
                                 factory.run_constants)
        random.seed(7)
        rows = [row for rec in records * 40 for row in rows_from_record(rec)]
        random.seed(7)
        enc = _Encoder()
        encoded = [s for rec in records * 40 for s in enc.record(rec, factory.run_constants)]
        args = (schemed.resource, schemed.scope, schemed.run_constants)
        body = _Encoder().request_rows(encoded, *args)
        assert body == _Encoder().request(schemed.spans(rows))
        assert ExportTraceServiceRequest.FromString(body) == encode_spans(schemed.spans(rows))


def test_span_rows_encode_to_exactly_the_bytes_of_the_spans_made_from_them(tmp_path):
    from otel_train.common import attributes as A

    rows, user_rows, factory = _records_and_rows(tmp_path)
    # A row naming a run constant: the factory keeps the constant's place and block.
    odd = rows[0][:8] + (dict(rows[0][8], **{A.RANK: 9}),) + rows[0][9:]
    every = rows + user_rows + [odd]
    assert any(r[9] for r in rows) and any(r[10] for r in rows)  # a status and an event
    assert any(r[13] for r in user_rows) and any(r[12] for r in user_rows)  # links, scopes
    for batch in (rows, every, user_rows, every[:1]):
        enc = _Encoder()
        want = enc.request(factory.spans(batch))
        cold = _Encoder().request_rows(batch, factory.resource, factory.scope, factory.run_constants)
        assert cold == want
        assert enc.request_rows(batch, factory.resource, factory.scope, factory.run_constants) == want
        assert ExportTraceServiceRequest.FromString(cold) == encode_spans(factory.spans(batch))


def test_an_exporter_given_rows_sends_the_bytes_of_their_spans(tmp_path):
    from otel_train.export.otlp.transport import SingleAttemptHttpSpanExporter

    rows, user_rows, factory = _records_and_rows(tmp_path)
    exporter = SingleAttemptHttpSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")
    spans = factory.spans(rows + user_rows)
    assert exporter.as_spans(spans) is spans  # spans stay spans
    want = exporter.encode(spans)
    exporter.use_rows(factory.resource, factory.scope, factory.run_constants)
    assert exporter.encode(rows + user_rows) == want
    again = exporter.as_spans(rows + user_rows)  # for the SDK's own path (old SDKs)
    assert _Encoder().request(again) == want
    exporter.shutdown()
