"""The SDK's private attributes: read in one module, checked against the installed SDK, and
a loud error (not a quiet fallback) on an SDK that lacks one."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpExporter,
)
from opentelemetry.sdk.trace import TracerProvider

from otel_train.common import sdk_private
from otel_train.common.sdk_private import SdkPrivateMismatch
from otel_train.export.otlp.transport import (
    SingleAttemptGrpcSpanExporter,
    SingleAttemptHttpSpanExporter,
)
from otel_train.pipeline.application_export import exporter_like_application

PACKAGE = Path(__file__).resolve().parents[2] / "otel_train"
PYPROJECT = PACKAGE.parent / "pyproject.toml"
# The SDK's private attributes otel-train reads. The rule: none of these names is read off
# anything but ``self``/``cls`` outside the adapter (a class of otel-train's own, such as
# ``RowRoot``, may hold one on ``self``: it mirrors the SDK span it stands in for).
SDK_PRIVATE_NAMES = frozenset({
    "_endpoint", "_insecure", "_credentials", "_headers", "_timeout", "_compression",
    "_channel", "_initialize_channel_and_stub", "_client", "_submit", "_compress",
    "_transport", "_active_span_processor", "_span_processors", "_root", "_shutdown_event",
    "_attributes", "_context", "_name", "_parent", "_start_time", "_end_time",
})


def test_every_private_read_works_on_the_installed_sdk():
    checked = sdk_private.check_sdk()
    assert {"grpc exporter _channel", "http client _submit", "provider _active_span_processor",
            "ParentBased _root", "periodic metric reader _shutdown_event"} <= set(checked)


def test_a_missing_attribute_is_an_error_naming_the_class_the_attribute_and_the_versions():
    class MovedExporter:
        pass

    with pytest.raises(SdkPrivateMismatch, match=r"MovedExporter has no '_endpoint'.*"
                       + re.escape(sdk_private.SUPPORTED_SDK)):
        sdk_private.otlp_endpoint(MovedExporter())


def test_a_grpc_exporter_without_its_channel_fails_at_set_up(monkeypatch):
    """The single-attempt exporter is built on the SDK's: if the SDK moved its channel, the
    run's set-up says so rather than sending nothing."""
    import otel_train.export.otlp.transport as transport

    def moved(**kwargs):
        sdk = GrpcExporter(**kwargs)
        sdk.shutdown()
        del sdk._channel
        return sdk

    monkeypatch.setattr(transport, "_sdk_grpc_exporter", moved)
    with pytest.raises(SdkPrivateMismatch, match="'_channel'"):
        SingleAttemptGrpcSpanExporter(endpoint="http://127.0.0.1:4317", insecure=True)


def test_an_http_client_without_its_single_request_path_fails_rather_than_retrying(
        monkeypatch):
    """From 1.45 the SDK's HTTP client sends one request (``_submit``); on a version that
    should have it and does not, the exporter refuses instead of quietly taking the SDK's
    own retrying export."""
    import otel_train.export.otlp.transport as transport

    def moved(**kwargs):
        sdk = HttpExporter(**kwargs)
        sdk._client = type("MovedClient", (), {"_timeout": 10, "_transport": None})()
        return sdk

    monkeypatch.setattr(transport, "_sdk_http_exporter", moved)
    with pytest.raises(SdkPrivateMismatch, match="MovedClient has no '_submit'"):
        SingleAttemptHttpSpanExporter(endpoint="http://127.0.0.1:4318/v1/traces")


def test_before_the_http_client_existed_the_exporter_uses_the_sdk_export(monkeypatch):
    monkeypatch.setattr(sdk_private, "installed_version", lambda dist="": (1, 44, 0))
    exporter = SingleAttemptHttpSpanExporter(endpoint="http://127.0.0.1:4318/v1/traces")
    try:
        assert not exporter._direct and not exporter.lean_transport
    finally:
        exporter.shutdown()


def test_an_application_exporter_whose_settings_moved_is_reported_and_its_pipeline_used(
        caplog):
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    app = HttpExporter(endpoint="http://127.0.0.1:4318/v1/traces")
    del app._compression
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(app))
    with caplog.at_level("WARNING", logger="otel_train"):
        assert exporter_like_application(provider) is None
    assert "has no '_compression'" in caplog.text
    provider.shutdown()


def test_no_module_but_the_adapter_reads_an_sdk_private_attribute():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "sdk_private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = None
            if (isinstance(node, ast.Attribute) and node.attr in SDK_PRIVATE_NAMES
                    and not (isinstance(node.value, ast.Name)
                             and node.value.id in ("self", "cls"))):
                name = node.attr
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1
                  and isinstance(node.args[1], ast.Constant)
                  and node.args[1].value in SDK_PRIVATE_NAMES):
                name = node.args[1].value
            if name:
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {name}")
    assert not offenders, "read these through otel_train/common/sdk_private.py:\n" + "\n".join(
        offenders)


def test_pyproject_bounds_the_sdk_to_the_versions_checked():
    text = PYPROJECT.read_text()
    low, high = re.match(r">=([\d.]+),<([\d.]+)", sdk_private.SUPPORTED_SDK).groups()
    for dist in ("opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp"):
        assert f'"{dist}>={low},<{high}"' in text, dist
    installed = sdk_private.installed_version()
    assert installed[:2] < tuple(int(x) for x in high.split("."))[:2], (
        "the installed SDK is past the bound: run check_sdk on it, then move the bound")
