"""``otel-train plan``: what a run started here would do, before it runs.

Options come from the flags, then ``OTEL_TRAIN_*``, then the defaults; the environment is
this process's (``OTEL_*`` variables, the global TracerProvider, nothing installed). Prints
``pipeline.plan.PipelinePlan.describe()``: the route, the export target, where the derived
metrics run, sampling, and why; then the device timing ``device_sync`` resolves to here
(``monitor_sync`` on an accelerator by default, the host clock on CPU) and why.

Usage::

    otel-train plan --exporter otlp --otlp-endpoint http://collector:4318 --sample-ratio 0.1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

# (flag, option, type or None for a boolean, help)
_FLAGS: tuple[tuple[str, str, Any, str], ...] = (
    ("--exporter", "exporter", str, "span exporter: auto, otlp, jsonl, console or none"),
    ("--otlp-endpoint", "otlp_endpoint", str, "OTLP endpoint (else OTEL_EXPORTER_OTLP_*)"),
    ("--otlp-protocol", "otlp_protocol", str, "OTLP protocol: grpc or http/protobuf"),
    ("--spans-path", "spans_path", str, "the span file's path (exporter jsonl)"),
    ("--status-dir", "status_dir", str, "the run's status directory"),
    ("--run-id", "run_id", str, "the run id (else generated, or from the environment)"),
    ("--sample-ratio", "sample_ratio", float, "share of ordinary steps to export (0..1)"),
    ("--metrics-exporter", "metrics_exporter", str,
     "derived metrics: prometheus, otlp, none, or a comma-separated list"),
    ("--trace-export", "trace_export", str,
     "with an application's provider: own (our stage, its endpoint) or application"),
    ("--export-process", "export_process", None,
     "export from a child process (--no-export-process: from the training process)"),
    ("--metrics-in-export-process", "metrics_in_export_process", None,
     "run the derived metrics in the exporter process too"),
    ("--console", "console", None, "the console report"),
    ("--device-sync", "device_sync", str,
     "device timing: auto, monitor_sync, sync, events or off"),
    ("--enabled", "enabled", None, "record at all (--no-enabled: a disabled run)"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The plan command's flags, one per option it depends on."""
    for flag, dest, kind, text in _FLAGS:
        if kind is None:
            parser.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction,
                                default=None, help=text)
        else:
            parser.add_argument(flag, dest=dest, type=kind, default=None, help=text)


def print_plan(args: argparse.Namespace) -> int:
    """Print the plan of a run started with these flags in this environment."""
    from otel_train.common.identity import resolve_identity
    from otel_train.common.options import RunOptions
    from otel_train.pipeline.environment import current_provider_mode, gather_environment
    from otel_train.pipeline.plan import plan_pipeline

    given = {dest: getattr(args, dest) for _, dest, _, _ in _FLAGS
             if getattr(args, dest) is not None}
    try:
        options = RunOptions.resolve(**given)
    except ValueError as exc:
        print(f"otel-train plan: {exc}", file=sys.stderr)
        return 2
    identity = resolve_identity(options.run_id, options.rank, options.world_size,
                                options.local_rank)
    # A run id drawn here would not be the run's (each run draws its own as it starts):
    # the paths show where it goes instead.
    drawn = identity.run_id_source == "generated"
    run_dir = Path("otel-train-runs") / (RUN_ID_PLACEHOLDER if drawn else identity.run_id)
    status_dir = Path(options.status_dir or run_dir)
    mode, provider = current_provider_mode()
    environment, _ = gather_environment(options, mode, provider, status_dir, identity.rank,
                                        identity.world_size, local_rank=identity.local_rank)
    text = plan_pipeline(options, environment).describe()
    if RUN_ID_PLACEHOLDER in text:
        text += (f"\n{RUN_ID_PLACEHOLDER}: drawn as the run starts (date-time-random, "
                 "20261128-073742-f7ee7a); --run-id or OTEL_TRAIN_RUN_ID sets it")
    print(text)
    print(f"timing: {device_timing_line(options)}")
    return 0


RUN_ID_PLACEHOLDER = "<run id>"


def device_timing_line(options: Any) -> str:
    """What ``device_sync`` resolves to on this machine, and why (the banner's timing line)."""
    import dataclasses

    from otel_train.recording.device import resolve_device_timing
    from otel_train.recording.device_probes import resolve_device_probes

    if not options.enabled:
        return "none (a disabled run records nothing)"
    timing = resolve_device_timing(options.device_sync)
    probes = resolve_device_probes(timing.make_event, timing.device_type,
                                   options.device_events_every_steps, options.memory_peaks,
                                   host_clock_only=options.device_sync == "off")
    return dataclasses.replace(timing, probes=probes).describe()
