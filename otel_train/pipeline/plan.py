"""The pipeline plan: which route a run's spans take, where its derived metrics run, and why.

``plan_pipeline(options, environment)`` is a pure function of the run's options and a
:class:`PipelineEnvironment`, plain data gathered once (``gather_environment``: the global
TracerProvider's mode, the application's OTLP exporter, the SDK sampler, the ``OTEL_*``
variables). ``assembly.assemble_telemetry`` builds what the plan says and decides nothing;
``otel-train plan`` prints it before a run.

Routes (``PipelinePlan.route``):

- ``exporter process``: span records go down a pipe to a child process that encodes and
  exports them (``export/process``); the derived metrics run there too unless something keeps
  them here; if the child cannot start, the in-process stage takes over (the plan for that,
  ``PipelinePlan.if_process_fails``, is made with this one);
- ``in-process stage``: the same records, exported by ``BoundedBatchSpanProcessor`` from this
  process (``export_process=False``, the console exporter, the application's OTLP endpoint);
- ``application processors``: the spans join the application's own TracerProvider pipeline
  (``application_export.ApplicationProviderSink``, where records become SDK spans);
- ``none``: nothing is exported (the metrics still see every step), or the run is disabled.

Usage::

    environment = gather_environment(options, status_dir, identity.rank, identity.world_size)
    plan = plan_pipeline(options, environment)
    print(plan.describe())
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from otel_train.common.export_ranks import ExportRanks, resolve_export_ranks, routine_export
from otel_train.common.options import RunOptions
from otel_train.common.sdk_config import ExportPlan, plan_export, sdk_disabled
from otel_train.derived.otlp_metrics import MetricsPlan
from otel_train.common.rate_limited_log import warn_once

# Provider modes.
MODE_OURS = "ours"  # otel-train's RunScopedTracerProvider is the global provider
MODE_APP = "app"  # the application installed an SDK TracerProvider
MODE_FOREIGN = "foreign"  # some other API-level provider: left alone, we export on our own
MODE_DISABLED = "disabled"  # enabled=False or OTEL_SDK_DISABLED
# Routes.
ROUTE_PROCESS = "exporter process"
ROUTE_STAGE = "in-process stage"
ROUTE_APPLICATION = "application processors"
ROUTE_NONE = "none"
# Where the derived metrics run.
HERE = "training process"
THERE = "exporter process"
# Who reads the step ring (step_ring="on", or "auto" where the exporter process reads it).
RING_IN_EXPORTER = "exporter process"
RING_IN_WORKER = "span worker"
_PROCESS_KINDS = ("otlp", "jsonl")  # exporters the exporter process makes from the plan


@dataclass(frozen=True)
class PipelineEnvironment:
    """What the plan depends on besides the options: plain data, gathered once."""

    provider_mode: str = MODE_OURS
    disabled_by: str | None = None  # why nothing is recorded (enabled=False, OTEL_SDK_DISABLED)
    # Where the application's OTLP span exporter sends ("OTLP grpc -> host:4317"), when its
    # provider has one whose settings can be read; None otherwise.
    app_exporter: str | None = None
    sampler: str = "parentbased_always_on"  # the SDK sampler in effect, as words
    sampler_always_samples: bool = True
    env: Mapping[str, str] = field(default_factory=dict)  # the OTEL_* variables
    status_dir: Path = Path("otel-train-runs")
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    process_failed: bool = False  # plan for an exporter process that could not start


@dataclass(frozen=True)
class PipelinePlan:
    """What a run builds between its recorder and the wire, and the reasons."""

    route: str
    export: ExportPlan
    provider_mode: str
    metrics_where: str | None  # HERE, THERE, or None (a disabled run)
    # The step tail sampler decides what is exported; the SDK sampler then follows its
    # parent (always on), so every step reaches the decision.
    tail_sampler: bool
    otlp_metrics: bool
    console: bool
    joins_application: bool  # the application's processors get our spans too
    app_exporter: bool  # the in-process stage sends where the application's exporter does
    user_spans: str  # what happens to spans users open with the OTel API
    reasons: tuple[str, ...]
    # What the derived-metrics settings are made from (settings.py ``derived_settings``).
    sample_ratio: float | None = None  # None: no ratio (every ordinary step)
    metrics: MetricsPlan = MetricsPlan(False, False)
    export_routine: bool = True  # this rank exports its ordinary steps (export_ranks)
    export_summary: bool = False  # ... as summaries (span_mode="summary")
    export_ranks: ExportRanks = ExportRanks("all")
    # The plans to build instead, made with this one: when the exporter process cannot
    # start (route exporter process), and when the application's exporter settings, read
    # for the plan, cannot be read again as the stage is built (app_exporter).
    step_ring: str | None = None  # who reads the step ring (RING_IN_*); None: step_ring off
    if_process_fails: PipelinePlan | None = None
    if_app_exporter_unreadable: PipelinePlan | None = None

    def without_app_exporter(self) -> PipelinePlan:
        """The plan after the application's exporter settings could not be read again."""
        if self.if_app_exporter_unreadable is None:
            raise ValueError("the plan does not use the application's exporter settings")
        return self.if_app_exporter_unreadable

    def describe(self) -> str:
        """The plan as lines for a person: the decisions, then why."""
        lines = [f"route: {self.route}", f"export: {self.export.describe()}",
                 f"tracer provider: {_PROVIDER_WORDS.get(self.provider_mode, self.provider_mode)}",
                 f"derived metrics: {self.metrics_where or 'off'}",
                 f"tail sampling: {'on' if self.tail_sampler else 'off'}",
                 f"metrics over OTLP: {'on' if self.otlp_metrics else 'off'}",
                 f"console: {'on' if self.console else 'off'}",
                 f"user spans: {self.user_spans}", "why:"]
        lines += [f"  - {reason}" for reason in self.reasons]
        return "\n".join(lines)


