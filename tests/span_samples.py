"""Spans of every shape, shared by the encoding and span-file tests."""

from __future__ import annotations

import pytest
from train_helpers import start_test_run
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)


def run_shaped_steps(run, steps: int, phase_attribute: bool = False) -> None:
    """Steps of every shape: a loss attribute, monitoring with its own data (step 1), a
    failed phase (step 2), and with ``phase_attribute`` an attribute on a phase."""
    for step in run.steps(range(steps), loader="train"):
        with step.phase("forward") as ph:
            if phase_attribute:
                ph.set_attribute("tokens", 7 * step.index)
        step.set_attribute("train.loss", 0.25 * step.index)
        if step.index == 1:
            with step.monitor("val_loss"):
                for _ in step.iter_data([1, 2], loader="val"):
                    pass
        if step.index == 2:
            with pytest.raises(RuntimeError):
                with step.phase("optimizer"):
                    raise RuntimeError("nan loss")


def _sdk_spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "enc", "n": 3}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("scope-a", "1.2.3", schema_url="https://schema/x")
    other = provider.get_tracer("scope-b")
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1),
                         trace_state=TraceState([("vendor", "v1"), ("k", "x")]))
    with tracer.start_as_current_span(
        "root", kind=SpanKind.SERVER, context=set_span_in_context(NonRecordingSpan(remote)),
        attributes={"s": "text", "b": True, "f": False, "i": -42, "big": 2**62, "x": 1.5,
                    "seq_s": ["a", "b"], "seq_i": [1, -2], "seq_f": [0.5], "seq_b": [True],
                    "empty": "", "zero": 0},
        links=[Link(remote, {"link.attr": 7})],
    ) as root:
        root.add_event("checkpoint", {"bytes_written": 1024, "path": "/tmp/x"})
        root.add_event("plain")
        with other.start_as_current_span("child", kind=SpanKind.CLIENT) as child:
            child.set_status(Status(StatusCode.ERROR, "boom"))
            child.record_exception(ValueError("bad value"))
        with tracer.start_as_current_span("ok-child") as ok:
            ok.set_status(Status(StatusCode.OK))
        for kind in (SpanKind.PRODUCER, SpanKind.CONSUMER, SpanKind.INTERNAL):
            with tracer.start_as_current_span(f"k-{kind.name}", kind=kind):
                pass
    provider.shutdown()
    return list(exporter.get_finished_spans())


def _records(tmp_path):
    """Span records of steps of every shape, user span rows, and the run's factory."""
    from otel_train.records.span_rows import row_from_span

    # The queue path: every step's record is read from the recorder's queue (with the step
    # ring, the default's, flat steps would go to the exporter process).
    with start_test_run(tmp_path, step_ring="off") as run:
        run._telemetry.worker.paused = True
        run_shaped_steps(run, 4, phase_attribute=True)
        run_shaped_steps(run, 3)
        with run.monitor("checkpoint"):
            pass
        builder = run._telemetry.builder
        records = [builder.record(r) for r in list(run._recorder.queue)]
        run._telemetry.worker.paused = False
    user_rows = [row_from_span(s) for s in _sdk_spans()]
    return records, user_rows, builder.factory


def _records_and_rows(tmp_path):
    """Span records of steps of every shape, their rows, and the run's factory."""
    from otel_train.records.span_rows import rows_from_record

    records, user_rows, factory = _records(tmp_path)
    rows = [row for rec in records for row in rows_from_record(rec)]
    return rows, user_rows, factory
