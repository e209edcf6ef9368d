"""Wiring to the OTel SDK: the OTEL_* environment, exporter choice, resource, global provider."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpExporter,
)
from train_helpers import clean_env  # noqa: F401  (autouse fixture)

from otel_train.common.options import RunOptions
from otel_train.export.span_file import OtlpJsonFileSpanExporter
from otel_train.export.otlp.transport import (
    SingleAttemptGrpcSpanExporter,
    SingleAttemptHttpSpanExporter,
)
from otel_train.export.exporters import create_exporter
from otel_train.common.sdk_config import (
    ExportPlan,
    build_resource,
    plan_export,
    sdk_disabled,
)

pytestmark = pytest.mark.timeout(60)



def _plan(env: dict[str, str], rank: int = 0, world_size: int = 1, **options):
    return plan_export(RunOptions.resolve(environ={}, **options), Path("/status"), rank,
                       world_size, env=env)


def _warnings(caplog, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage()]


def test_no_endpoint_and_no_exporter_means_a_span_file_in_the_status_dir():
    plan = _plan({})
    # gzip by default (the OTLP JSON lines compress ~19x: a few hundred bytes per step).
    assert (plan.kind, plan.path) == ("jsonl", Path("/status/spans.jsonl.gz"))
    assert plan.compression == "gzip"
    plain = _plan({}, spans_compression="none")
    assert (plain.path, plain.compression) == (Path("/status/spans.jsonl"), "none")
    assert str(plan.path) in plan.describe()


def test_each_rank_gets_its_own_span_file():
    assert _plan({}, rank=3, world_size=4).path == Path("/status/spans-rank3.jsonl.gz")


def test_spans_path_option_wins_for_the_file():
    assert _plan({}, spans_path="/x/y.jsonl").path == Path("/x/y.jsonl")


def test_an_otlp_endpoint_in_the_env_means_otlp_http_by_default():
    plan = _plan({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"})
    assert (plan.kind, plan.protocol, plan.endpoint) == (
        "otlp", "http/protobuf", "http://collector:4318")
    assert plan.timeout_seconds == 10.0


def test_signal_specific_endpoint_and_protocol_win_over_the_generic_ones():
    plan = _plan({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://generic:4318",
                  "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://traces:4317",
                  "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                  "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"})
    assert (plan.protocol, plan.endpoint) == ("grpc", "http://traces:4317")


def test_options_beat_the_otel_environment():
    plan = _plan({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                  "OTEL_EXPORTER_OTLP_ENDPOINT": "http://env:4317"},
                 exporter="otlp", otlp_endpoint="http://opt:4318", otlp_protocol="http/protobuf")
    assert (plan.kind, plan.protocol, plan.endpoint) == ("otlp", "http/protobuf",
                                                         "http://opt:4318")


@pytest.mark.parametrize("value,kind", [("none", "none"), ("console", "console"),
                                        ("otlp", "otlp"), ("jsonl", "jsonl")])
def test_otel_traces_exporter_chooses_the_exporter(value, kind):
    assert _plan({"OTEL_TRACES_EXPORTER": value}).kind == kind


def test_several_exporters_use_the_first_and_warn(caplog):
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        assert _plan({"OTEL_TRACES_EXPORTER": "console,otlp"}).kind == "console"
    assert len(_warnings(caplog, "OTEL_TRACES_EXPORTER")) == 1


def test_otel_sdk_disabled_means_no_export():
    assert _plan({"OTEL_SDK_DISABLED": "true",
                  "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}).kind == "none"
    assert sdk_disabled({"OTEL_SDK_DISABLED": "TRUE"})
    assert not sdk_disabled({"OTEL_SDK_DISABLED": "false"})
    assert not sdk_disabled({})


def test_a_bogus_traces_exporter_warns_once_and_falls_back(caplog):
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for _ in range(3):
            assert _plan({"OTEL_TRACES_EXPORTER": "bogus"}).kind == "jsonl"
    msgs = _warnings(caplog, "OTEL_TRACES_EXPORTER")
    assert len(msgs) == 1
    assert "bogus" in msgs[0].getMessage()


def test_an_unparsable_otlp_timeout_warns_once_and_uses_ten_seconds(caplog):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TIMEOUT": "abc"}
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for _ in range(3):
            assert _plan(env).timeout_seconds == 10.0
    assert len(_warnings(caplog, "OTEL_EXPORTER_OTLP_TIMEOUT")) == 1


def test_a_valid_otlp_timeout_is_used():
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TIMEOUT": "2.5"}
    assert _plan(env).timeout_seconds == 2.5
    # Seconds, as the Python SDK's OTLP exporters read it (not the spec's milliseconds).
    env["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"] = "5"
    assert _plan(env).timeout_seconds == 5.0


def test_an_unsupported_otlp_protocol_warns_once_and_falls_back_to_http(caplog):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "xml"}
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for _ in range(3):
            assert _plan(env).protocol == "http/protobuf"
    msgs = _warnings(caplog, "OTEL_EXPORTER_OTLP_PROTOCOL")
    assert len(msgs) == 1 and "xml" in msgs[0].getMessage()


def test_create_exporter_builds_the_planned_exporter(tmp_path):
    grpc = create_exporter(ExportPlan("otlp", "grpc", "http://127.0.0.1:4317"))
    http = create_exporter(ExportPlan("otlp", "http/protobuf", "http://h:4318/"))
    jsonl = create_exporter(ExportPlan("jsonl", path=tmp_path / "s.jsonl"))
    try:
        # Single-attempt wrappers (the processor retries) around the SDK's exporters, which
        # still read every OTEL_EXPORTER_OTLP_* setting.
        assert isinstance(grpc, SingleAttemptGrpcSpanExporter)
        assert isinstance(grpc.sdk_exporter, GrpcExporter)
        assert isinstance(http, SingleAttemptHttpSpanExporter)
        assert isinstance(http.sdk_exporter, HttpExporter)
        assert http.sdk_exporter._endpoint == "http://h:4318/v1/traces"
        assert isinstance(jsonl, OtlpJsonFileSpanExporter)  # the OpenTelemetry file format
        assert create_exporter(ExportPlan("none")) is None
    finally:
        for exporter in (grpc, http, jsonl):
            exporter.shutdown()


def test_the_traces_specific_endpoint_is_used_as_is_over_http():
    plan = _plan({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://gw:4318/otlp/traces"})
    exporter = create_exporter(plan)
    try:
        assert exporter.sdk_exporter._endpoint == "http://gw:4318/otlp/traces"
    finally:
        exporter.shutdown()


def test_resource_service_name_option_beats_env(monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "env-svc")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "team=ml,service.name=attr-svc")
    res = build_resource("opt-svc", {"service.instance.id": "r/rank0"})
    assert res.attributes["service.name"] == "opt-svc"
    assert res.attributes["team"] == "ml"
    assert res.attributes["service.instance.id"] == "r/rank0"


def test_resource_service_name_from_env_then_resource_attributes_then_default(monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "env-svc")
    assert build_resource(None, {}).attributes["service.name"] == "env-svc"
    monkeypatch.delenv("OTEL_SERVICE_NAME")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=attr-svc")
    assert build_resource(None, {}).attributes["service.name"] == "attr-svc"
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES")
    assert build_resource(None, {}).attributes["service.name"] == "otel-train"


# -- secrets stay secret ------------------------------------------------------------------------

def test_the_banner_line_never_shows_credentials():
    plan = ExportPlan("otlp", "http/protobuf",
                      "https://alice:TOKEN-123@collector.example:4318/x?api_key=KEY-9&tenant=a",
                      header_names=("authorization",))
    text = plan.describe()
    assert "TOKEN-123" not in text and "alice" not in text and "KEY-9" not in text
    assert text == ("OTLP http/protobuf -> https://***@collector.example:4318/x?api_key=***"
                    "&tenant=*** (headers: authorization=***)")
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://bob:PW-7@c:4318",
           "OTEL_EXPORTER_OTLP_HEADERS": "x-api-key=HDR-1,authorization=Basic%20HDR-2"}
    text = _plan(env).describe()
    assert "PW-7" not in text and "HDR-1" not in text and "HDR-2" not in text
    assert "x-api-key=***" in text and "authorization=***" in text


_SECRETS = ("URL-PASS-123", "HDR-TOKEN-456", "HDR-KEY-789")


def test_credentials_reach_the_collector_but_no_banner_log_file_or_span(
        tmp_path, monkeypatch, capsys, caplog):
    from otlp_receivers import HttpOtlpReceiver

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS",
                       "x-tenant-token=Bearer%20HDR-TOKEN-456,x-api-key=HDR-KEY-789")
    import otel_train

    with HttpOtlpReceiver(mode="reject", reject_code=401) as receiver:
        endpoint = f"http://trainer:URL-PASS-123@127.0.0.1:{receiver.port}"
        with caplog.at_level(logging.DEBUG):
            with otel_train.start_run(exporter="otlp", otlp_endpoint=endpoint,
                                      otlp_protocol="http/protobuf", prometheus_port=None,
                                      console=True, status_dir=str(tmp_path),
                                      export_interval_seconds=0.05, log_every=1) as run:
                for step in run.steps(range(3)):  # refused (401): warnings are logged
                    with step.phase("forward"):
                        pass
                run.flush(5)
                receiver.mode = "ok"
                for step in run.steps(range(2)):
                    with step.phase("forward"):
                        pass
                assert run.flush(5)
        spans = receiver.wait_for_spans(6, 5)
        headers = receiver.request_headers()[0]
    # They were used: the header values as given, the URL's userinfo as HTTP basic auth.
    assert headers["x-api-key"] == "HDR-KEY-789"
    assert headers["x-tenant-token"] == "Bearer HDR-TOKEN-456"
    assert headers["authorization"] == "Basic " + base64.b64encode(
        b"trainer:URL-PASS-123").decode()
    captured = capsys.readouterr()
    seen = [captured.out, captured.err, *(r.getMessage() for r in caplog.records)]
    seen += [p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()]
    seen += [repr(s.attributes) + repr(s.resource_attributes) for s in spans]
    assert any("otel-train: run" in text for text in seen)  # the banner was printed
    assert any("rejected" in text for text in seen)  # and the 401 was logged
    for secret in _SECRETS:
        assert not [text for text in seen if secret in text], secret


def test_userinfo_in_a_grpc_endpoint_is_not_sent_nor_logged(tmp_path, caplog):
    from otlp_receivers import GrpcOtlpReceiver

    import otel_train

    with GrpcOtlpReceiver() as receiver:
        endpoint = f"http://trainer:URL-PASS-123@127.0.0.1:{receiver.port}"
        with caplog.at_level(logging.DEBUG):
            with otel_train.start_run(exporter="otlp", otlp_endpoint=endpoint,
                                      otlp_protocol="grpc", prometheus_port=None,
                                      console=False, status_dir=str(tmp_path)) as run:
                for step in run.steps(range(2)):
                    with step.phase("forward"):
                        pass
        receiver.wait_for_spans(6, 5)
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "URL-PASS-123" in m]
    assert len([m for m in messages if "gRPC endpoint URL are not sent" in m]) == 1
    assert "-> http://***@127.0.0.1:%d" % receiver.port in run.export_plan.describe()


def test_the_request_size_option_reaches_the_exporter_and_is_validated():
    plan = _plan({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
                 export_max_request_bytes=1 << 20)
    assert plan.max_request_bytes == 1 << 20
    exporter = create_exporter(plan, env={})
    try:
        assert exporter.max_request_bytes == 1 << 20
    finally:
        exporter.shutdown()
    with pytest.raises(ValueError, match="export_max_request_bytes"):
        RunOptions.resolve(environ={}, export_max_request_bytes=100)
    env_opts = RunOptions.resolve(environ={"OTEL_TRAIN_EXPORT_MAX_REQUEST_BYTES": "2000000"})
    assert env_opts.export_max_request_bytes == 2_000_000