def plan_pipeline(options: RunOptions, environment: PipelineEnvironment) -> PipelinePlan:
    """Decide the route, the metrics' place, the processors and the export target."""
    env = environment
    if env.disabled_by is not None:
        return _disabled_plan(env)
    reasons: list[str] = []
    # What the options and the environment say, resolved first; then the decisions.
    ratio = resolve_sample_ratio(options, env.env)
    metrics = plan_metrics(options, env.env)
    otlp_metrics = metrics.otlp
    routine, summary = routine_export(options, env.rank, env.world_size, env.local_rank)
    ranks = resolve_export_ranks(options.export_ranks, env.world_size)
    target = plan_export(options, env.status_dir, env.rank, env.world_size, env.env)
    export, own, joins_app, app_exporter = _export_target(options, env, target, reasons)
    route = _route(options, env, export, own, joins_app, reasons)
    tail = ((ratio is not None or not routine or summary)
            and route in (ROUTE_PROCESS, ROUTE_STAGE))
    _sampling_reasons(ratio, route, tail, env, reasons)
    _export_ranks_reasons(options, env, ranks, routine, summary, reasons)
    where = _metrics_where(options, env, route, otlp_metrics, tail, joins_app, reasons)
    ring = _step_ring_reader(options.step_ring, route, where, reasons)
    reasons.append("console report: " + ("on (console=True)" if options.console
                                         else "off (console=False)"))
    reasons.append("metrics over OTLP: " + ("on (metrics_exporter / OTEL_METRICS_EXPORTER "
                                            "names otlp)" if otlp_metrics else "off"))
    if_fails = (plan_pipeline(options, dataclasses.replace(env, process_failed=True))
                if route == ROUTE_PROCESS else None)
    if_unreadable = (plan_pipeline(options, dataclasses.replace(env, app_exporter=None))
                     if app_exporter else None)
    return PipelinePlan(
        route=route, export=export, provider_mode=env.provider_mode, metrics_where=where,
        tail_sampler=tail, otlp_metrics=otlp_metrics,
        console=options.console, joins_application=joins_app, app_exporter=app_exporter,
        user_spans=_user_spans(env.provider_mode, route, joins_app), reasons=tuple(reasons),
        sample_ratio=ratio, metrics=metrics, export_routine=routine, export_summary=summary,
        step_ring=ring,
        export_ranks=ranks, if_process_fails=if_fails, if_app_exporter_unreadable=if_unreadable)


