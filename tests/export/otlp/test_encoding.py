"""The OTLP encoder writes, from span records and rows, exactly the message the SDK's encoder
builds for the SDK spans ``RowSpanFactory`` makes of the same rows."""

from __future__ import annotations

import time

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans, Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from span_samples import _records, _records_and_rows
from train_helpers import clean_env  # noqa: F401

from otel_train.export.otlp.encoding import _Encoder
from otel_train.export.otlp.span_fields import encode_frame
from otel_train.records.span_rows import RowSpanFactory


def _same(body: bytes, spans) -> None:
    """``body`` is exactly the request the SDK's encoder builds for ``spans``."""
    ours = ExportTraceServiceRequest.FromString(body)
    sdk = encode_spans(spans)
    assert ours == sdk
    assert ours.SerializeToString(deterministic=True) == sdk.SerializeToString(
        deterministic=True)


def _request(rows, factory, enc=None) -> bytes:
    enc = enc or _Encoder()
    return enc.request_rows(rows, factory.resource, factory.scope, factory.run_constants)


def test_span_rows_of_every_shape_encode_exactly_as_the_sdk_encodes_their_spans(tmp_path):
    from otel_train.common import attributes as A

    rows, user_rows, factory = _records_and_rows(tmp_path)
    # A row naming a run constant: the constant's place, the row's value.
    odd = rows[0][:8] + (dict(rows[0][8], **{A.RANK: 9}),) + rows[0][9:]
    every = rows + user_rows + [odd]
    assert any(r[9] for r in rows) and any(r[10] for r in rows)  # a status and an event
    assert any(r[13] for r in user_rows) and any(r[12] for r in user_rows)  # links, scopes
    enc = _Encoder()  # one encoder, its caches warm after the first batch, as an exporter's
    for batch in (rows, every, user_rows, every[:1], every[::-1]):
        _same(_request(batch, factory), factory.spans(batch))
        _same(_request(batch, factory, enc), factory.spans(batch))


def _plain_rows():
    """Rows with every field a row holds (remote parents, events, links, kinds, statuses)
    under run constants that differ only by type or by sign, and a factory for each."""
    resource = Resource.create({"service.name": "plain"})
    scope = InstrumentationScope("otel-train", "0.1")
    heads = [
        {"run": "r1", "rank": 0, "world": 1, "synced": True, "type": "cpu"},
        {"run": "r1", "rank": 0, "world": 1, "synced": 1, "type": "cpu"},  # 1 == True
        {"run": "r1", "rank": 0, "world": 1, "synced": 0.0, "type": "cpu"},  # floats: not cached
        {"run": "r1", "rank": 0, "world": 1, "synced": -0.0, "type": "cpu"},
        {"run": "r1", "rank": 0, "world": 1, "synced": ["a"], "type": "cpu"},  # unhashable
        {"run": "r1", "rank": 0},
    ]
    out = []
    for i, head in enumerate(heads * 2):  # twice: the second round comes from the caches
        attrs = {"train.step": i, "loss": 0.5 * i, "phase": "forward"}
        status = (None, (2, "boom"), (1, None), (7, "unknown code"))[i % 4]
        events = (("exception", 5 + i, {"exception.type": "ValueError"}),) if i % 2 else ()
        links = ((0x77, 0x88, 1, {"link.attr": i}),) if i % 5 == 0 else ()
        parent, remote = ((0x88, True), (0, False), (0x999, False))[i % 3]
        row = (f"phase-{i % 4}", 0xABC + i // 3, 0x100 + i, 1, parent, remote, 1_000 + i,
               2_000 + i, attrs, status, events, i % 6, None, links)
        out.append((row, RowSpanFactory(resource, scope, head)))
    return out


def test_the_caches_never_let_one_value_stand_in_for_another_of_another_type_or_sign():
    enc = _Encoder()
    for row, factory in _plain_rows():
        _same(_request([row], factory, enc), factory.spans([row]))


