"""otel-train: every PyTorch training step as an OpenTelemetry trace.

Usage::

    import otel_train

    with otel_train.start_run(service_name="tiny-gpt") as run:
        for step in run.steps(train_loader, loader="train"):
            with step.phase("forward"):
                ...
            if step.index % 200 == 0:
                with step.monitor("inference"):
                    ...
        print(run.costs())

``otel_train.instrument(model, optimizer)`` traces an unmodified loop through torch's own hooks;
Hugging Face and Lightning callbacks live in ``otel_train.integrations.hf`` / ``.lightning``.
"""

from __future__ import annotations

from typing import Any

from otel_train.derived.budget import BudgetSpanProcessor  # noqa: E402
from otel_train.derived.console import ConsoleReportSpanProcessor  # noqa: E402
from otel_train.export.stage import BoundedBatchSpanProcessor, JsonLinesSpanExporter  # noqa: E402
from otel_train.common.options import RunOptions  # noqa: E402
from otel_train.derived.overhead import OverheadSpanProcessor  # noqa: E402
from otel_train.derived.prometheus_metrics import PrometheusMetricsSpanProcessor  # noqa: E402
from otel_train.recording.recorder import MonitorRecord, Phase, Step  # noqa: E402
from otel_train.run import Run, start_run  # noqa: E402
from otel_train.derived.slow_steps import SlowStepSpanProcessor  # noqa: E402
from otel_train.records.steps_view import SharedStepSpanProcessor, StepView  # noqa: E402
from otel_train.version import __version__

__all__ = [
    "BoundedBatchSpanProcessor",
    "BudgetSpanProcessor",
    "ConsoleReportSpanProcessor",
    "Instrumentation",
    "JsonLinesSpanExporter",
    "MonitorRecord",
    "OverheadSpanProcessor",
    "Phase",
    "PrometheusMetricsSpanProcessor",
    "Run",
    "RunOptions",
    "SharedStepSpanProcessor",
    "SlowStepSpanProcessor",
    "Step",
    "StepView",
    "__version__",
    "instrument",
    "instrument_collectives",
    "instrument_ddp",
    "start_run",
]


def __getattr__(name: str) -> Any:
    # Lazy: the hook-based instrumentation imports torch; `import otel_train` should not.
    if name in ("instrument", "Instrumentation"):
        from otel_train.integrations import hooks

        return getattr(hooks, name)
    if name in ("instrument_ddp", "instrument_collectives"):
        from otel_train.integrations import comm

        return getattr(comm, name)
    raise AttributeError(f"module 'otel_train' has no attribute {name!r}")