def _disabled_plan(env: PipelineEnvironment) -> PipelinePlan:
    return PipelinePlan(
        route=ROUTE_NONE, export=ExportPlan("none"), provider_mode=MODE_DISABLED,
        metrics_where=None, tail_sampler=False,
        otlp_metrics=False, console=False, joins_application=False, app_exporter=False,
        user_spans="not recorded",
        reasons=(f"disabled by {env.disabled_by}: no thread, socket or file; the API still "
                 "works",))


def _export_target(options: RunOptions, env: PipelineEnvironment, plan: ExportPlan,
                   reasons: list[str]) -> tuple[ExportPlan, bool, bool, bool]:
    """(export plan, made from the plan?, joins the application?, the app's endpoint?)."""
    if env.provider_mode != MODE_APP:
        reasons.append(f"export target: {plan.describe()} (exporter option / "
                       "OTEL_TRACES_EXPORTER / OTLP endpoint; a span file when none is set)")
        return plan, True, False, False
    if "exporter" in options.sources:
        reasons.append(f"export target: {plan.describe()} (the exporter option, set "
                       "explicitly); the application's TracerProvider gets the spans too")
        return plan, True, True, False
    if options.trace_export == "own" and env.app_exporter is not None:
        reasons.append(f"export target: {env.app_exporter}: the application's OTLP exporter's "
                       "endpoint, through otel-train's bounded export stage "
                       "(trace_export='own')")
        return ExportPlan(env.app_exporter), False, False, True
    why = ("trace_export='application'" if options.trace_export != "own"
           else "no OTLP span exporter of the application's could be reused")
    reasons.append(f"export target: the application's TracerProvider pipeline ({why})")
    return ExportPlan("application TracerProvider"), False, True, False


def _route(options: RunOptions, env: PipelineEnvironment, export: ExportPlan, own: bool,
           joins_app: bool, reasons: list[str]) -> str:
    if own and export.kind == "none":
        reasons.append("route: none (the exporter is 'none'; the metrics still see every "
                       "step)")
        return ROUTE_APPLICATION if joins_app else ROUTE_NONE
    if not own:
        route = ROUTE_STAGE if not joins_app else ROUTE_APPLICATION
        reasons.append(f"route: {route} (the application's provider decides where spans go)")
        return route
    if not options.export_process:
        reasons.append("route: in-process stage (export_process=False)")
        return ROUTE_STAGE
    if export.kind not in _PROCESS_KINDS:
        reasons.append(f"route: in-process stage (the {export.kind} exporter runs in the "
                       "training process: its output belongs to this process)")
        return ROUTE_STAGE
    if env.process_failed:
        reasons.append("route: in-process stage (the exporter process could not start)")
        return ROUTE_STAGE
    reasons.append("route: exporter process (export_process=True, the default): encoding and "
                   "sending out of the training process's GIL; the in-process stage takes "
                   "over if it cannot start or dies")
    return ROUTE_PROCESS


def _sampling_reasons(ratio: float | None, route: str, tail: bool, env: PipelineEnvironment,
                      reasons: list[str]) -> None:
    if ratio is None:
        if not tail:
            reasons.append("tail sampling: off (no sample_ratio, no traceidratio "
                           "OTEL_TRACES_SAMPLER): every step is exported")
    elif tail:
        reasons.append(f"tail sampling: keeps {ratio:.0%} of ordinary steps by trace id plus "
                       "slow, failed, monitoring and first steps; the SDK sampler follows "
                       "its parent (always on) so every step reaches the decision")
    else:
        reasons.append(f"tail sampling: off although asked for ({ratio:.0%}): the route is "
                       f"{route}, where the SDK sampler ({env.sampler}) decides")
    if not env.sampler_always_samples and not tail:
        reasons.append(f"SDK sampler {env.sampler} drops some steps: they feed the metrics "
                       "and are never exported")


def _export_ranks_reasons(options: RunOptions, env: PipelineEnvironment, choice: ExportRanks,
                          routine: bool, summary: bool, reasons: list[str]) -> None:
    if choice.kind == "all" and not summary:
        return
    what = ("summary spans" if summary else "every step's spans") if routine else (
        "only slow, failed, stalled and truncated steps")
    reasons.append(f"export_ranks: {choice.describe()}; span_mode={options.span_mode}: rank "
                   f"{env.rank} exports {what}; its metrics still see every step")


