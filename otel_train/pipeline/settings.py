"""Options resolved once into each part's settings: the one place ``RunOptions`` is read.

``RunOptions`` (common/options.py) holds what the user said; every part of a run below
``pipeline/`` takes only its own small settings, made here from the options (and the
environment, where an ``OTEL_*`` variable decides): the derived-metrics chain (plain data: it
crosses the pipe to the exporter process), the tail sampler's part of it, the console's
time floor, where the metrics go, the derived-metrics stage's threads and endpoint, the batch
counter, and whether a report is written. No module in ``recording/``, ``records/``,
``derived/``, ``export/`` or ``rundir/`` imports ``RunOptions`` (tests/test_package_layers.py).

Usage::

    settings = derived_settings(options, identity)    # DerivedSettings for DerivedMetricsStage
    counts = count_settings(options)                  # CountSettings for BatchCounter.for_run
    plan = plan_metrics(options)                      # MetricsPlan(prometheus=True, otlp=...)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from otel_train.common import attributes as A
from otel_train.common.export_ranks import ExportRanks, resolve_export_ranks, routine_export
from otel_train.common.identity import RunIdentity
from otel_train.common.options import RunOptions
from otel_train.common.rate_limited_log import warn_once
from otel_train.common.sdk_config import sdk_disabled
from otel_train.derived.otlp_metrics import MetricsPlan
from otel_train.derived.stage import DerivedSettings
from otel_train.recording.step_counts import CountSettings

__all__ = [
    "at_scale_banner",
    "chain_settings",
    "count_settings",
    "derived_settings",
    "fast_log_min_interval_seconds",
    "plan_metrics",
    "report_enabled",
    "resolve_sample_ratio",
    "sampling_settings",
]


def derived_settings(options: RunOptions, identity: RunIdentity,
                     env: Mapping[str, str] | None = None) -> DerivedSettings:
    """What ``DerivedMetricsStage`` is built from: the chain's settings, where the metrics
    go, its threads' intervals and its endpoint. Each option is read once, here."""
    ratio = resolve_sample_ratio(options, env)
    metrics = plan_metrics(options, env)
    min_interval_seconds = fast_log_min_interval_seconds(options)
    routine, summary = routine_export(options, identity.rank, identity.world_size,
                                      identity.local_rank)
    ranks = resolve_export_ranks(options.export_ranks, identity.world_size)
    return DerivedSettings(
        chain=_chain(options, identity, min_interval_seconds,
                     _sampling(options, ratio, routine, summary)),
        metrics=metrics, service_name=options.service_name,
        at_scale_lines=tuple(_at_scale_lines(options, ranks, routine, summary)),
        console=bool(options.console),
        budget=options.budget, critical=options.critical,
        budget_action=options.budget_action,
        watchdog_interval_seconds=options.watchdog_interval_seconds,
        stall_seconds=options.stall_seconds, stall_min_seconds=options.stall_min_seconds,
        slow_operation_seconds=options.slow_operation_seconds,
        stall_stacks=options.stall_stacks, stall_stacks_signal=options.stall_stacks_signal,
        gpu_sample_interval_seconds=options.gpu_sample_interval_seconds,
        costs_interval_seconds=options.costs_interval_seconds,
        prometheus_host=options.prometheus_host, prometheus_port=options.prometheus_port,
        prometheus_port_source=options.where("prometheus_port"),
        prometheus_host_source=options.where("prometheus_host"))


def count_settings(options: RunOptions) -> CountSettings:
    """What ``BatchCounter`` counts per batch: the throughput options."""
    return CountSettings(options.tokens_per_step, options.samples_per_step,
                         options.count_flops,
                         find_peak=(options.flops_per_step is not None
                                    and options.peak_flops_per_second is None))


def report_enabled(options: RunOptions) -> bool:
    """Whether a run writes its report at shutdown: option ``report``, else the console's."""
    wanted = options.report if options.report is not None else options.console
    return bool(wanted)


def chain_settings(options: RunOptions, identity: RunIdentity) -> dict[str, Any]:
    """What the chain is built from, as plain data (it goes to the exporter process)."""
    return _chain(options, identity, fast_log_min_interval_seconds(options),
                  sampling_settings(options, identity))


def _chain(options: RunOptions, identity: RunIdentity, min_interval_seconds: float,
           sampling: dict[str, Any]) -> dict[str, Any]:
    return {
        "rank": identity.rank, "run_id": identity.run_id, "world_size": identity.world_size,
        "window": options.recent_window_steps, "warmup": options.warmup_steps,
        "slow_step_factor": options.slow_step_factor,
        "slow_step_seconds": options.slow_step_seconds,
        "budget": options.budget, "critical": options.critical,
        "slow_operation_seconds": options.slow_operation_seconds,
        "console": bool(options.console), "log_every": options.log_every,
        "console_breakdown_min_share": options.console_breakdown_min_share,
        "eval_operations": list(options.eval_operations),
        "console_min_interval_seconds": min_interval_seconds,
        # Tail sampling, export_ranks, summary mode; decided after these processors.
        **sampling,
        "metrics_rank_label": options.metrics_rank_label,
        # Throughput (derived/throughput.py): ints only, a callable is counted per batch.
        "throughput": {k: v if isinstance(v, (int, float)) else None for k, v in (
            ("tokens_per_step", options.tokens_per_step),
            ("samples_per_step", options.samples_per_step),
            ("flops_per_step", options.flops_per_step),
            ("peak_flops_per_second", options.peak_flops_per_second))},
    }


