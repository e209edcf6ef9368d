"""http_sender.py: the lean HTTP/1.1 POST where it stands in exactly for requests, and
sender threads that are reused but never make one request wait for another."""

from __future__ import annotations

import threading
import time

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from otlp_receivers import HttpOtlpReceiver

from otel_train.export.otlp.http_sender import (
    LEAN_TRANSPORT_ENV,
    ReusedSenderThreads,
    lean_transport_reason,
)
from otel_train.export.otlp.transport import ExportOutcome, SingleAttemptHttpSpanExporter
from otel_train.records.span_rows import RowSpanFactory, row_from_span


def _spans(n: int) -> list:
    """``n`` finished SDK spans."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    for i in range(n):
        with tracer.start_as_current_span(f"s{i}", attributes={"i": i}):
            pass
    return list(memory.get_finished_spans())


def _queued(exporter: SingleAttemptHttpSpanExporter, n: int) -> list:
    """``n`` user spans as the export stage queues them for ``exporter``."""
    spans = _spans(n)
    items = exporter.span_items(RowSpanFactory(spans[0].resource,
                                               spans[0].instrumentation_scope, {}))
    return [items.from_row(row_from_span(span)) for span in spans]


def _send(exporter: SingleAttemptHttpSpanExporter, n: int = 3,
          timeout_seconds: float = 5.0) -> tuple[ExportOutcome | None, object]:
    batch = _queued(exporter, n)
    pending = exporter.start_send(batch, exporter.encode(batch), timeout_seconds)
    return pending.wait(timeout_seconds + 2.0), pending


@pytest.fixture(params=["lean", "requests"])
def transport(request, monkeypatch):
    """Each behaviour holds through either transport (requests: the lean one switched off)."""
    if request.param == "requests":
        monkeypatch.setenv(LEAN_TRANSPORT_ENV, "0")
    else:
        monkeypatch.delenv(LEAN_TRANSPORT_ENV, raising=False)
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    return request.param


def _exporter(receiver: HttpOtlpReceiver, transport: str,
              **kwargs: object) -> SingleAttemptHttpSpanExporter:
    exporter = SingleAttemptHttpSpanExporter(endpoint=receiver.traces_endpoint, **kwargs)
    assert exporter.lean_transport is (transport == "lean")
    if transport == "lean":
        assert type(exporter._client._transport).__name__ == "LeanHttpTransport"
    return exporter


# -- which transport -------------------------------------------------------------------------
def test_the_lean_transport_is_taken_only_where_requests_would_add_nothing():
    url = "http://collector:4318/v1/traces"
    assert lean_transport_reason(url, {}, environ={}) is None
    assert "plain http" in lean_transport_reason("https://collector:4318/v1/traces", {}, {})
    assert "credentials" in lean_transport_reason("http://u:p@collector:4318/v1/traces", {}, {})
    assert "session" in lean_transport_reason(url, {"session": object()}, {})
    assert "credential provider" in lean_transport_reason(
        url, {}, {"OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER": "my_pkg:provider"})
    assert "proxy" in lean_transport_reason(url, {}, {"HTTPS_PROXY": "", "http_proxy": "p:3128"})
    assert "off" in lean_transport_reason(url, {}, {LEAN_TRANSPORT_ENV: "false"})


def test_the_exporter_keeps_requests_for_https_and_proxies(monkeypatch):
    monkeypatch.delenv(LEAN_TRANSPORT_ENV, raising=False)
    tls = SingleAttemptHttpSpanExporter(endpoint="https://127.0.0.1:1/v1/traces")
    assert not tls.lean_transport
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:3128")
    proxied = SingleAttemptHttpSpanExporter(endpoint="http://127.0.0.1:1/v1/traces")
    assert not proxied.lean_transport
    assert type(proxied._client._transport).__name__ == "RequestsHTTPTransport"
    tls.shutdown()
    proxied.shutdown()


# -- the same outcomes through either transport ------------------------------------------------
def test_spans_headers_and_compression_arrive(transport):
    with HttpOtlpReceiver() as receiver:
        exporter = _exporter(receiver, transport, headers={"x-tenant": "t1"},
                             compression=Compression.Gzip)
        outcome, _ = _send(exporter, 4)
        assert outcome is ExportOutcome.SENT
        assert sorted(s.name for s in receiver.wait_for_spans(4, 5)) == ["s0", "s1", "s2", "s3"]
        headers = receiver.request_headers()[0]
        # The receiver undid the gzip body: the spans above decoded.
        assert headers["x-tenant"] == "t1" and headers["content-encoding"] == "gzip"
        exporter.shutdown()


@pytest.mark.parametrize(("code", "expected"), [
    (503, ExportOutcome.RETRY), (429, ExportOutcome.RETRY), (401, ExportOutcome.REJECTED),
    (413, ExportOutcome.TOO_LARGE)])
def test_a_collector_answer_maps_to_the_same_outcome(transport, code, expected):
    with HttpOtlpReceiver(mode="reject", reject_code=code) as receiver:
        exporter = _exporter(receiver, transport)
        outcome, pending = _send(exporter)
        assert outcome is expected
        assert f"HTTP {code}" in pending.detail
        exporter.shutdown()


def test_an_answer_that_never_comes_is_unknown_never_sent_again(transport):
    with HttpOtlpReceiver(mode="hang", hang_seconds=10) as receiver:
        exporter = _exporter(receiver, transport)
        t0 = time.monotonic()
        outcome, _ = _send(exporter, timeout_seconds=0.3)
        assert outcome is ExportOutcome.UNKNOWN  # it may have arrived
        assert time.monotonic() - t0 < 3.0
        assert receiver.wait_for_requests(1) == 1
        time.sleep(0.3)
        assert receiver.wait_for_requests(1) == 1  # no immediate second attempt
        exporter.shutdown()


def test_a_collector_that_is_not_there_is_retried_and_reported_unreachable(transport):
    with HttpOtlpReceiver() as receiver:
        endpoint = receiver.traces_endpoint
    exporter = SingleAttemptHttpSpanExporter(endpoint=endpoint)
    outcome, pending = _send(exporter, timeout_seconds=2.0)
    assert outcome is ExportOutcome.RETRY and pending.unreachable
    exporter.shutdown()


def test_a_collector_that_comes_back_on_its_port_gets_the_next_request(transport):
    with HttpOtlpReceiver() as receiver:
        exporter = _exporter(receiver, transport)
        assert _send(exporter)[0] is ExportOutcome.SENT
        receiver.down()  # its pooled connection is closed under it
        assert _send(exporter, timeout_seconds=1.0)[0] is ExportOutcome.RETRY
        receiver.up()
        assert _send(exporter)[0] is ExportOutcome.SENT
        assert len(receiver.spans()) == 6
        exporter.shutdown()


# -- reused sender threads ---------------------------------------------------------------------
def test_requests_one_after_another_share_one_sender_thread(transport):
    with HttpOtlpReceiver() as receiver:
        exporter = _exporter(receiver, transport)
        for _ in range(15):
            assert _send(exporter, 2)[0] is ExportOutcome.SENT
        assert exporter._senders.started == 1
        assert len(receiver.spans()) == 30
        exporter.shutdown()


def test_a_hung_job_holds_only_its_own_thread():
    senders = ReusedSenderThreads("t-senders", idle_seconds=5.0)
    release, done = threading.Event(), threading.Event()
    senders.submit(release.wait, (10.0,))  # hangs until released
    t0 = time.monotonic()
    senders.submit(done.set, ())
    assert done.wait(2.0) and time.monotonic() - t0 < 1.0
    assert senders.started == 2
    release.set()
    time.sleep(0.1)
    ran = threading.Event()
    senders.submit(ran.set, ())  # one of the two waiting threads takes it
    assert ran.wait(2.0) and senders.started == 2
    senders.close()


def test_idle_senders_leave_after_their_idle_time_and_on_close():
    senders = ReusedSenderThreads("t-idle-senders", idle_seconds=0.2)
    ran = threading.Event()
    senders.submit(ran.set, ())
    assert ran.wait(2.0)
    deadline = time.monotonic() + 3.0
    while any(t.name == "t-idle-senders" for t in threading.enumerate()):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    senders.submit(lambda: None, ())  # a new thread for the next job
    assert senders.started == 2
    closing = ReusedSenderThreads("t-closed-senders", idle_seconds=30.0)
    closing.submit(lambda: None, ())
    time.sleep(0.1)
    closing.close()
    deadline = time.monotonic() + 2.0
    while any(t.name == "t-closed-senders" for t in threading.enumerate()):
        assert time.monotonic() < deadline
        time.sleep(0.02)


def test_a_failing_job_does_not_kill_its_thread():
    senders = ReusedSenderThreads("t-failing", idle_seconds=5.0)
    senders.submit(lambda: 1 / 0, ())
    time.sleep(0.1)
    ran = threading.Event()
    senders.submit(ran.set, ())
    assert ran.wait(2.0) and senders.started == 1
    senders.close()


def test_after_a_fork_jobs_start_their_own_threads():
    senders = ReusedSenderThreads("t-fork", idle_seconds=5.0)
    senders.submit(lambda: None, ())
    time.sleep(0.1)
    senders._pid = -1  # as a forked child sees it: the waiting thread is not in this process
    ran = threading.Event()
    senders.submit(ran.set, ())
    assert ran.wait(2.0) and senders.started == 2  # a new thread ran it


def test_a_request_that_can_get_no_thread_is_sent_from_the_callers_thread(transport,
                                                                          monkeypatch):
    """Python 3.12.0 and 3.12.1 refuse new threads in atexit handlers, where the run's
    exit flush sends: the request goes out from the caller's thread instead."""
    real_start = threading.Thread.start

    def refuse(self):
        if self.name == "otel-train-otlp-http":
            raise RuntimeError("can't create new thread at interpreter shutdown")
        return real_start(self)

    with HttpOtlpReceiver() as receiver:
        exporter = _exporter(receiver, transport)
        with monkeypatch.context() as m:
            m.setattr(threading.Thread, "start", refuse)
            assert _send(exporter, 3)[0] is ExportOutcome.SENT
        assert exporter._senders.inline == 1 and exporter._senders.started == 0
        assert _send(exporter, 2)[0] is ExportOutcome.SENT  # threads again once they start
        assert exporter._senders.started == 1
        assert len(receiver.spans()) == 5
        exporter.shutdown()
