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
Hugging Face and Lightning callbacks live in ``otel_train.integrations.hf`` / ``.lightning``;
the SDK span processors, for an application's own TracerProvider, in ``otel_train.sdk``.
"""

from __future__ import annotations

import warnings
from typing import Any

from otel_train.common.options import RunOptions
from otel_train.recording.recorder import MonitorRecord, Phase, Step
from otel_train.run import Run, start_run
from otel_train.version import __version__

__all__ = [
    "Instrumentation",
    "MonitorRecord",
    "Phase",
    "Run",
    "RunOptions",
    "Step",
    "__version__",
    "instrument",
    "instrument_collectives",
    "instrument_ddp",
    "start_run",
]

# The SDK span processors live in otel_train.sdk; their old top-level names still resolve.
_SDK_NAMES = frozenset({
    "BoundedBatchSpanProcessor", "BudgetSpanProcessor", "ConsoleReportSpanProcessor",
    "JsonLinesSpanExporter", "OverheadSpanProcessor", "PrometheusMetricsSpanProcessor",
    "SharedStepSpanProcessor", "SlowStepSpanProcessor", "StepView",
})


def __getattr__(name: str) -> Any:
    # Lazy: the hook-based instrumentation imports torch; `import otel_train` should not.
    if name in ("instrument", "Instrumentation"):
        from otel_train.integrations import hooks

        return getattr(hooks, name)
    if name in ("instrument_ddp", "instrument_collectives"):
        from otel_train.integrations import comm

        return getattr(comm, name)
    if name in _SDK_NAMES:
        from otel_train import sdk

        warnings.warn(f"otel_train.{name} moved to otel_train.sdk.{name}", DeprecationWarning,
                      stacklevel=2)
        return getattr(sdk, name)
    raise AttributeError(f"module 'otel_train' has no attribute {name!r}")