def _metrics_where(options: RunOptions, env: PipelineEnvironment, route: str,
                   otlp_metrics: bool, tail: bool, joins_app: bool,
                   reasons: list[str]) -> str:
    if route != ROUTE_PROCESS:
        reasons.append(f"derived metrics: in the training process (the route is {route})")
        return HERE
    blockers = []
    if not options.metrics_in_export_process:
        blockers.append("metrics_in_export_process=False")
    if otlp_metrics:
        blockers.append("metrics over OTLP push from the training process")
    if not env.sampler_always_samples and not tail:
        blockers.append(f"the SDK sampler {env.sampler} drops steps")
    if joins_app:
        blockers.append("the application's processors take the spans here, train.slow "
                        "marked first")
    if blockers:
        reasons.append("derived metrics: in the training process (" + "; ".join(blockers)
                       + "); the exporter process only exports")
        return HERE
    reasons.append("derived metrics: in the exporter process (metrics_in_export_process="
                   "True): this process serves a copy of their state")
    return THERE


def step_ring_in_exporter(route: str, metrics_where: str | None) -> bool:
    """With ``step_ring="on"``, the exporter process reads the ring: the route is the
    exporter process and the derived metrics run there (every step reaches them: the SDK
    sampler always samples, or the tail sampler decides there). Else the span worker reads
    it in the training process."""
    return route == ROUTE_PROCESS and metrics_where == THERE


def _step_ring_reader(choice: str, route: str, where: str, reasons: list[str]) -> str | None:
    """Who reads the step ring (RING_IN_*), or None for the queue; the reason appended.

    ``auto`` takes the ring only where the exporter process reads it: there the training
    process does nothing per flat step after the hot path (measured: background CPU 8 -> 3 us
    per MLP step, GIL wait 7 -> 2 us). Read by the span worker in the training process the
    ring measured no better than the queue, so ``auto`` keeps the queue there; ``on`` takes
    the ring anyway."""
    if choice == "off":
        return None
    in_exporter = step_ring_in_exporter(route, where)
    why = (f"the route is {route}" if route != ROUTE_PROCESS
           else "the derived metrics run in the training process")
    if in_exporter:
        reasons.append(f"step ring: read by the exporter process (step_ring={choice}, its "
                       "route, the derived metrics there): the training process does "
                       "nothing per flat step after the hot path")
        return RING_IN_EXPORTER
    if choice == "auto":
        reasons.append(f"step ring: off, steps are queued (step_ring=auto; {why}: read by "
                       "the span worker in the training process the ring costs no less "
                       "than the queue)")
        return None
    reasons.append(f"step ring: read by the span worker in the training process "
                   f"(step_ring=on; {why})")
    return RING_IN_WORKER


# The provider modes as ``otel-train plan`` says them to a person.
_PROVIDER_WORDS = {
    MODE_OURS: "otel-train's, installed as the global tracer provider",
    MODE_APP: "the application's OpenTelemetry SDK provider",
    MODE_FOREIGN: "another provider the application installed (left alone)",
    MODE_DISABLED: "none: the run is disabled",
}


def _user_spans(mode: str, route: str, joins_app: bool) -> str:
    """What happens to the spans a script opens with the OpenTelemetry API, in words."""
    if mode == MODE_APP:
        return "the application's provider handles them"
    if mode == MODE_FOREIGN:
        return "left to the other provider the application installed"
    if route == ROUTE_NONE:
        return "nested under the phase they are opened in; not exported"
    return (f"nested under the phase they are opened in, exported with the steps "
            f"({route})")


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
    protocol = (env.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "").strip()
                or options.otlp_protocol or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip())
    if protocol not in ("grpc", "http/protobuf"):
        if protocol:
            warn_once("metrics-protocol", "otel-train: OTLP metrics protocol %r is not "
                      "supported (grpc, http/protobuf); using http/protobuf", protocol)
        protocol = "http/protobuf"
    endpoint = None
    if not env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") and options.otlp_endpoint:
        endpoint = options.otlp_endpoint
        if protocol == "http/protobuf":
            endpoint = endpoint.rstrip("/")
            if not endpoint.endswith("/v1/metrics"):
                endpoint += "/v1/metrics"
    return MetricsPlan(prometheus, True, protocol, endpoint)
