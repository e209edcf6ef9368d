"""The run's start-up banner: who it is, where its spans and metrics go, how it times steps.

Made by the assembly with what is known before anything starts (the identity, the device
timing, the report) and shown by the telemetry once it has started, when the metrics
endpoint's address is known: on stderr with the console on (next to the script's output),
else at INFO on the ``otel_train`` logger.

Usage::

    banner = RunBanner(identity, device.describe(), console=True, report_dir=None)
    banner.writes_report(plan.export)      # report.html at shutdown?
    banner.show(banner.lines(plan.export, "http://127.0.0.1:9464", scale_out=""))
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path

from otel_train.common.identity import RunIdentity
from otel_train.common.sdk_config import ExportPlan

__all__ = ["RunBanner", "disabled_banner"]

_log = logging.getLogger("otel_train")


@dataclass(frozen=True)
class RunBanner:
    """What the banner says that the assembly knows; ``lines`` adds what starting tells."""

    identity: RunIdentity
    timing: str  # the device timing in words (DeviceTiming.describe)
    console: bool  # stderr (True) or the log (False)
    # The run directory whose report.html is written at shutdown when its spans go to files
    # there (option report, else the console; rank 0); None: no report.
    report_dir: Path | None = None

    def writes_report(self, export_plan: ExportPlan) -> bool:
        """report.html at shutdown: asked for, and the spans go to the run directory."""
        return self.report_dir is not None and export_plan.kind == "jsonl"

    def lines(self, export_plan: ExportPlan, prometheus_url: str | None,
              scale_out: str) -> list[str]:
        """The banner's lines: run, spans, metrics, timing, then metrics over OTLP and
        sampling (``scale_out``, '' when neither is on) and the report."""
        ident = self.identity
        lines = [
            f"otel-train: run {ident.run_id} rank {ident.rank}/{ident.world_size}",
            f"  spans   -> {export_plan.describe()}",
            f"  metrics -> {prometheus_url + '/metrics' if prometheus_url else 'off'}",
            f"  timing  -> {self.timing}",
        ]
        if scale_out:
            lines.append(scale_out)
        if self.report_dir is not None and self.writes_report(export_plan):
            from otel_train.rundir.report import shutdown_banner_line
            lines.append(shutdown_banner_line(self.report_dir))
        return lines

    def show(self, lines: list[str]) -> None:
        """Print the lines (console) or log them."""
        _show("\n".join(lines), self.console)


def disabled_banner(reason: str, console: bool) -> None:
    """The banner of a run that records nothing, and why."""
    _show(f"otel-train: disabled by {reason}: steps run untraced; no spans, metrics, threads "
          "or files", console)


def _show(text: str, console: bool) -> None:
    if console:
        print(text, file=sys.stderr, flush=True)
    else:
        _log.info(text)
