"""One assembly step: everything between a run's recorder and the wire, as its plan says.

``assemble_telemetry`` gathers the environment (``environment.py``), asks ``plan.py`` for the
plan (the route, where the derived metrics run, which processors exist, the export target,
and why) and builds exactly that: the TracerProvider for user spans, the derived-metrics
stage, the export (the exporter process's client, or the in-process stage), the sink the span
worker hands records to, and the worker. ``Run`` holds the public API only and talks to the
``RunTelemetry`` this returns.

Data flow (see docs/architecture.md)::

    Recorder.queue --SpanBuildWorker--> StepRecordBuilder -> span records
        -> DerivedMetricsStage.shared.on_views (slow steps, GPU, overhead, budget, Prometheus,
           console; in the exporter process when the plan says so)
        -> the route's sink: ProcessSink (ExportProcessClient) | StageSink
           (BoundedBatchSpanProcessor) | ApplicationProviderSink (the application's processors)

Usage::

    telemetry = assemble_telemetry(options, identity, status_dir, recorder, drops, self_cost,
                                   device)
    telemetry.start()            # ValueError when the Prometheus port is taken
    ...
    telemetry.shutdown(deadline)
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_train.common.attributes import INSTRUMENTATION_SCOPE
from otel_train.common.cpu_affinity import BackgroundCpus
from otel_train.common.drop_counter import DropCounter
from otel_train.common.identity import RunIdentity, resource_attributes
from otel_train.common.options import RunOptions
from otel_train.common.sdk_config import ExportPlan, build_resource
from otel_train.common.self_cost import SelfCostMeter
from otel_train.derived.console import fast_log_min_interval_seconds
from otel_train.derived.stage import DerivedMetricsStage
from otel_train.export.exporters import create_exporter
from otel_train.export.process.client import ExporterProcessCpuCollector, ExportProcessClient
from otel_train.export.stage import BoundedBatchSpanProcessor
from otel_train.pipeline.application_export import (
    ApplicationProviderSink,
    exporter_like_application,
)
from otel_train.pipeline.environment import (
    disabled_reason,
    gather_environment,
    sampling_function,
)
from otel_train.pipeline.global_provider import RunScopedTracerProvider, global_provider_for_run
from otel_train.pipeline.plan import (
    MODE_APP,
    MODE_DISABLED,
    MODE_OURS,
    ROUTE_PROCESS,
    ROUTE_STAGE,
    THERE,
    PipelineEnvironment,
    PipelinePlan,
    plan_pipeline,
    process_failed,
)
from otel_train.pipeline.record_sinks import (
    NullExport,
    ProcessSink,
    RecordSink,
    SinkExport,
    StageSink,
)
from otel_train.pipeline.span_worker import (
    CONSOLE_MAX_DRAIN_DELAY_SECONDS,
    MAX_DRAIN_DELAY_SECONDS,
    RowRoute,
    SpanBuildWorker,
)
from otel_train.pipeline.user_spans import UserSpanRows
from otel_train.recording.device import DeviceTiming
from otel_train.recording.recorder import Recorder
from otel_train.records.envelope_records import startup_maker
from otel_train.records.step_records import (
    StepRecordBuilder,
    epoch_offset_ns,
)
from otel_train.version import __version__

__all__ = ["DisabledTelemetry", "RunTelemetry", "assemble_telemetry", "disabled_reason"]

_log = logging.getLogger("otel_train")
_COSTS_SYNC_SECONDS = 2.0  # run.costs() waits this long at most for the exporter process


class RunTelemetry:
    """The assembled pipeline of one run: provider, derived metrics, export, span worker."""

    def __init__(self, *, plan: PipelinePlan, sampler: Sampler,
                 global_provider: RunScopedTracerProvider | None,
                 sdk_provider: TracerProvider | None, export: Any,
                 derived: DerivedMetricsStage, builder: StepRecordBuilder,
                 worker: SpanBuildWorker, background: BackgroundCpus | None = None,
                 client: ExportProcessClient | None = None) -> None:
        self.plan = plan
        self.export_plan = plan.export
        self.provider_mode = plan.provider_mode
        self.resource = builder.factory.resource
        self.sampler = sampler
        self.is_sampled = builder.is_sampled  # trace id -> sampled? (the proxy span asks too)
        self.global_provider = global_provider
        self.sdk_provider = sdk_provider
        self.export = export  # the export stage or the exporter process's client, or None
        self.client = client  # the exporter process's client, or None
        self.derived = derived
        self.builder = builder
        self.worker = worker
        self.background = background or BackgroundCpus(None, why_not="not resolved")

    @property
    def prometheus_url(self) -> str | None:
        """Base URL of the metrics endpoint, or None when off."""
        return self.derived.prometheus_url

    def costs(self) -> dict[str, Any]:
        """Fold in the steps still queued, then what monitoring cost so far."""
        self.worker.drain()
        if self.derived.remote is not None:
            # The exporter process feeds the metrics: its state after those steps (bounded;
            # past the bound, its last state).
            self.derived.remote.sync(_COSTS_SYNC_SECONDS)
        return self.derived.costs()

    def start(self) -> None:
        """Start the metrics endpoint and threads, then route the global provider to us."""
        before = {t.native_id for t in threading.enumerate()}
        try:
            self.derived.start()  # may raise: e.g. the Prometheus port is taken
        except BaseException:
            if self.export is not None:
                self.export.shutdown(0.5)
            raise
        self.worker.start()
        # The threads just started are the run's (the metrics server, the watchdog, the span
        # worker...): off the training thread's CPU with the exporter process; threads they
        # start later inherit it.
        self.background.pin_threads(t.native_id for t in threading.enumerate()
                                    if t.native_id not in before)
        _log.info("otel-train: %s", self.background.describe())
        if self.global_provider is not None:
            self.global_provider.activate(self.sdk_provider)

    def flush(self, timeout_seconds: float) -> bool:
        """Build everything queued, then flush processors and export; True if all went out."""
        self.worker.drain()
        millis = int(timeout_seconds * 1000)
        ok = True
        for proc in self.derived.processors:
            ok = proc.force_flush(millis) and ok
        if self.export is not None:
            ok = self.export.force_flush(millis) and ok
        return ok

    def shutdown(self, deadline: float) -> None:
        """Stop everything by ``deadline`` (``time.monotonic()``): build, export, metrics."""
        def left(share: float) -> float:
            return max(0.0, (deadline - time.monotonic()) * share)

        # Build what is queued, export it, then the final metrics and monitoring_costs.json,
        # which so count every span the export could not send.
        self.worker.stop(left(0.45))
        if self.export is not None:
            self.export.shutdown(left(0.8))
        try:
            self.derived.shutdown(max(0.05, left(1.0)))
        except Exception as exc:
            _log.warning("otel-train: metrics shutdown failed: %r", exc)
        gp = self.global_provider
        if gp is not None and gp.current is self.sdk_provider:
            gp.activate(None)

    def after_fork_in_child(self) -> None:
        """In a forked child: drop the parent's pipeline without touching inherited locks."""
        gp = self.global_provider
        if gp is not None:
            gp.after_fork_in_child()  # user spans in the child go nowhere
        if self.client is not None:
            self.client.after_fork_in_child()  # the exporter process belongs to the parent
        self.derived.after_fork_in_child()


