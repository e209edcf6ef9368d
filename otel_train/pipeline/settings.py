"""Options resolved once into each part's settings: the one place ``RunOptions`` is read.

``RunOptions`` (common/options.py) holds what the user said; every part of a run below
``pipeline/`` takes only its own small settings, made here from the options (and the
environment, where an ``OTEL_*`` variable decides): the derived-metrics chain (plain data: it
crosses the pipe to the exporter process), the tail sampler's part of it, the console's
time floor, where the metrics go, the derived-metrics stage's threads and endpoint, the batch
counter, and whether a report is written. No module in ``recording/``, ``records/``,
``derived/``, ``export/`` or ``rundir/`` imports ``RunOptions`` (tests/test_package_layers.py).

Usage::

    plan = plan_pipeline(options, environment)        # plan.py: the route, sampling, metrics
    settings = derived_settings(options, identity, plan)  # DerivedSettings for the stage
    counts = count_settings(options)                  # CountSettings for BatchCounter.for_run
"""

from __future__ import annotations

from typing import Any

from otel_train.common import attributes as A
from otel_train.common.export_ranks import ExportRanks, resolve_export_ranks, routine_export
from otel_train.common.identity import RunIdentity
from otel_train.common.options import RunOptions
from otel_train.derived.stage import DerivedSettings
from otel_train.pipeline.plan import PipelinePlan, resolve_sample_ratio
from otel_train.recording.step_counts import CountSettings

__all__ = [
    "at_scale_banner",
    "chain_settings",
    "count_settings",
    "derived_settings",
    "fast_log_min_interval_seconds",
    "report_enabled",
    "sampling_settings",
]


def derived_settings(options: RunOptions, identity: RunIdentity,
                     plan: PipelinePlan) -> DerivedSettings:
    """What ``DerivedMetricsStage`` is built from: the chain's settings, where the metrics
    go, its threads' intervals and its endpoint; the sampling and metrics decisions are the
    plan's (``plan_pipeline``), not made again."""
    routine, summary = plan.export_routine, plan.export_summary
    return DerivedSettings(
        chain=_chain(options, identity, fast_log_min_interval_seconds(options),
                     _sampling(options, plan.sample_ratio, routine, summary)),
        metrics=plan.metrics,
        at_scale_lines=tuple(_at_scale_lines(options, plan.export_ranks, routine, summary)),
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
