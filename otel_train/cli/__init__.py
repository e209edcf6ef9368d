"""The ``otel-train`` command: demo, plan, costs, report, export, version."""

from __future__ import annotations

from otel_train.cli.main import main

__all__ = ["main"]
