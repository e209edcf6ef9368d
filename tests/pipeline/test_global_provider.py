"""The global provider: otel-train's run-scoped one forwards to the active run; an
application's own SDK provider is reused and receives our spans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from train_helpers import clean_env  # noqa: F401  (autouse fixture)

from otel_train.pipeline.global_provider import RunScopedTracerProvider

REPO = Path(__file__).resolve().parents[2]


def test_run_scoped_provider_forwards_to_the_active_provider():
    scoped = RunScopedTracerProvider()
    tracer = scoped.get_tracer("lib")
    with tracer.start_as_current_span("nothing-active") as span:
        assert not span.is_recording()
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    scoped.activate(provider)
    assert scoped.current is provider
    with tracer.start_as_current_span("active"):
        pass
    tracer.start_span("plain").end()
    scoped.activate(None)
    with tracer.start_as_current_span("after"):
        pass
    assert [s.name for s in memory.get_finished_spans()] == ["active", "plain"]


_APP_PROVIDER_SCRIPT = textwrap.dedent("""
    import json, sys
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "the-app"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    trace.set_tracer_provider(provider)

    import otel_train
    with otel_train.start_run(prometheus_port=None, console=False, status_dir=sys.argv[1],
                              run_id="app-run", device_sync="off") as run:
        for step in run.steps([0, 1]):
            with step.phase("forward"):
                with trace.get_tracer("app").start_as_current_span("app-span"):
                    pass
    out = [{"name": s.name, "span_id": s.context.span_id, "trace_id": s.context.trace_id,
            "parent": s.parent.span_id if s.parent else None,
            "service": s.resource.attributes.get("service.name"),
            "step": s.attributes.get("train.step")}
           for s in memory.get_finished_spans()]
    print(json.dumps({"mode": run._telemetry.provider_mode, "plan": run.export_plan.kind,
                      "global_is_app": trace.get_tracer_provider() is provider,
                      "spans": out}))
""")


def test_an_application_tracer_provider_is_reused_and_receives_our_spans(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", _APP_PROVIDER_SCRIPT, str(tmp_path)],
                          capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["mode"] == "app"
    assert result["global_is_app"] is True
    spans = result["spans"]
    names = sorted(s["name"] for s in spans)
    assert names == sorted(["train.step", "data", "forward", "app-span"] * 2)
    assert {s["service"] for s in spans} == {"the-app"}  # the application's resource
    roots = {s["trace_id"]: s for s in spans if s["name"] == "train.step"}
    assert sorted(r["step"] for r in roots.values()) == [0, 1]
    for trace_id, root in roots.items():
        by = {s["name"]: s for s in spans if s["trace_id"] == trace_id}
        assert set(by) == {"train.step", "data", "forward", "app-span"}
        assert by["app-span"]["parent"] == by["forward"]["span_id"]
        assert by["forward"]["parent"] == root["span_id"]
    assert not list(tmp_path.glob("*.jsonl"))  # the application's pipeline exports, not us
