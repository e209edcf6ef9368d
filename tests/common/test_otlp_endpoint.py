"""The OTLP endpoint checked at start-up: what the SDK's exporters cannot use is said in one
line naming the variable, the value and what is wrong; a port of the other protocol gets a
hint; training starts either way."""

from __future__ import annotations

import logging

import pytest
from train_helpers import clean_env  # noqa: F401

import otel_train
from otel_train.common.otlp_endpoint import endpoint_hint, endpoint_problem, warn_endpoint

HTTP, GRPC = "http/protobuf", "grpc"


@pytest.mark.parametrize(("endpoint", "protocol", "problem"), [
    ("not-a-url", HTTP, "it is not a URL: http/protobuf sends to http://host:4318 or "
                        "https://host:4318"),
    ("127.0.0.1:4318", HTTP, "it is not a URL"),
    ("grpc://collector:4317", HTTP, "its scheme 'grpc://' is not http:// or https://"),
    ("http://:4318", HTTP, "it names no host"),
    ("http://collector:43x8", HTTP, "its port '43x8' is not a number from 1 to 65535"),
    ("http://collector:70000", HTTP, "its port '70000' is not a number from 1 to 65535"),
    ("http://collector 4318", HTTP, "it holds spaces"),
    ("not-a-url", GRPC, "it names no port: gRPC sends to http://host:4317 (plaintext), "
                        "https://host:4317 or host:port"),
    (":4317", GRPC, "it names no host"),
    ("http://collector:4317x", GRPC, "its port '4317x' is not a number"),
])
def test_an_endpoint_the_sdk_cannot_use_is_named_with_what_is_wrong(endpoint, protocol,
                                                                      problem):
    found = endpoint_problem(endpoint, protocol)
    assert found is not None and found.startswith(problem), found


@pytest.mark.parametrize(("endpoint", "protocol"), [
    ("http://127.0.0.1:4318", HTTP), ("https://collector.example:443/otlp", HTTP),
    ("http://[::1]:4318", HTTP), ("http://collector", HTTP),
    ("http://127.0.0.1:4317", GRPC), ("https://collector:4317", GRPC),
    ("collector:4317", GRPC), ("[::1]:4317", GRPC), ("unix:///run/otel.sock", GRPC),
    ("unix:/run/otel.sock", GRPC), ("dns:///collector:4317", GRPC),
    ("grpc://collector:4317", GRPC),  # taken: only a hint (below)
])
def test_an_endpoint_the_sdk_takes_has_no_problem(endpoint, protocol):
    assert endpoint_problem(endpoint, protocol) is None


def test_a_port_of_the_other_protocol_gets_a_hint_and_a_grpc_target_without_scheme_too():
    assert endpoint_hint("http://127.0.0.1:4317", HTTP, {}) == (
        "port 4317 is OTLP/gRPC's, and the protocol is http/protobuf: a collector listens for "
        "it on 4318 (or set OTEL_EXPORTER_OTLP_PROTOCOL=grpc)")
    assert endpoint_hint("http://127.0.0.1:4318", GRPC, {}).startswith(
        "port 4318 is OTLP/HTTP's, and the protocol is grpc")
    assert endpoint_hint("collector:4317", GRPC, {}).startswith(
        "without a scheme the gRPC exporter connects with TLS; write http://collector:4317")
    assert endpoint_hint("collector:4317", GRPC, {"OTEL_EXPORTER_OTLP_INSECURE": "true"}) is None
    assert endpoint_hint("grpc://collector:4317", GRPC, {}) == (
        "the gRPC exporter keeps only host:port of a grpc:// URL and connects with TLS, as for "
        "https://; write http:// for a plaintext collector")
    assert endpoint_hint("http://127.0.0.1:4318", HTTP, {}) is None
    assert endpoint_hint("unix:///run/otel.sock", GRPC, {}) is None
    assert endpoint_hint("http://127.0.0.1:4317", GRPC, {}) is None


def test_the_line_names_the_variable_the_value_and_what_is_wrong(caplog):
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        line = warn_endpoint("OTEL_EXPORTER_OTLP_ENDPOINT", "not-a-url", HTTP, {})
        warn_endpoint("OTEL_EXPORTER_OTLP_ENDPOINT", "not-a-url", HTTP, {})  # said once
    assert line == ("otel-train: OTEL_EXPORTER_OTLP_ENDPOINT='not-a-url' is not a usable OTLP "
                    "http/protobuf endpoint: it is not a URL: http/protobuf sends to "
                    "http://host:4318 or https://host:4318; training goes on, its spans will "
                    "not reach a collector")
    assert [r.getMessage() for r in caplog.records] == [line]
    assert warn_endpoint("otlp_endpoint", "http://127.0.0.1:4318", HTTP, {}) is None


@pytest.mark.parametrize(("variable", "value", "expected"), [
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "not-a-url", "is not a usable OTLP http/protobuf endpoint"),
    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4317", "port 4317 is OTLP/gRPC's"),
])
def test_a_run_says_it_once_at_start_and_trains_all_the_same(tmp_path, monkeypatch, caplog,
                                                             variable, value, expected):
    monkeypatch.setenv(variable, value)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        run = otel_train.start_run(prometheus_port=None, console=False,
                                   status_dir=str(tmp_path), shutdown_timeout_seconds=0.5,
                                   export_process=False)
        said = [r.getMessage() for r in caplog.records if variable in r.getMessage()]
        trained = []
        for step in run.steps(range(3)):
            with step.phase("forward"):
                trained.append(step.index)
        run.shutdown()
    assert len(said) == 1 and said[0].startswith(f"otel-train: {variable}={value!r}")
    assert expected in said[0]
    assert trained == [0, 1, 2]
