"""The test OTLP receivers, driven by the real OTel SDK and the real OTLP gRPC/HTTP exporters."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, Status, StatusCode
from otlp_receivers import GrpcOtlpReceiver, HttpOtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.timeout(30)

RESOURCE = Resource.create({"service.name": "receiver-test", "train.run.id": "run-42"})


def _grpc_exporter(receiver: GrpcOtlpReceiver, **kwargs: object) -> GrpcSpanExporter:
    """Real gRPC exporter pointed at the receiver."""
    return GrpcSpanExporter(endpoint=receiver.endpoint, insecure=True, **kwargs)


def _http_exporter(receiver: HttpOtlpReceiver, **kwargs: object) -> HttpSpanExporter:
    """Real HTTP/protobuf exporter pointed at the receiver's /v1/traces."""
    return HttpSpanExporter(endpoint=receiver.traces_endpoint, **kwargs)


def _emit_sample_trace(provider: TracerProvider) -> dict[str, int]:
    """Emit a root with two children, attributes of every type, events, statuses and a link."""
    tracer = provider.get_tracer("otel_train.tests", "9.9.9")
    with tracer.start_as_current_span("train.step") as root:
        root.set_attributes(
            {
                "train.step": 7,
                "train.slow": True,
                "train.loss": 1.25,
                "train.phase.kind": "train",
                "tags": ["a", "b"],
                "ints": [1, 2, 3],
            }
        )
        root.set_status(Status(StatusCode.OK))
        with tracer.start_as_current_span("forward") as forward:
            forward.set_attribute("train.phase", "forward")
            forward.add_event("checkpoint", {"bytes": 1024, "path": "/tmp/x"})
            forward.add_event("plain")
        with tracer.start_as_current_span(
            "val_loss", links=[Link(root.get_span_context(), {"why": "test"})]
        ) as val:
            val.set_attribute("train.phase.kind", "monitor")
            val.set_status(Status(StatusCode.ERROR, "nan loss"))
        ctx = root.get_span_context()
    return {"trace_id": ctx.trace_id, "span_id": ctx.span_id}


def _check_sample_trace(spans: Sequence[ReceivedSpan], ids: dict[str, int]) -> None:
    """Everything _emit_sample_trace put in comes back decoded faithfully."""
    by_name = {span.name: span for span in spans}
    assert set(by_name) == {"train.step", "forward", "val_loss"}
    root, forward, val = by_name["train.step"], by_name["forward"], by_name["val_loss"]

    trace_hex = format(ids["trace_id"], "032x")
    assert {s.trace_id for s in spans} == {trace_hex}
    assert root.span_id == format(ids["span_id"], "016x")
    assert len(root.span_id) == 16 and len(root.trace_id) == 32
    assert root.parent_span_id is None and root.is_root
    assert forward.parent_span_id == root.span_id
    assert val.parent_span_id == root.span_id

    assert root.attributes == {
        "train.step": 7,
        "train.slow": True,
        "train.loss": 1.25,
        "train.phase.kind": "train",
        "tags": ["a", "b"],
        "ints": [1, 2, 3],
    }
    assert isinstance(root.attributes["train.step"], int)
    assert isinstance(root.attributes["train.slow"], bool)
    assert root.status_code == 1 and root.status_message == ""
    assert val.status_code == 2 and val.status_message == "nan loss"
    assert forward.status_code == 0

    assert forward.events == [("checkpoint", {"bytes": 1024, "path": "/tmp/x"}), ("plain", {})]
    assert val.links == [(trace_hex, root.span_id, {"why": "test"})]

    for span in spans:
        assert span.resource_attributes["service.name"] == "receiver-test"
        assert span.resource_attributes["train.run.id"] == "run-42"
        assert span.scope_name == "otel_train.tests"
        assert span.scope_version == "9.9.9"
        assert span.kind == 1  # SPAN_KIND_INTERNAL
        assert 0 < span.start_time_unix_nano <= span.end_time_unix_nano
        assert span.duration_seconds >= 0
    # Children lie within the root.
    assert root.start_time_unix_nano <= forward.start_time_unix_nano
    assert forward.end_time_unix_nano <= root.end_time_unix_nano


