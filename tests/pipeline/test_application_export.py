"""An application with its own SDK TracerProvider and OTLP exporter: otel-train's spans still go
through otel-train's bounded, counted, fast-encoding export stage, to the application's endpoint
with the application's headers (a real OTLP receiver checks what arrives)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from otlp_receivers import GrpcOtlpReceiver, HttpOtlpReceiver
from train_helpers import clean_env  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.timeout(90)
REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import json, sys
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    protocol, endpoint, status, mode = sys.argv[1:5]
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        app_exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True,
                                        headers={"x-app-token": "secret"})
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        app_exporter = OTLPSpanExporter(endpoint=endpoint + "/v1/traces",
                                        headers={"x-app-token": "secret"})
    provider = TracerProvider(resource=Resource.create({"service.name": "the-app"}))
    provider.add_span_processor(BatchSpanProcessor(app_exporter, schedule_delay_millis=100))
    trace.set_tracer_provider(provider)

    import otel_train
    extra = {} if mode != "file" else {"exporter": "jsonl",
                                       "spans_path": status + "/spans.jsonl"}
    with otel_train.start_run(prometheus_port=None, console=False, status_dir=status,
                              run_id="app-run", trace_export="own" if mode == "file" else mode,
                              export_interval_seconds=0.1, **extra) as run:
        for step in run.steps(range(5)):
            with step.phase("forward"):
                with trace.get_tracer("app").start_as_current_span("app-span"):
                    pass
    provider.force_flush(5000)
    exported = run._telemetry.export.exported if run._telemetry.export else None
    print(json.dumps({"plan": run.export_plan.describe(), "exported": exported,
                      "dropped": run.dropped_spans()}))
    provider.shutdown()
""")


def _run(tmp_path: Path, protocol: str, endpoint: str, mode: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, protocol, endpoint, str(tmp_path),
                           mode], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_our_spans_take_our_export_stage_to_the_applications_endpoint(tmp_path: Path,
                                                                       protocol: str):
    receiver = GrpcOtlpReceiver() if protocol == "grpc" else HttpOtlpReceiver()
    with receiver as rx:
        result = _run(tmp_path, "grpc" if protocol == "grpc" else "http", rx.endpoint, "own")
        spans = rx.wait_for_spans(5 * 4)  # 5 x (train.step, data, forward, app-span)
    assert "the application's exporter" in result["plan"]
    assert result["exported"] == 5 * 3  # ours, counted by our stage; app-span is the app's
    assert result["dropped"] == {}
    names = sorted(s.name for s in spans)
    assert names == sorted(["train.step", "data", "forward", "app-span"] * 5)
    # With the application's headers and resource; app spans still nest under our phases.
    assert all(h.get("x-app-token") == "secret" for h in rx.request_headers())
    assert {s.resource_attributes["service.name"] for s in spans} == {"the-app"}
    forward = {s.span_id for s in spans if s.name == "forward"}
    assert {s.parent_span_id for s in spans if s.name == "app-span"} <= forward


def test_trace_export_application_keeps_handing_spans_to_the_applications_pipeline(
        tmp_path: Path):
    with GrpcOtlpReceiver() as rx:
        result = _run(tmp_path, "grpc", rx.endpoint, "application")
        spans = rx.wait_for_spans(5 * 4)
    assert result["plan"] == "application TracerProvider"
    assert result["exported"] is None  # no export stage of ours
    assert len([s for s in spans if s.name == "train.step"]) == 5


def test_an_explicit_span_file_beside_an_application_provider_gets_every_step(
        tmp_path: Path):
    """exporter= given while the application has its provider: our spans go to both, the
    file through the exporter process, fed span by span from the worker's span path."""
    from train_helpers import read_file_spans

    with GrpcOtlpReceiver() as rx:
        result = _run(tmp_path, "grpc", rx.endpoint, "file")
        spans = rx.wait_for_spans(5 * 4)
    assert "exporter process pid" in result["plan"]
    assert result["exported"] == 5 * 3 and result["dropped"] == {}
    in_file = read_file_spans(tmp_path / "spans.jsonl")
    assert sorted(s.name for s in in_file) == sorted(["train.step", "data", "forward"] * 5)
    assert len([s for s in spans if s.name == "train.step"]) == 5  # and the app's pipeline