class DisabledTelemetry:
    """A disabled run's pipeline: no thread, no socket, no file; the API still works."""

    provider_mode = MODE_DISABLED
    prometheus_url = None

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.export_plan = ExportPlan("none")

    @staticmethod
    def is_sampled(trace_id: int) -> bool:
        """Nothing is sampled: nothing is recorded."""
        return False

    def costs(self) -> dict[str, Any]:
        """A disabled run measured nothing."""
        return {"enabled": False, "disabled_by": self.reason, "steps": 0, "operations": {}}

    def start(self) -> None:
        """Nothing to start."""

    def flush(self, timeout_seconds: float) -> bool:
        """Nothing is pending."""
        return True

    def shutdown(self, deadline: float) -> None:
        """Nothing to stop."""

    def after_fork_in_child(self) -> None:
        """Nothing was inherited."""


def assemble_telemetry(options: RunOptions, identity: RunIdentity, status_dir: Path,
                       recorder: Recorder, drops: DropCounter, self_cost: SelfCostMeter,
                       device: DeviceTiming) -> RunTelemetry:
    """Build (not start) the whole telemetry pipeline of a run, as its plan says."""
    mode, provider = global_provider_for_run()
    environment, sdk_sampler = gather_environment(options, mode, provider, status_dir,
                                                  identity.rank, identity.world_size,
                                                  local_rank=identity.local_rank)
    plan = plan_pipeline(options, environment)
    # service.instance.id, host.name, k8s.pod.name, ... per rank (identity.py); an
    # application's provider brings its own resource.
    resource = (provider.resource if mode == MODE_APP
                else build_resource(options.service_name, resource_attributes(identity)))
    # With tail sampling every step is built sampled and the sampler decides after the
    # metrics; the SDK then follows its parent.
    sampler = ParentBased(ALWAYS_ON) if plan.tail_sampler else sdk_sampler
    builder = StepRecordBuilder(identity, resource,
                                InstrumentationScope(INSTRUMENTATION_SCOPE, __version__),
                                device.synced, device.device_type, sampling_function(sampler),
                                epoch_offset_ns(), device.span_timing)
    if device.probes is not None:  # memory_peaks' CPU fallback: host RSS on every N-th step
        builder.host_rss_every_steps = device.probes.host_rss_every_steps
    # The exporter process first: its CPU counter must be on the metrics registry before the
    # derived-metrics stage mirrors the registry's families over OTLP.
    # Read here, on the training thread: the CPU it runs on now is the one kept free.
    background = BackgroundCpus.resolve(options.background_cpus)
    built = _build_export(plan, options, environment, provider, builder, drops, background)
    plan, export = built.plan, built.export
    # Where the metrics stay here, the tail sampler's kept user spans go to the exporter
    # process's client (they wait in the sampler for their step's decision).
    downstream = (built.client if plan.tail_sampler and plan.metrics_where != THERE
                  else None)
    try:
        derived = DerivedMetricsStage(options, identity, status_dir, recorder, drops,
                                      self_cost, collectors=built.collectors,
                                      attribute_drops=builder.attribute_drops,
                                      sampler_downstream=downstream)
    except BaseException:
        if export is not None:
            export.shutdown(0.5)  # no exporter process outlives a run that never started
        raise
    route = _row_route(plan, derived, built, provider, builder, drops)
    sdk_provider = (_user_span_provider(resource, sampler, plan, route, built.client, derived)
                    if mode == MODE_OURS else None)
    # With the console on, a step it prints a fast line for is drained at the next poll:
    # read next to the script's own output, a console line is only useful on time.
    worker = SpanBuildWorker(recorder, builder, route, drops, self_cost,
                             max_drain_delay_seconds=(CONSOLE_MAX_DRAIN_DELAY_SECONDS
                                                      if options.console
                                                      else MAX_DRAIN_DELAY_SECONDS),
                             console_every_steps=options.log_every if options.console else None,
                             console_min_interval_seconds=fast_log_min_interval_seconds(options),
                             startup=startup_maker(derived.settings["envelope"],
                                                   self_cost.started_ns, builder.offset_ns,
                                                   options.startup_span))
    return RunTelemetry(plan=plan, sampler=sampler,
                        global_provider=provider if mode == MODE_OURS else None,
                        sdk_provider=sdk_provider, export=export, derived=derived,
                        builder=builder, worker=worker, background=background,
                        client=built.client)