def test_the_fast_encoder_is_several_times_cheaper_than_the_sdk_encoder(tmp_path):
    records, _, factory = _records(tmp_path)
    rows, _, _ = _records_and_rows(tmp_path / "again")
    enc = _Encoder()
    encoded = [f for rec in records for f in enc.record(rec, factory.run_constants)]
    spans = factory.spans(rows)
    ours = sdk = 0
    for _ in range(5):  # interleaved, so a burst of machine noise hits both alike
        t0 = time.thread_time_ns()
        for rec in records:
            enc.record(rec, factory.run_constants)
        enc.request(encoded, factory.resource, factory.scope)
        t1 = time.thread_time_ns()
        encode_spans(spans).SerializeToString()
        t2 = time.thread_time_ns()
        ours += t1 - t0
        sdk += t2 - t1
    # A loose bound (the benchmark prints the real ratio): it only fails if the fast path
    # stopped being fast at all.
    assert ours * 2 < sdk, (ours, sdk)


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
             {"train.step": i, "train.dataloader": "train", "train.slow": 1},  # not a bool
             # What a step adds after them (its bound, tokens, samples; a float too)
             {"train.step": i, "train.dataloader": "train", "train.slow": False,
              "train.step.bound": "compute", "train.tokens": 256, "train.samples": 32},
             {"train.step": i, "train.slow": True, "train.step.bound": "input",
              "train.mfu": 0.41}]
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
        shapes["usual root"] += tuple(rec[6])[:3] in (
            ("train.step", "train.slow", "train.step.bound"),
            ("train.step", "train.dataloader", "train.slow"))
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
    usual = records[-7]
    for name in ("train.slow", "train.dataloader"):
        named = dict(factory.run_constants, **{name: "constant"})
        c2, k2, b2 = enc._constants(named)
        random.seed(2)
        want = _fields([enc.row(r, c2, k2, b2) for r in rows_from_record(usual)])
        random.seed(2)
        assert rec_enc.record(usual, named) == want, name
    # A root with the step's own attributes after the usual ones is joined from cached parts,
    # not encoded as a row (unless a run constant shares one of their names).
    added = records[-2]
    assert tuple(added[6])[3:] == ("train.step.bound", "train.tokens", "train.samples")
    rows_encoded = []
    fast = _Encoder()
    fast.row = lambda *a: rows_encoded.append(a) or _Encoder.row(fast, *a)  # type: ignore
    random.seed(3)
    want = _fields([enc.row(r, consts, keys, block) for r in rows_from_record(added)])
    random.seed(3)
    assert fast.record(added, factory.run_constants) == want and rows_encoded == []
    named = dict(factory.run_constants, **{"train.tokens": 1})
    c2, k2, b2 = enc._constants(named)
    random.seed(4)
    want = _fields([enc.row(r, c2, k2, b2) for r in rows_from_record(added)])
    random.seed(4)
    assert fast.record(added, named) == want and len(rows_encoded) == 1
    # Encoded spans and user rows, mixed in one request: the rows' request, byte for byte.
    random.seed(5)
    rows = [row for rec in records for row in rows_from_record(rec)]
    random.seed(5)
    encoded = [span for rec in records for span in rec_enc.record(rec, factory.run_constants)]
    args = (factory.resource, factory.scope, factory.run_constants)
    user = [_Encoder().row_field(row, factory.run_constants) for row in user_rows]
    assert (_Encoder().request(encoded + user, factory.resource, factory.scope)
            == _Encoder().request_rows(rows + user_rows, *args))
    assert ExportTraceServiceRequest.FromString(_Encoder().request(
        encoded, factory.resource, factory.scope)) == encode_spans(factory.spans(rows))


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
        body = _Encoder().request(encoded, schemed.resource, schemed.scope)
        assert body == _Encoder().request_rows(rows, schemed.resource, schemed.scope,
                                               schemed.run_constants)
        _same(body, schemed.spans(rows))


