"""otel-train's OpenTelemetry SDK span processors, for an application that wires them into a
``TracerProvider`` of its own instead of calling :func:`otel_train.start_run`.

``start_run`` builds and connects all of these itself; this namespace is for the other way:
the spans come from the application's own tracer (``train.step`` roots with phase children,
docs/telemetry.md), and the derived metrics are computed by processors it adds.

Usage::

    from opentelemetry.sdk.trace import TracerProvider
    from otel_train.sdk import OverheadSpanProcessor, SharedStepSpanProcessor

    overhead = OverheadSpanProcessor()
    provider = TracerProvider()
    provider.add_span_processor(SharedStepSpanProcessor([overhead]))

- :class:`SharedStepSpanProcessor` assembles each step once (a :class:`StepView`) and hands
  it, in order, to the processors below;
- :class:`SlowStepSpanProcessor`, :class:`OverheadSpanProcessor`,
  :class:`BudgetSpanProcessor`, :class:`PrometheusMetricsSpanProcessor`,
  :class:`ConsoleReportSpanProcessor`: the derived metrics (docs/architecture.md);
- :class:`BoundedBatchSpanProcessor` and :class:`JsonLinesSpanExporter`: the bounded export
  stage and the JSON-lines span exporter.
"""

from __future__ import annotations

from otel_train.derived.budget import BudgetSpanProcessor
from otel_train.derived.console import ConsoleReportSpanProcessor
from otel_train.derived.overhead import OverheadSpanProcessor
from otel_train.derived.prometheus_metrics import PrometheusMetricsSpanProcessor
from otel_train.derived.slow_steps import SlowStepSpanProcessor
from otel_train.export.stage import BoundedBatchSpanProcessor, JsonLinesSpanExporter
from otel_train.records.steps_view import SharedStepSpanProcessor, StepView

__all__ = [
    "BoundedBatchSpanProcessor",
    "BudgetSpanProcessor",
    "ConsoleReportSpanProcessor",
    "JsonLinesSpanExporter",
    "OverheadSpanProcessor",
    "PrometheusMetricsSpanProcessor",
    "SharedStepSpanProcessor",
    "SlowStepSpanProcessor",
    "StepView",
]