@dataclasses.dataclass(frozen=True)
class BuiltExport:
    """The export ``_build_export`` built: the exporter process's ``client`` or the in-process
    ``stage`` (or neither), the metrics collectors it brings, and the plan as built."""

    plan: PipelinePlan
    client: ExportProcessClient | None = None
    stage: BoundedBatchSpanProcessor | None = None
    collectors: tuple[Any, ...] = ()

    @property
    def export(self) -> ExportProcessClient | BoundedBatchSpanProcessor | None:
        """What is flushed and shut down with the run."""
        return self.client if self.client is not None else self.stage


def _build_export(plan: PipelinePlan, options: RunOptions, environment: PipelineEnvironment,
                  provider: Any, builder: StepRecordBuilder, drops: DropCounter,
                  background: BackgroundCpus) -> BuiltExport:
    """The export the plan names (the client, the stage, or neither), the metrics collectors
    it brings, and the plan as built (the fallback's, should the exporter process not
    start)."""
    factory = builder.factory

    def in_process_stage(exporter: Any = None) -> BoundedBatchSpanProcessor:
        return BoundedBatchSpanProcessor(
            exporter or create_exporter(plan.export), drops, options.max_queued_spans,
            options.export_batch_size, options.export_interval_seconds)

    if plan.route == ROUTE_PROCESS:
        try:
            client = ExportProcessClient(
                plan.export, factory.resource, factory.scope, factory.run_constants, drops,
                options.max_queued_spans, options.export_batch_size,
                options.export_interval_seconds, fallback=in_process_stage,
                nice=options.export_process_nice, cpus=background.cpus)
        except Exception as exc:
            _log.warning("otel-train: could not start the exporter process (%r); exporting "
                         "from the training process", exc)
            plan = process_failed(options, environment, repr(exc))
        else:
            plan = dataclasses.replace(
                plan, export=dataclasses.replace(plan.export, process_pid=client.pid))
            return BuiltExport(plan, client=client,
                               collectors=(ExporterProcessCpuCollector(client, builder.rank),))
    if plan.route != ROUTE_STAGE:
        return BuiltExport(plan)
    exporter = None
    if plan.app_exporter:
        found = exporter_like_application(provider)
        if found is None:  # its settings could not be read after all: planned without it
            plan = plan_pipeline(options, dataclasses.replace(environment, app_exporter=None))
            if plan.route != ROUTE_STAGE:
                return BuiltExport(plan)
        else:
            exporter = found[0]
    stage = in_process_stage(exporter)
    stage.use_rows(factory)
    return BuiltExport(plan, stage=stage)