def test_an_exporter_queues_encoded_spans_and_sends_the_bytes_of_their_spans(tmp_path):
    from otel_train.export.otlp.transport import SingleAttemptHttpSpanExporter

    records, user_rows, factory = _records(tmp_path)
    exporter = SingleAttemptHttpSpanExporter(endpoint="http://127.0.0.1:9/v1/traces")
    items = exporter.span_items(factory)
    import random

    random.seed(3)
    queued = [i for rec in records for i in items.from_record(rec)]
    queued += [items.from_row(row) for row in user_rows]
    random.seed(3)
    from otel_train.records.span_rows import rows_from_record

    rows = [row for rec in records for row in rows_from_record(rec)] + user_rows
    _same(exporter.encode(queued), factory.spans(rows))
    exporter.shutdown()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_exporters_send_our_encoding_not_the_sdks(protocol, monkeypatch, tmp_path):
    """With the SDK's encoder broken, export still works: ours is the one in use."""
    from otlp_receivers import GrpcOtlpReceiver, HttpOtlpReceiver

    from otel_train.common.drop_counter import DropCounter
    from otel_train.common.sdk_config import ExportPlan
    from otel_train.export.exporters import create_exporter
    from otel_train.export.stage import BoundedBatchSpanProcessor

    def broken(*args, **kwargs):
        raise AssertionError("the SDK's encoder was used")

    monkeypatch.setattr(
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter.encode_spans", broken)
    monkeypatch.setattr(
        "opentelemetry.exporter.otlp.proto.http.trace_exporter.encode_spans", broken)
    records, user_rows, factory = _records(tmp_path)
    receiver_cls = GrpcOtlpReceiver if protocol == "grpc" else HttpOtlpReceiver
    with receiver_cls() as receiver:
        drops = DropCounter()
        stage = BoundedBatchSpanProcessor(create_exporter(
            ExportPlan("otlp", protocol, receiver.endpoint), env={}), drops,
            interval_seconds=0.05)
        stage.use_rows(factory)
        stage.on_records(records, user_rows)
        assert stage.force_flush(10_000)
        stage.shutdown(5)
        got = receiver.wait_for_spans(stage.exported, timeout_seconds=10)
    assert drops.counts() == {} and len(got) == stage.exported > len(records)


def test_phases_whose_own_attributes_are_only_their_device_timing_stay_on_the_fast_path(
        tmp_path):
    import random

    from otel_train.records.span_rows import rows_from_record

    records, _, factory = _records(tmp_path)
    step = next(r for r in records if r[9] and not any(p[10] for p in r[9]))
    host = {"train.device.synced": False, "train.device.timing": "host"}
    sync = {"train.device.synced": True, "train.device.timing": "sync"}
    timed = step[:9] + ([p[:10] + (host if n % 2 else sync,) + p[11:]
                         for n, p in enumerate(step[9])], step[10])
    with_device = step[:9] + ([p[:10] + ({"train.device.synced": False,
                                          "train.device.timing": "events"}, 0.0125)
                               for p in step[9]], step[10])
    # A run whose spans each say their own timing has no such run constants.
    constants = {k: v for k, v in factory.run_constants.items()
                 if k not in ("train.device.synced", "train.device.timing")}
    enc = _Encoder()
    consts, keys, block = enc._constants(constants)
    for n, rec in enumerate((timed, with_device)):
        rows_encoded = []
        fast = _Encoder()
        fast.row = lambda *a: rows_encoded.append(a) or _Encoder.row(fast, *a)  # type: ignore
        random.seed(n)
        want = _fields([enc.row(r, consts, keys, block) for r in rows_from_record(rec)])
        random.seed(n)
        got = fast.record(rec, constants)
        assert got == want, n
        assert len(rows_encoded) <= 1  # the root at most: no phase went through its row
    # With the timing among the run constants, the rows' rules (no duplicate attribute).
    random.seed(7)
    c2, k2, b2 = enc._constants(factory.run_constants)
    want = _fields([enc.row(r, c2, k2, b2) for r in rows_from_record(timed)])
    random.seed(7)
    assert _Encoder().record(timed, factory.run_constants) == want


def test_records_encoded_together_are_the_bytes_of_each_encoded_alone_with_the_same_ids(
        tmp_path):
    """encode_frame (the export stage's frames) draws each run's phase ids at once: the
    same ids as a draw a record, whatever the records between (operations with no phases,
    records with ids handed to user spans, one that cannot be encoded, which is handed over
    while the others go on)."""
    import random

    records, _, factory = _records(tmp_path)
    records += _odd_records(records)
    step = next(r for r in records if r[9])
    own_ids = step[:10] + ({0: 99, 1: 98},)
    broken = step[:9] + ([("forward",)],) + step[10:]  # a phase the encoders cannot read
    mixed = records[:3] + [own_ids] + records[3:] + [broken] + records[:2]
    constants = factory.run_constants
    random.seed(4)
    alone = []
    for rec in mixed:
        try:
            alone += _Encoder().record(rec, constants)
        except Exception:
            pass
    after = random.getrandbits(64)
    random.seed(4)
    failed = []
    together = encode_frame(_Encoder(), mixed, constants,
                            lambda rec, exc: failed.append(rec))
    assert together == alone and failed == [broken]
    assert random.getrandbits(64) == after
    assert any(r[9] is None for r in mixed) and any(r[10] for r in mixed)
