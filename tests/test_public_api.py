"""The public API: ``otel_train`` exports what the docs teach; the SDK span processors live
in ``otel_train.sdk`` and work in an application's own TracerProvider."""

from __future__ import annotations

import time
import warnings

import pytest
from opentelemetry.sdk.trace import TracerProvider

import otel_train
from otel_train import sdk
from otel_train.common import attributes as A


def test_the_top_level_names_are_what_the_docs_teach():
    assert set(otel_train.__all__) == {
        "start_run", "Run", "RunOptions", "Step", "Phase", "MonitorRecord", "instrument",
        "Instrumentation", "instrument_ddp", "instrument_collectives", "__version__"}
    for name in otel_train.__all__:
        assert getattr(otel_train, name) is not None


def test_the_sdk_namespace_holds_the_span_processors():
    assert set(sdk.__all__) == {
        "BoundedBatchSpanProcessor", "BudgetSpanProcessor", "ConsoleReportSpanProcessor",
        "JsonLinesSpanExporter", "OverheadSpanProcessor", "PrometheusMetricsSpanProcessor",
        "SharedStepSpanProcessor", "SlowStepSpanProcessor", "StepView"}
    assert not set(sdk.__all__) & set(otel_train.__all__)


@pytest.mark.parametrize("name", sorted(sdk.__all__))
def test_an_old_top_level_name_still_resolves_with_a_deprecation_warning(name):
    with pytest.warns(DeprecationWarning, match=f"otel_train.sdk.{name}"):
        value = getattr(otel_train, name)
    assert value is getattr(sdk, name)


def test_the_public_names_resolve_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("start_run", "Run", "RunOptions", "Step"):
            getattr(otel_train, name)


def test_an_application_provider_with_the_sdk_processors_measures_the_overhead():
    """Spans from the application's own tracer, processors from otel_train.sdk: the
    overhead of a monitoring phase is measured as start_run would (times given, so the
    figure is exact: 2 ms of monitoring in 10 ms steps is 2 / 8 of training)."""
    from opentelemetry import trace

    overhead = sdk.OverheadSpanProcessor()
    provider = TracerProvider()
    provider.add_span_processor(sdk.SharedStepSpanProcessor([overhead]))
    tracer = provider.get_tracer("app")
    ms = 1_000_000
    t0 = time.time_ns()
    for i in range(5):
        start = t0 + i * 10 * ms
        root = tracer.start_span(A.STEP_SPAN_NAME, attributes={A.STEP: i}, start_time=start)
        ctx = trace.set_span_in_context(root)
        for name, kind, begin, end in (("forward", A.KIND_TRAIN, 0, 6),
                                       ("inference", A.KIND_MONITOR, 6, 8)):
            tracer.start_span(name, context=ctx, start_time=start + begin * ms, attributes={
                A.STEP: i, A.PHASE: name, A.PHASE_KIND: kind}).end(end_time=start + end * ms)
        root.end(end_time=start + 10 * ms)
    provider.shutdown()
    assert overhead.snapshot().steps == 5
    assert overhead.cumulative_ratio() == pytest.approx(0.25)