def _row_route(plan: PipelinePlan, derived: DerivedMetricsStage, built: BuiltExport,
               provider: Any, builder: StepRecordBuilder, drops: DropCounter) -> RowRoute:
    """Where the span worker's drains go: the metrics (here, unless the plan moves them to
    the exporter process), then the route's export."""
    metrics: Any = derived.shared
    sampler = derived.sampler if plan.tail_sampler else None
    sinks: list[RecordSink] = []
    user_rows = None
    client = built.client
    if client is not None:
        if plan.metrics_where == THERE:
            # There, user spans wait for their step's decision in the exporter process too
            # (sampling.StepTailSampler.filter_frame); this process's sampler only keeps the
            # counts it sends back.
            derived.run_in_exporter_process(client)
            client.sample_when_taken_over(sampler)
            metrics = sampler = None
        sinks.append(ProcessSink(client, sampler, drops))
    elif built.stage is not None:
        user_rows = UserSpanRows(drops, derived.options.max_queued_spans)
        sinks.append(StageSink(built.stage, sampler))
    if plan.joins_application:
        sinks.append(ApplicationProviderSink(provider, builder.factory))
    export = SinkExport(sinks, process=client) if sinks else NullExport()
    return RowRoute(metrics, export, builder.rank, user_rows)


def _user_span_provider(resource: Any, sampler: Sampler, plan: PipelinePlan, route: RowRoute,
                        client: ExportProcessClient | None,
                        derived: DerivedMetricsStage) -> TracerProvider:
    """The SDK provider behind otel-train's global one: user spans opened with the OTel API
    go from it into the route (as rows at once, or to the exporter process's client)."""
    sdk_provider = TracerProvider(resource=resource, sampler=sampler, shutdown_on_exit=False)
    if route.user_rows is not None:
        sdk_provider.add_span_processor(route.user_rows)
    elif client is not None:
        local_sampler = derived.sampler if (plan.tail_sampler
                                            and plan.metrics_where != THERE) else None
        sdk_provider.add_span_processor(local_sampler or client)
    return sdk_provider
