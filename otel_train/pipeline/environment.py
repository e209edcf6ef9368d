"""Gathering what the pipeline plan depends on, once, as plain data (``plan.PipelineEnvironment``).

The global TracerProvider's mode, the application's OTLP span exporter (where it sends), the
SDK sampler in effect and the ``OTEL_*`` / ``OTEL_TRAIN_*`` variables. ``assembly.py`` gathers
them for a run (installing otel-train's provider when the application has none);
``otel-train plan`` gathers them for the current process without installing anything.

Usage::

    mode, provider = global_provider_for_run()
    environment, sampler = gather_environment(options, mode, provider, status_dir, rank, size)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler

from otel_train.common import sdk_private
from otel_train.common.options import RunOptions
from otel_train.common.sdk_config import build_sampler, sdk_disabled
from otel_train.pipeline.application_export import application_otlp_exporter
from otel_train.pipeline.global_provider import RunScopedTracerProvider
from otel_train.pipeline.plan import (
    MODE_APP,
    MODE_DISABLED,
    MODE_FOREIGN,
    MODE_OURS,
    PipelineEnvironment,
)

_ENV_PREFIXES = ("OTEL_",)  # OTEL_TRAIN_* options are already in RunOptions


def disabled_reason(options: RunOptions, env: Mapping[str, str] | None = None) -> str | None:
    """Why this run records nothing (``enabled=False`` or ``OTEL_SDK_DISABLED``), or None."""
    if not options.enabled:
        return options.where("enabled") + "=False"
    if sdk_disabled(env):
        return "OTEL_SDK_DISABLED=true"
    return None


def gather_environment(options: RunOptions, provider_mode: str, provider: Any,
                       status_dir: Path, rank: int, world_size: int,
                       environ: Mapping[str, str] | None = None, local_rank: int = 0
                       ) -> tuple[PipelineEnvironment, Sampler]:
    """The plan's environment for a run, and the SDK sampler in effect (the application's
    provider's, else the one ``OTEL_TRACES_SAMPLER`` describes)."""
    environ = os.environ if environ is None else environ
    sampler: Sampler = provider.sampler if provider_mode == MODE_APP else build_sampler()
    disabled = disabled_reason(options, environ)
    environment = PipelineEnvironment(
        provider_mode=MODE_DISABLED if disabled else provider_mode, disabled_by=disabled,
        app_exporter=(application_exporter_target(provider) if provider_mode == MODE_APP
                      else None),
        sampler=describe_sampler(sampler), sampler_always_samples=always_samples(sampler),
        env={k: v for k, v in environ.items() if k.startswith(_ENV_PREFIXES)},
        status_dir=Path(status_dir), rank=rank, world_size=world_size,
        local_rank=local_rank)
    return environment, sampler


def current_provider_mode() -> tuple[str, Any]:
    """The provider mode a run started now would have, installing nothing."""
    current = trace_api.get_tracer_provider()
    if isinstance(current, (RunScopedTracerProvider, trace_api.ProxyTracerProvider)):
        return MODE_OURS, current
    if isinstance(current, TracerProvider):
        return MODE_APP, current
    return MODE_FOREIGN, current


def application_exporter_target(provider: Any) -> str | None:
    """Where the application's OTLP span exporter sends, when its settings can be read."""
    app = application_otlp_exporter(provider)
    try:
        endpoint = sdk_private.otlp_endpoint(app) if app is not None else None
    except sdk_private.SdkPrivateMismatch:  # said where the export is built (application_export)
        return None
    if not endpoint:
        return None
    protocol = "grpc" if ".grpc." in type(app).__module__ else "http/protobuf"
    return f"OTLP {protocol} -> {endpoint} (the application's exporter)"


def always_samples(sampler: Sampler) -> bool:
    """Does ``sampler`` keep every trace (ALWAYS_ON, or parent-based on it)?"""
    return sampler is ALWAYS_ON or (isinstance(sampler, ParentBased)
                                    and sdk_private.parent_based_root(sampler) is ALWAYS_ON)


def describe_sampler(sampler: Sampler) -> str:
    """The sampler as words (the SDK's description)."""
    try:
        return str(sampler.get_description())
    except Exception:
        return type(sampler).__name__


def sampling_function(sampler: Sampler) -> Callable[[int], bool]:
    """trace id -> sampled? Constant when the sampler always samples (the usual case)."""
    if always_samples(sampler):
        return _always_sampled

    def is_sampled(trace_id: int) -> bool:
        try:
            return sampler.should_sample(None, trace_id, "train.step").decision.is_sampled()
        except Exception:
            return True
    return is_sampled


def _always_sampled(trace_id: int) -> bool:
    """Every step is sampled (ALWAYS_ON, or parent-based on it)."""
    return True
