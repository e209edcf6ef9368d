"""otel-train: every PyTorch training step as an OpenTelemetry trace.

Usage::

    import otel_train

    with otel_train.start_run(service_name="tiny-gpt") as run:
        for step in run.steps(loader_, loader="train"):
            with step.phase("forward"):
                ...
"""

from __future__ import annotations

__version__ = "0.1.0"

from otel_train.options import RunOptions  # noqa: E402
from otel_train.recorder import MonitorRecord, Phase, Step  # noqa: E402
from otel_train.run import Run, start_run  # noqa: E402

__all__ = [
    "MonitorRecord",
    "Phase",
    "Run",
    "RunOptions",
    "Step",
    "__version__",
    "start_run",
]
