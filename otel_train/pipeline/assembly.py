"""The one builder of a run: every part, from its options, each given all it needs at once.

``assemble_run`` resolves the run's identity, device timing and probes, own-cost meter, batch
counter and recorder, then the telemetry: ``assemble_telemetry`` gathers the environment
(``environment.py``), asks ``plan.py`` for the plan (the route, where the derived metrics
run, which processors exist, the export target, and why) and builds exactly that: the
TracerProvider for user spans, the derived-metrics stage (its settings from ``settings.py``,
made from the options and the plan), the export (the exporter process's client, or the
in-process stage), the ``Export`` the span worker hands records to, and the worker. Nothing is started here and
nothing is set on a part after it is made. ``Run`` holds the public API only and delegates to
the ``RunParts`` this returns (``telemetry.py``: ``RunTelemetry``).

Construction (see docs/architecture.md)::

    RunOptions -> plan_pipeline (plan.py) + settings.py -> settings per part -> parts

Data flow::

    Recorder.queue --SpanBuildWorker--> StepRecordBuilder -> span records
        -> DerivedMetricsStage.shared.on_views (slow steps, GPU, overhead, budget, Prometheus,
           console; in the exporter process when the plan says so)
        -> the route's Export (record_sinks.SinkExport): ProcessSink (ExportProcessClient) |
           StageSink (BoundedBatchSpanProcessor) | ApplicationProviderSink

Usage::

    parts = assemble_run(options, drops, started_ns)
    parts.telemetry.start()      # ValueError when the Prometheus port is taken
    ...
    parts.telemetry.shutdown(deadline)
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_train.common.attributes import INSTRUMENTATION_SCOPE
from otel_train.common.cpu_affinity import BackgroundCpus
from otel_train.common.drop_counter import DropCounter
from otel_train.common.identity import RunIdentity, resolve_identity, resource_attributes
from otel_train.common.options import RunOptions
from otel_train.common.sdk_config import build_resource
from otel_train.common.self_cost import SelfCostMeter
from otel_train.common.trace_ids import new_span_id
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
from otel_train.pipeline.banner import RunBanner
from otel_train.pipeline.global_provider import global_provider_for_run
from otel_train.pipeline.plan import (
    MODE_APP,
    MODE_OURS,
    RING_IN_EXPORTER,
    ROUTE_PROCESS,
    ROUTE_STAGE,
    THERE,
    PipelinePlan,
    plan_pipeline,
)
from otel_train.pipeline.record_sinks import (
    NullExport,
    ProcessSink,
    RecordSink,
    SinkExport,
    StageSink,
)
from otel_train.pipeline.ring_source import RingCostCounts, RingSource, ring_settings
from otel_train.pipeline.settings import count_settings, derived_settings, report_enabled
from otel_train.pipeline.telemetry import DisabledTelemetry, RunTelemetry
from otel_train.pipeline.span_worker import (
    CONSOLE_MAX_DRAIN_DELAY_SECONDS,
    MAX_DRAIN_DELAY_SECONDS,
    RowRoute,
    SpanBuildWorker,
)
from otel_train.pipeline.user_spans import UserSpanRows
from otel_train.pipeline.profile_capture import ProfileCapture
from otel_train.pipeline.profile_spans import span_emitter
from otel_train.recording.context import ActivePhaseSpan
from otel_train.recording.device import DeviceTiming, device_value_copier, resolve_device_timing
from otel_train.recording.device_probes import resolve_device_probes
from otel_train.recording.hot_path_cost import calibrate_hot_path
from otel_train.recording.recorder import Recorder
from otel_train.recording.step_ring import StepRing, ring_capacity_bytes
from otel_train.recording.schedule import DueSchedule
from otel_train.recording.step_counts import BatchCounter
from otel_train.records.envelope_records import StartupRecordMaker, startup_maker
from otel_train.records.step_records import (
    StepRecordBuilder,
    epoch_offset_ns,
)
from otel_train.version import __version__

__all__ = ["DisabledTelemetry", "RunParts", "RunTelemetry", "assemble_run", "assemble_telemetry",
           "disabled_reason"]

_log = logging.getLogger("otel_train")


@dataclasses.dataclass(frozen=True)
class RunParts:
    """Every part of one run, as ``assemble_run`` built it; ``Run`` delegates to them."""

    identity: RunIdentity
    status_dir: Path
    device: DeviceTiming
    self_cost: SelfCostMeter
    recorder: Recorder
    counter: BatchCounter | None  # tokens, samples, the FLOP-counted step; None: nothing
    telemetry: RunTelemetry | DisabledTelemetry
    profiling: ProfileCapture | None = None  # profile_on_slow_steps, profile_next
    proxy: ActivePhaseSpan | None = None  # the current phase, as the OTel API's current span
    disabled_by: str | None = None
    writes_report: bool = False  # report.html at shutdown (option report, else console)


def assemble_run(options: RunOptions, drops: DropCounter, started_ns: int) -> RunParts:
    """Build (not start) every part of a run from its options: identity, device timing and
    probes, own-cost meter, batch counter, recorder, telemetry and profile capture."""
    reason = disabled_reason(options)
    if reason is not None:  # off: no collective, no device sync, no thread, socket or file
        return RunParts(
            RunIdentity(options.run_id or "disabled", options.rank or 0,
                        options.world_size or 1, options.local_rank or 0,
                        "option" if options.run_id else "disabled"),
            Path(options.status_dir or "otel-train-runs"), resolve_device_timing("off"),
            SelfCostMeter(0.0), Recorder(1, DropCounter(), None, keep_finished=False), None,
            DisabledTelemetry(reason, options.console), disabled_by=reason)
    # Resolved before they are used, so the parts below take settings, not options.
    counts = count_settings(options)
    device = resolve_device_timing(options.device_sync)
    device = dataclasses.replace(device, probes=resolve_device_probes(
        device.make_event, device.device_type, options.device_events_every_steps,
        options.memory_peaks, host_clock_only=options.device_sync == "off", work=device.work))
    counter = BatchCounter.for_run(counts)
    identity = resolve_identity(options.run_id, options.rank, options.world_size,
                                options.local_rank)
    status_dir = Path(options.status_dir or Path("otel-train-runs") / identity.run_id)
    hot_path = calibrate_hot_path()
    self_cost = SelfCostMeter(
        hot_path.warm_ns_per_span, started_ns=started_ns,
        window_steps=options.recent_window_steps, cold_ns_per_span=hot_path.cold_ns_per_span,
        # syncs, events, peaks, copies: timed where they happen (none on CPU)
        device_work=device.work if device.device_type != "cpu" else None,
        batch_counter=counter)  # its time counting batches, timed on the training thread
    recorder = Recorder(options.max_queued_steps, drops, device.synchronize, device.probes,
                        device.monitor_synchronize, device_value_copier(device),
                        DueSchedule(options.budget_action == "govern", identity.rank,
                                    identity.world_size, identity.run_id), counter)
    telemetry = assemble_telemetry(options, identity, status_dir, recorder, drops, self_cost,
                                   device)
    provider = telemetry.sdk_provider
    profiling = ProfileCapture(
        recorder, status_dir, identity.run_id, options.profile_on_slow_steps,
        options.profile_min_interval_seconds,
        telemetry.derived.slow,  # its count comes back from the exporter process's chain
        span_emitter(provider, telemetry.is_sampled) if provider is not None else None)
    proxy = ActivePhaseSpan(recorder, identity.run_id, new_span_id, telemetry.is_sampled)
    return RunParts(identity, status_dir, device, self_cost, recorder, counter, telemetry,
                    profiling, proxy, writes_report=telemetry.writes_report)


def assemble_telemetry(options: RunOptions, identity: RunIdentity, status_dir: Path,
                       recorder: Recorder, drops: DropCounter, self_cost: SelfCostMeter,
                       device: DeviceTiming) -> RunTelemetry:
    """Build (not start) the whole telemetry pipeline of a run, as its plan says."""
    mode, provider = global_provider_for_run()
    environment, sdk_sampler = gather_environment(
        options, mode, provider, status_dir, identity.rank, identity.world_size,
        local_rank=identity.local_rank)
    plan = plan_pipeline(options, environment)
    stage_settings = derived_settings(options, identity, plan)
    # report.html at shutdown: rank 0, when spans go to the run directory's files.
    report_dir = status_dir if identity.rank == 0 and report_enabled(options) else None
    ring, child_ring = _make_ring(plan, options.max_queued_steps)
    banner = RunBanner(identity, device.describe(), options.console, report_dir)
    # service.instance.id, host.name, k8s.pod.name, ... per rank (identity.py), for the
    # spans and the metrics over OTLP; an application's provider brings its spans' own.
    own_resource = (build_resource(options.service_name, resource_attributes(identity))
                    if mode != MODE_APP or plan.otlp_metrics else None)
    resource = provider.resource if mode == MODE_APP else own_resource
    # With tail sampling every step is built sampled and the sampler decides after the
    # metrics; the SDK then follows its parent.
    sampler = ParentBased(ALWAYS_ON) if plan.tail_sampler else sdk_sampler
    # memory_peaks' CPU fallback: host RSS on every N-th step (0: never).
    rss_every = device.probes.host_rss_every_steps if device.probes is not None else 0
    builder = StepRecordBuilder(identity, resource,
                                InstrumentationScope(INSTRUMENTATION_SCOPE, __version__),
                                device.synced, device.device_type, sampling_function(sampler),
                                epoch_offset_ns(), device.span_timing, rss_every)
    # The exporter process first (its CPU counter is on the registry before the stage
    # mirrors it over OTLP); read on the training thread: its CPU is the one kept free.
    background = BackgroundCpus.resolve(options.background_cpus)
    built = _build_export(plan, options, provider, builder, drops, background, child_ring)
    plan, export = built.plan, built.export
    # The metrics here: user spans wait in the tail sampler, then go to the client.
    downstream = (built.client if plan.tail_sampler and plan.metrics_where != THERE
                  else None)
    try:
        derived = DerivedMetricsStage(
            stage_settings, identity, status_dir, recorder, drops, self_cost,
            collectors=built.collectors, attribute_drops=builder.attribute_drops,
            sampler_downstream=downstream, metrics_resource=own_resource)
    except BaseException:
        if export is not None:
            export.shutdown(0.5)  # no exporter process outlives a run that never started
        raise
    # The train.startup record, made with the first step's (records/envelope_records.py).
    startup = startup_maker(derived.settings["envelope"], self_cost.started_ns,
                            builder.offset_ns, options.startup_span)
    route = _row_route(plan, derived, built, provider, builder, drops, options.max_queued_spans)
    sdk_provider = (_user_span_provider(resource, sampler, plan, route, built.client, derived)
                    if mode == MODE_OURS else None)
    source = _ring_source(recorder, ring, built.client if child_ring else None, builder,
                          identity, device, startup, self_cost)
    worker = _span_worker(options, recorder, builder, route, drops, self_cost,
                          stage_settings.chain["console_min_interval_seconds"], startup,
                          source)
    return RunTelemetry(
        plan=plan, sampler=sampler, global_provider=provider if mode == MODE_OURS else None,
        sdk_provider=sdk_provider, export=export, derived=derived, builder=builder,
        worker=worker, banner=banner, background=background, client=built.client)


def _span_worker(options: RunOptions, recorder: Recorder, builder: StepRecordBuilder,
                 route: RowRoute, drops: DropCounter, self_cost: SelfCostMeter,
                 console_min_interval_seconds: float, startup: StartupRecordMaker,
                 ring_source: RingSource | None) -> SpanBuildWorker:
    """The span worker of a run: its drain pace follows the console."""
    # With the console on, a step it prints a fast line for is drained at the next poll:
    # read next to the script's own output, a console line is only useful on time.
    return SpanBuildWorker(
        recorder, builder, route, drops, self_cost,
        max_drain_delay_seconds=(CONSOLE_MAX_DRAIN_DELAY_SECONDS if options.console
                                 else MAX_DRAIN_DELAY_SECONDS),
        console_every_steps=options.log_every if options.console else None,
        console_min_interval_seconds=console_min_interval_seconds,
        startup=startup,
        ring_source=ring_source)


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


def _make_ring(plan: PipelinePlan, max_queued_steps: int
               ) -> tuple[StepRing | None, StepRing | None]:
    """With a step ring in the plan (``step_ring="on"``, or ``"auto"`` where the exporter
    process reads it): the ring's shared memory, twice where the exporter process reads it
    (the plan says so: its descriptor is passed to the child as it starts), else once (the span worker reads it here); (None, None) when off or where it cannot be
    made (a warning; the queue takes every step)."""
    if plan.step_ring is None:
        return None, None
    try:
        ring = StepRing.create(ring_capacity_bytes(max_queued_steps))
    except (OSError, ValueError) as exc:
        _log.warning("otel-train: step_ring: the ring could not be made (%r); steps are "
                     "queued as with step_ring=off", exc)
        return None, None
    return ring, (ring if plan.step_ring == RING_IN_EXPORTER else None)


def _ring_source(recorder: Recorder, ring: StepRing | None,
                 client: ExportProcessClient | None, builder: StepRecordBuilder,
                 identity: RunIdentity, device: DeviceTiming, startup: StartupRecordMaker,
                 self_cost: SelfCostMeter) -> RingSource | None:
    """The ring attached to the recorder (its steps go there from now on): read by the
    exporter process (``client``: its child builds the steps' records, train.startup too,
    and reports the own-cost counts this process's meter keeps), else by the span worker."""
    if ring is None:
        return None
    counts = RingCostCounts(self_cost, startup) if client is not None else None
    settings = (ring_settings(builder, identity, device.synced, device.device_type,
                              device.span_timing, startup) if client is not None else None)
    return RingSource(recorder, ring, client, settings, counts)


def _build_export(plan: PipelinePlan, options: RunOptions, provider: Any,
                  builder: StepRecordBuilder, drops: DropCounter,
                  background: BackgroundCpus, ring: StepRing | None = None) -> BuiltExport:
    """The export the plan names (the client, the stage, or neither), the metrics collectors
    it brings, and the plan as built (the fallback's, should the exporter process not
    start)."""
    factory = builder.factory

    def in_process_stage(exporter: Any = None) -> BoundedBatchSpanProcessor:
        return BoundedBatchSpanProcessor(
            exporter or create_exporter(plan.export), drops, options.max_queued_spans,
            options.export_batch_size, options.export_interval_seconds)

    if plan.route == ROUTE_PROCESS and plan.if_process_fails is not None:
        fallback = plan.if_process_fails  # made with the plan: nothing is planned here
        try:
            client = ExportProcessClient(
                plan.export, factory.resource, factory.scope, factory.run_constants, drops,
                options.max_queued_spans, options.export_batch_size,
                options.export_interval_seconds, fallback=in_process_stage,
                nice=options.export_process_nice, cpus=background.cpus, ring=ring)
        except Exception as exc:
            _log.warning("otel-train: could not start the exporter process (%r); exporting "
                         "from the training process", exc)
            plan = dataclasses.replace(fallback, reasons=fallback.reasons + (
                f"the exporter process could not start: {exc!r}",))
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
        if found is None:  # its settings could not be read after all: planned without them
            plan = plan.without_app_exporter()
            if plan.route != ROUTE_STAGE:
                return BuiltExport(plan)
        else:
            exporter = found[0]
    stage = in_process_stage(exporter)
    stage.use_rows(factory)
    return BuiltExport(plan, stage=stage)


def _row_route(plan: PipelinePlan, derived: DerivedMetricsStage, built: BuiltExport,
               provider: Any, builder: StepRecordBuilder, drops: DropCounter,
               max_queued_spans: int) -> RowRoute:
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
            client.sample_when_taken_over(sampler)
            derived.run_in_exporter_process(client)
            metrics = sampler = None
        sinks.append(ProcessSink(client, sampler, drops))
    elif built.stage is not None:
        user_rows = UserSpanRows(drops, max_queued_spans)
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
