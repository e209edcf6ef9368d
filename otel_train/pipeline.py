"""Derived-metrics pipeline: the span processors that see every step before export.

(Interim: the metrics issue replaces this with overhead, budget, slow-step, console and
Prometheus processors behind the same interface.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import SpanProcessor

from otel_train.accounting import DropCounter, SelfCostMeter
from otel_train.identity import RunIdentity
from otel_train.options import RunOptions
from otel_train.recorder import Recorder


class DerivedPipeline:
    """Builds, starts and stops the derived-metrics processors of one run."""

    def __init__(self, options: RunOptions, identity: RunIdentity, status_dir: Path,
                 recorder: Recorder, drops: DropCounter, self_cost: SelfCostMeter) -> None:
        self.processors: list[SpanProcessor] = []
        self.prometheus_url: str | None = None

    def start(self) -> None:
        """Start servers and threads."""

    def costs(self) -> dict[str, Any]:
        """What monitoring cost so far."""
        return {}

    def shutdown(self, timeout_seconds: float) -> None:
        """Stop servers and threads."""
