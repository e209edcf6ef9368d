"""Why an OTLP send failed, in words: real sends through the single-attempt exporters to a
closed port, a host that does not resolve, a malformed endpoint, and a real receiver that
answers with an error; an unreachable endpoint and a malformed one read differently, and no
exception class name or Python dict reaches the line."""

from __future__ import annotations

import re
import socket

import pytest
from otlp_receivers import GrpcOtlpReceiver, HttpOtlpReceiver

from otel_train.export.otlp.failure_words import (
    NOT_A_URL,
    NOT_RESOLVED,
    REFUSED,
    grpc_error_words,
    http_status_words,
)
from otel_train.export.otlp.transport import (
    ExportOutcome,
    SingleAttemptGrpcSpanExporter,
    SingleAttemptHttpSpanExporter,
)

pytestmark = pytest.mark.timeout(60)
_CLASS_NAME = re.compile(r"\b[A-Z][a-z]+(?:[A-Z][a-z]+)+(?:Error|Exception|Schema)?\b|[{}]")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on leaving: nothing listens there


def _send(exporter) -> tuple[ExportOutcome | None, str]:
    pending = exporter.start_send([], b"", 3.0)
    outcome = pending.wait(5.0)
    exporter.shutdown()
    return outcome, pending.detail


def _http(endpoint: str) -> SingleAttemptHttpSpanExporter:
    return SingleAttemptHttpSpanExporter(endpoint=endpoint, timeout=3)


def _grpc(endpoint: str) -> SingleAttemptGrpcSpanExporter:
    return SingleAttemptGrpcSpanExporter(endpoint=endpoint, timeout=3)


@pytest.mark.parametrize("make", [_http, _grpc], ids=["http", "grpc"])
def test_a_closed_port_reads_as_a_refused_connection(make):
    outcome, detail = _send(make(f"http://127.0.0.1:{_closed_port()}"))
    assert outcome is ExportOutcome.RETRY and detail == REFUSED


@pytest.mark.parametrize("make", [_http, _grpc], ids=["http", "grpc"])
def test_a_host_that_does_not_resolve_says_so(make):
    outcome, detail = _send(make("http://no-such-collector.invalid:4318"))
    assert outcome is ExportOutcome.RETRY and detail == NOT_RESOLVED


def test_a_malformed_endpoint_reads_otherwise_than_an_unreachable_one():
    outcome, detail = _send(_http("not-a-url"))
    assert outcome is ExportOutcome.RETRY and detail == NOT_A_URL
    assert detail != REFUSED and not _CLASS_NAME.search(detail)


def test_an_http_error_answer_gives_its_status_and_what_it_means():
    with HttpOtlpReceiver(mode="reject", reject_code=404) as recv:
        outcome, detail = _send(_http(recv.endpoint + "/v1/traces"))
    assert outcome is ExportOutcome.REJECTED
    assert detail.startswith("the collector answered HTTP 404: nothing answers at that path")
    assert http_status_words(503) == ("the collector answered HTTP 503: the collector is "
                                      "unavailable for now")


def test_an_unavailable_grpc_collector_and_other_codes_read_in_words():
    with GrpcOtlpReceiver(mode="unavailable") as recv:
        outcome, detail = _send(_grpc(recv.endpoint))
    assert outcome is ExportOutcome.RETRY and detail == "the collector is unavailable for now"
    assert grpc_error_words("DEADLINE_EXCEEDED", "") == "no answer within the export timeout"
    assert grpc_error_words("UNIMPLEMENTED", "").startswith(
        "the server there has no OTLP trace service")
    assert grpc_error_words("FAILED_PRECONDITION", "odd") == "it failed (FAILED_PRECONDITION: odd)"


@pytest.mark.parametrize("make", [_http, _grpc], ids=["http", "grpc"])
def test_no_failure_reads_as_a_class_name_or_a_dict(make):
    for endpoint in (f"http://127.0.0.1:{_closed_port()}", "http://no-such.invalid:4318"):
        _, detail = _send(make(endpoint))
        assert not _CLASS_NAME.search(detail), detail