def fast_log_min_interval_seconds(options: RunOptions) -> float:
    """The fast log's time floor: only for a ``log_every`` left at its default.

    An explicit ``log_every`` (argument or ``OTEL_TRAIN_LOG_EVERY``) is what the user asked
    to read: no floor, unless ``console_min_interval_seconds`` was set explicitly too.
    """
    if "log_every" in options.sources and "console_min_interval_seconds" not in options.sources:
        return 0.0
    return options.console_min_interval_seconds


def resolve_sample_ratio(options: RunOptions,
                         env: Mapping[str, str] | None = None) -> float | None:
    """The share of ordinary steps to keep; None: no sampling (keep everything).

    The ``sample_ratio`` option wins; else ``OTEL_TRACES_SAMPLER=traceidratio`` or
    ``parentbased_traceidratio`` with ``OTEL_TRACES_SAMPLER_ARG`` (SDK semantics: a bad or
    missing argument means 1.0). ``always_off`` keeps its SDK meaning (nothing exported): it
    is left to the SDK sampler, not turned into a ratio.
    """
    if options.sample_ratio is not None:
        return None if options.sample_ratio >= 1.0 else float(options.sample_ratio)
    env = os.environ if env is None else env
    name = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if name not in ("traceidratio", "parentbased_traceidratio"):
        return None
    raw = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    try:
        ratio = float(raw)
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(raw)
    except ValueError:
        warn_once("OTEL_TRACES_SAMPLER_ARG", "otel-train: OTEL_TRACES_SAMPLER_ARG=%r is not a "
                  "ratio from 0 to 1; keeping every step", raw)
        return None
    return None if ratio >= 1.0 else ratio


def sampling_settings(options: RunOptions, identity: Any) -> dict[str, Any]:
    """The sampler's part of the chain's settings (plain data: it crosses the pipe)."""
    routine, summary = routine_export(options, identity.rank, identity.world_size,
                                      identity.local_rank)
    return _sampling(options, resolve_sample_ratio(options), routine, summary)


def _sampling(options: RunOptions, ratio: float | None, routine: bool,
              summary: bool) -> dict[str, Any]:
    return {"sample_ratio": ratio,
            "sample_keep_first_steps": options.sample_keep_first_steps,
            "export_routine": routine, "summary": summary and routine,
            "summary_every_steps": options.summary_every_steps,
            "summary_every_seconds": options.summary_every_seconds}


def at_scale_banner(options: RunOptions, identity: Any) -> list[str]:
    """Start-up lines for export_ranks and summary mode ([] when every rank sends steps)."""
    routine, summary = routine_export(options, identity.rank, identity.world_size,
                                      identity.local_rank)
    return _at_scale_lines(options, resolve_export_ranks(options.export_ranks,
                                                         identity.world_size),
                           routine, summary)


def _at_scale_lines(options: RunOptions, choice: ExportRanks, routine: bool,
                    summary: bool) -> list[str]:
    if choice.kind == "all" and not summary:
        return []
    if not routine:
        what = "only slow, failed, stalled and truncated steps (metrics: every step)"
    elif summary:
        what = (f"one {A.SUMMARY_SPAN_NAME} span per {options.summary_every_steps} steps or "
                f"{options.summary_every_seconds:g} s, plus slow, failed, stalled and "
                "truncated steps")
    else:
        what = "every step"
    return [f"  ranks   -> export_ranks={choice.describe()}: this rank exports {what}"]


def plan_metrics(options: RunOptions, env: Mapping[str, str] | None = None) -> MetricsPlan:
    """Decide from ``metrics_exporter`` (or ``OTEL_METRICS_EXPORTER``) and the OTLP settings.

    ``prometheus`` (the default) serves the endpoint; ``otlp`` pushes, and then the endpoint
    is served only when ``prometheus_port`` was given explicitly; ``prometheus,otlp`` both.
    """
    env = os.environ if env is None else env
    raw = options.metrics_exporter
    source = options.where("metrics_exporter")
    if raw is None:
        raw = env.get("OTEL_METRICS_EXPORTER", "").strip().lower()
        source = "OTEL_METRICS_EXPORTER"
    names = {n.strip() for n in (raw or "").split(",") if n.strip()}
    unknown = names - {"otlp", "prometheus", "none", "console"}
    if unknown:
        if source == "OTEL_METRICS_EXPORTER":
            warn_once("OTEL_METRICS_EXPORTER", "otel-train: OTEL_METRICS_EXPORTER=%r: "
                      "only otlp, prometheus and none are used; ignoring %s", raw,
                      sorted(unknown))
        names -= unknown
    if not names:
        names = {"prometheus"}
    otlp = "otlp" in names and not sdk_disabled(env)
    explicit_port = "prometheus_port" in options.sources
    prometheus = "prometheus" in names or explicit_port
    if options.prometheus_port is None:
        prometheus = False
    if not otlp:
        return MetricsPlan(prometheus, False)
    protocol = _metrics_protocol(options, env)
    endpoint = None
    if not env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") and options.otlp_endpoint:
        endpoint = options.otlp_endpoint
        if protocol == "http/protobuf":
            endpoint = endpoint.rstrip("/")
            if not endpoint.endswith("/v1/metrics"):
                endpoint += "/v1/metrics"
    return MetricsPlan(prometheus, True, protocol, endpoint)


def _metrics_protocol(options: RunOptions, env: Mapping[str, str]) -> str:
    raw = env.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "").strip()
    if not raw:
        if options.otlp_protocol:
            return options.otlp_protocol
        raw = env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip()
    if raw in ("grpc", "http/protobuf"):
        return raw
    if raw:
        warn_once("metrics-protocol", "otel-train: OTLP metrics protocol %r is not supported "
                  "(grpc, http/protobuf); using http/protobuf", raw)
    return "http/protobuf"