def _collect_readable_spans(n: int = 2) -> list[ReadableSpan]:
    """Finished SDK spans to feed an exporter directly."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    for i in range(n):
        with tracer.start_as_current_span(f"s{i}"):
            pass
    provider.shutdown()
    return list(memory.get_finished_spans())


@pytest.fixture(params=["grpc", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    """Run a test against both receivers."""
    return request.param


def _receiver_and_exporter(
    transport: str, mode: str = "ok", hang_seconds: float = 5.0
) -> tuple[GrpcOtlpReceiver | HttpOtlpReceiver, Callable[..., SpanExporter]]:
    """A receiver for the transport and a factory of matching exporters."""
    if transport == "grpc":
        grpc_receiver = GrpcOtlpReceiver(mode=mode, hang_seconds=hang_seconds)
        return grpc_receiver, lambda **kw: _grpc_exporter(grpc_receiver, **kw)
    http_receiver = HttpOtlpReceiver(mode=mode, hang_seconds=hang_seconds)
    return http_receiver, lambda **kw: _http_exporter(http_receiver, **kw)


@pytest.fixture
def receiver_pair(
    transport: str,
) -> Iterator[tuple[GrpcOtlpReceiver | HttpOtlpReceiver, Callable[..., SpanExporter]]]:
    """A started receiver plus an exporter factory, closed afterwards."""
    receiver, make_exporter = _receiver_and_exporter(transport)
    with receiver:
        yield receiver, make_exporter


def test_endpoints_are_loopback_with_a_real_port() -> None:
    with GrpcOtlpReceiver() as grpc_receiver, HttpOtlpReceiver() as http_receiver:
        for receiver in (grpc_receiver, http_receiver):
            assert receiver.endpoint == f"http://127.0.0.1:{receiver.port}"
            assert receiver.port > 0
        assert http_receiver.traces_endpoint == http_receiver.endpoint + "/v1/traces"
        assert grpc_receiver.port != http_receiver.port


def test_simple_processor_spans_decode_faithfully(receiver_pair) -> None:
    receiver, make_exporter = receiver_pair
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(make_exporter(timeout=5)))
    ids = _emit_sample_trace(provider)
    spans = receiver.wait_for_spans(3, timeout_seconds=5)
    provider.shutdown()
    _check_sample_trace(spans, ids)
    assert receiver.requests_count == 3  # SimpleSpanProcessor exports one span per request


def test_batch_processor_spans_decode_faithfully(receiver_pair) -> None:
    receiver, make_exporter = receiver_pair
    provider = TracerProvider(resource=RESOURCE)
    # A long delay: only force_flush exports, so all three spans travel in one request.
    processor = BatchSpanProcessor(make_exporter(timeout=5), schedule_delay_millis=30_000)
    provider.add_span_processor(processor)
    ids = _emit_sample_trace(provider)
    assert provider.force_flush(timeout_millis=5000)
    spans = receiver.wait_for_spans(lambda got: {s.name for s in got} >= {"val_loss"}, 5)
    provider.shutdown()
    _check_sample_trace(spans, ids)
    assert receiver.requests_count == 1
    assert len(receiver.requests()) == 1


def test_gzip_compression_is_decoded(transport: str) -> None:
    receiver, make_exporter = _receiver_and_exporter(transport)
    if transport == "grpc":
        from grpc import Compression as GrpcCompression

        compression: object = GrpcCompression.Gzip
    else:
        compression = HttpCompression.Gzip
    with receiver:
        exporter = make_exporter(timeout=5, compression=compression)
        assert exporter.export(_collect_readable_spans(3)) is SpanExportResult.SUCCESS
        exporter.shutdown()
        assert [s.name for s in receiver.spans()] == ["s0", "s1", "s2"]
        if transport == "http":
            assert receiver.request_headers()[0]["content-encoding"] == "gzip"


def test_headers_reach_the_receiver(receiver_pair) -> None:
    receiver, make_exporter = receiver_pair
    exporter = make_exporter(timeout=5, headers={"x-tenant": "team-a"})
    assert exporter.export(_collect_readable_spans(1)) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert receiver.request_headers()[0]["x-tenant"] == "team-a"


def test_unavailable_mode_makes_export_fail(transport: str) -> None:
    receiver, make_exporter = _receiver_and_exporter(transport, mode="unavailable")
    with receiver:
        exporter = make_exporter(timeout=1)
        started = time.monotonic()
        result = exporter.export(_collect_readable_spans(1))
        elapsed = time.monotonic() - started
        exporter.shutdown()
        assert result is SpanExportResult.FAILURE
        assert receiver.requests_count >= 1  # it did reach us, and was refused
        assert receiver.spans() == [] and receiver.requests() == []
        assert elapsed < 5  # the exporter's own timeout bounds retries; generous margin


def test_hang_mode_makes_export_time_out_and_close_stays_fast(transport: str) -> None:
    receiver, make_exporter = _receiver_and_exporter(transport, mode="hang", hang_seconds=10)
    receiver.start()
    try:
        exporter = make_exporter(timeout=1)
        result = exporter.export(_collect_readable_spans(1))
        exporter.shutdown()
        assert result is SpanExportResult.FAILURE
        assert receiver.requests_count >= 1
    finally:
        started = time.monotonic()
        receiver.close()
        assert time.monotonic() - started < 4  # the 10 s hang was interrupted by close()


def test_recovery_after_outage_and_clear(receiver_pair) -> None:
    receiver, make_exporter = receiver_pair
    receiver.mode = "unavailable"
    exporter = make_exporter(timeout=1)
    assert exporter.export(_collect_readable_spans(1)) is SpanExportResult.FAILURE
    receiver.mode = "ok"
    assert exporter.export(_collect_readable_spans(2)) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert [s.name for s in receiver.spans()] == ["s0", "s1"]
    assert receiver.spans(name="s1")[0].name == "s1"
    receiver.clear()
    assert receiver.spans() == [] and receiver.requests_count == 0


def test_wait_for_spans_times_out_with_a_useful_message() -> None:
    with HttpOtlpReceiver() as receiver:
        started = time.monotonic()
        with pytest.raises(TimeoutError, match="got 0 span"):
            receiver.wait_for_spans(1, timeout_seconds=0.2)
        assert time.monotonic() - started < 2


def test_invalid_options_are_rejected() -> None:
    with pytest.raises(ValueError):
        GrpcOtlpReceiver(mode="flaky")
    with pytest.raises(ValueError):
        HttpOtlpReceiver(hang_seconds=-1)
    receiver = HttpOtlpReceiver()
    with pytest.raises(RuntimeError):
        _ = receiver.endpoint  # not started yet
    with pytest.raises(ValueError):
        receiver.mode = "broken"


def _raw_export(receiver: GrpcOtlpReceiver | HttpOtlpReceiver, timeout: float = 2.0) -> object:
    """One export request with no client retries: the gRPC status code, or the HTTP status."""
    import grpc
    import requests

    body = b""  # an empty ExportTraceServiceRequest
    if isinstance(receiver, GrpcOtlpReceiver):
        with grpc.insecure_channel(f"127.0.0.1:{receiver.port}") as channel:
            call = channel.unary_unary(
                "/opentelemetry.proto.collector.trace.v1.TraceService/Export")
            try:
                call(body, timeout=timeout)
                return grpc.StatusCode.OK
            except grpc.RpcError as exc:
                return exc.code()
    try:
        return requests.post(receiver.traces_endpoint, data=body, timeout=timeout,
                             headers={"Content-Type": "application/x-protobuf"}).status_code
    except requests.ConnectionError:
        return "refused"


def test_down_and_up_again_on_the_same_port(transport: str) -> None:
    import grpc

    receiver, _ = _receiver_and_exporter(transport)
    with receiver:
        port = receiver.port
        receiver.down()
        assert not receiver.is_up
        assert _raw_export(receiver) in (grpc.StatusCode.UNAVAILABLE, "refused")
        receiver.up()
        assert receiver.is_up and receiver.port == port
        assert _raw_export(receiver) in (grpc.StatusCode.OK, 200)


def test_a_kept_alive_http_connection_is_closed_when_the_receiver_goes_down() -> None:
    receiver = HttpOtlpReceiver()
    with receiver:
        exporter = _http_exporter(receiver, timeout=1)
        assert exporter.export(_collect_readable_spans(1)) is SpanExportResult.SUCCESS
        receiver.down()  # the exporter's pooled connection must not reach a receiver that's down
        assert exporter.export(_collect_readable_spans(1)) is SpanExportResult.FAILURE
        receiver.up()
        assert exporter.export(_collect_readable_spans(2)) is SpanExportResult.SUCCESS
        exporter.shutdown()
        assert len(receiver.spans()) == 3


@pytest.mark.parametrize("transport,code,expected", [
    ("http", 401, 401), ("http", 500, 500),
    ("grpc", "RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED"), ("grpc", "UNAVAILABLE", "UNAVAILABLE"),
])
def test_reject_mode_answers_the_configured_status(transport: str, code: object,
                                                   expected: object) -> None:
    receiver, _ = _receiver_and_exporter(transport, mode="reject")
    receiver.reject_code = code
    with receiver:
        got = _raw_export(receiver)
        assert getattr(got, "name", got) == expected
        assert receiver.requests_count == 1 and receiver.spans() == []


def test_a_hanging_receiver_keeps_nothing_a_client_gave_up_on(transport: str) -> None:
    receiver, make_exporter = _receiver_and_exporter(transport, mode="hang", hang_seconds=1.0)
    with receiver:
        exporter = make_exporter(timeout=0.3)
        assert exporter.export(_collect_readable_spans(1)) is SpanExportResult.FAILURE
        exporter.shutdown()  # the client is gone before the hang ends
        time.sleep(1.3)
        assert receiver.spans() == []


def test_flapping_takes_the_receiver_down_and_up_and_records_when_it_was_up() -> None:
    from otlp_receivers import Flapping

    with GrpcOtlpReceiver() as receiver:
        t0 = time.monotonic()
        with Flapping(receiver, down_seconds=0.3, up_seconds=0.3) as flapping:
            time.sleep(1.4)
        assert receiver.is_up  # left up
        assert flapping.outages >= 2
        windows = flapping.up_intervals()
        assert t0 <= windows[0][0] < windows[0][1]  # up when the schedule began, then down
        assert all(a < b for a, b in windows)
        assert not flapping.was_up_at(windows[0][1] + 0.01)  # down just after a window
    with pytest.raises(ValueError):
        Flapping(receiver, down_seconds=0, up_seconds=1)
