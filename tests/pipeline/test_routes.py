"""Every route delivers the same spans: the exporter process, the in-process stage
(``export_process=False``) and the fallback (the exporter process dies at start), to a real
OTLP receiver over gRPC and HTTP and to the span file, decode to the same spans (span ids and
timestamps aside, which each run draws and takes anew)."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import pytest
from google.protobuf import json_format
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from otlp_receivers import GrpcOtlpReceiver, HttpOtlpReceiver, ReceivedSpan, decode_request
from span_samples import run_shaped_steps
from train_helpers import clean_env  # noqa: F401  (autouse fixture)

import otel_train
from otel_train.rundir.span_files import read_otlp_json_lines

pytestmark = pytest.mark.timeout(180)
ROUTES = ("process", "in-process", "fallback")
TARGETS = ("grpc", "http/protobuf", "file")


def _train(run: otel_train.Run, phase_attribute: bool = True) -> None:
    """Steps of every shape, a user span opened with the OTel API inside a phase, and
    monitoring between steps."""
    run_shaped_steps(run, 4 if phase_attribute else 6, phase_attribute=phase_attribute)
    tracer = trace.get_tracer("user.code", "1.0")
    with run.step() as step:
        with step.phase("forward"):
            with tracer.start_as_current_span("user-work", attributes={"layer": 3}) as span:
                span.add_event("note", {"k": 1})
    with run.monitor("checkpoint"):
        pass


def _file_spans(path: Path) -> list[ReceivedSpan]:
    """The span file's lines, decoded as the receivers decode a request."""
    def ids_to_base64(obj):
        if isinstance(obj, dict):
            return {k: (base64.b64encode(bytes.fromhex(v)).decode("ascii")
                        if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str)
                        else ids_to_base64(v)) for k, v in obj.items()}
        return [ids_to_base64(v) for v in obj] if isinstance(obj, list) else obj

    spans = []
    for line in read_otlp_json_lines(path):
        request = ExportTraceServiceRequest()
        json_format.ParseDict(ids_to_base64(line), request)
        spans += decode_request(request)
    return spans


_MEASURED = ("train.memory.host_rss_bytes", "train.step.bound")


def _comparable(spans: list[ReceivedSpan]) -> list[str]:
    """Each span as text, its trace named by its root, its parent by name; ids and times
    left out (a monitoring operation's trace id is drawn by each run), and so are the values
    each run measures itself (its memory, the bound its phase times give): only their keys."""
    names = {s.span_id: s.name for s in spans}
    traces = {s.trace_id: f"{s.name}/{s.attributes.get('train.step')}"
              for s in spans if s.parent_span_id is None}
    out = []
    for s in spans:
        attrs = {k: "<measured>" if k in _MEASURED else v for k, v in s.attributes.items()}
        out.append(json.dumps([
            s.name, traces.get(s.trace_id), names.get(s.parent_span_id or "", s.parent_span_id),
            attrs, s.events, s.status_code, s.status_message, s.resource_attributes,
            s.scope_name, s.scope_version, s.kind, s.links], sort_keys=True, default=str))
    return sorted(out)


def _run_route(route: str, target: str, tmp_path: Path, endpoint: str | None,
               monkeypatch: pytest.MonkeyPatch, flat: bool = False, **extra: object
               ) -> otel_train.Run:
    options: dict = {**extra, "prometheus_port": None, "console": False, "run_id": "routes",
                     "service_name": "routes", "status_dir": str(tmp_path),
                     "export_interval_seconds": 0.05, "export_process": route != "in-process"}
    if target == "file":
        options.update(exporter="jsonl", spans_path=str(tmp_path / "spans.jsonl"))
    else:
        options.update(exporter="otlp", otlp_endpoint=endpoint, otlp_protocol=target)
    with monkeypatch.context() as patch:
        if route == "fallback":  # the exporter process exits as it starts
            patch.setattr("otel_train.export.process.launch._BOOT", "import sys; sys.exit(3)")
        run = otel_train.start_run(**options)
        _train(run, phase_attribute=not flat)
        run.shutdown(timeout=20)
    return run


def _delivered(route: str, target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               **extra: object) -> list[ReceivedSpan]:
    if target == "file":
        run = _run_route(route, target, tmp_path, None, monkeypatch, **extra)
        spans = _file_spans(tmp_path / "spans.jsonl")
    else:
        receiver = GrpcOtlpReceiver() if target == "grpc" else HttpOtlpReceiver()
        with receiver as rx:
            run = _run_route(route, target, tmp_path, rx.endpoint, monkeypatch)
            spans = rx.wait_for_spans(len(rx.spans()), timeout_seconds=5)
    assert run.dropped_spans() == {}, (route, target)
    assert ("exporter process pid" in run.export_plan.describe()) == (route != "in-process")
    return spans


def test_every_route_delivers_the_same_spans_to_every_target(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture):
    delivered = {}
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for route in ROUTES:
            for target in TARGETS:
                spans = _delivered(route, target, tmp_path / route / target.replace("/", "-"),
                                   monkeypatch)
                delivered[route, target] = _comparable(spans)
    # The fallback took over: the exporter process said it exited.
    assert any("exporter process exited" in r.getMessage() for r in caplog.records)
    want = delivered["process", "grpc"]
    names = [json.loads(s)[0] for s in want]
    assert names.count("train.step") == 5 and names.count("user-work") == 1
    assert names.count("train.checkpoint") == 1 and names.count("optimizer") == 1
    assert names.count("val_loss") == 1
    for key, got in delivered.items():
        assert got == want, key
    # The user span nests under its phase on every route.
    user = json.loads(next(s for s in want if json.loads(s)[0] == "user-work"))
    assert user[2] == "forward" and user[8] == "user.code"


def test_the_step_ring_delivers_the_same_spans_on_every_route(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch):
    """step_ring="on": flat steps go through the shared-memory ring, the others (a failed
    phase, nested phases, attributes it cannot carry, run.monitor) through the queue; the
    span file holds the same spans as with the ring off, on each route, none dropped. On
    the exporter process's route the child reads the ring and builds the steps' records
    (export/process/ring_feed.py): the same spans as those built in the training process."""
    want = _comparable(_delivered("in-process", "file", tmp_path / "off", monkeypatch,
                                  flat=True))
    for route in ROUTES:
        path = tmp_path / "ring" / route
        run = _run_route(route, "file", path, None, monkeypatch, flat=True, step_ring="on")
        assert run.dropped_spans() == {}, route
        source = run._telemetry.worker._ring_source
        counters = source.ring.counters()
        assert counters["written_steps"] >= 2 and counters["tail"] == counters["head"], route
        client = run._telemetry.client
        if route == "process":  # the exporter process read the ring and built its steps
            assert source.in_child and client.reads_ring
            assert client._reports.ring_counts["steps"] == counters["written_steps"]
        elif route == "fallback":  # it never started: the ring was read here after all
            assert client.reads_ring and not source.in_child
        assert _comparable(_file_spans(path / "spans.jsonl")) == want, route
