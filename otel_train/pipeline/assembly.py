"""One assembly step: everything between a run's recorder and the wire.

``assemble_telemetry`` chooses the TracerProvider (otel-train's run-scoped one, or the
application's own), the resource, the sampler and the exporter, builds the derived-metrics
stage and the export stage, and wires the background span worker to them. ``Run`` holds the
public API only and talks to the ``RunTelemetry`` this returns.

Data flow (see docs/architecture.md)::

    Recorder.queue --SpanBuildWorker--> StepSpanBuilder -> ReadableSpans
        -> DerivedMetricsStage.processors (slow steps, GPU, overhead, budget, Prometheus, console)
        -> BoundedBatchSpanProcessor -> exporter (OTLP gRPC/HTTP, span file, console)
        -> (application provider mode) the application's own span processors

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
import time
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_train.pipeline.application_export import exporter_like_application
from otel_train.common.attributes import INSTRUMENTATION_SCOPE
from otel_train.derived.stage import DerivedMetricsStage
from otel_train.recording.device import DeviceTiming
from otel_train.common.drop_counter import DropCounter
from otel_train.export.stage import BoundedBatchSpanProcessor
from otel_train.export.process.client import ExporterProcessCpuCollector, ExportProcessClient
from otel_train.pipeline.global_provider import RunScopedTracerProvider, global_provider_for_run
from otel_train.common.identity import RunIdentity, resource_attributes
from otel_train.common.options import RunOptions
from otel_train.recording.recorder import Recorder
from otel_train.export.exporters import create_exporter
from otel_train.common.sdk_config import (
    ExportPlan,
    build_resource,
    build_sampler,
    plan_export,
    sdk_disabled,
)
from otel_train.common.self_cost import SelfCostMeter
from otel_train.pipeline.span_worker import RowRoute, SpanBuildWorker
from otel_train.records.step_records import (
    StepSpanBuilder,
    epoch_offset_ns,
    run_constant_attributes,
)
from otel_train.version import __version__

_log = logging.getLogger("otel_train")

# provider modes
MODE_OURS = "ours"  # otel-train's RunScopedTracerProvider is the global provider
MODE_APP = "app"  # the application installed an SDK TracerProvider: our spans join its pipeline
MODE_FOREIGN = "foreign"  # some other API-level provider: left alone, we export on our own
MODE_DISABLED = "disabled"  # OTEL_SDK_DISABLED
_PROCESS_KINDS = ("otlp", "jsonl")  # exporters the exporter process makes from the plan
_COSTS_SYNC_SECONDS = 2.0  # run.costs() waits this long at most for the exporter process


class ApplicationProviderSink(SpanProcessor):
    """Hands our built spans to an application's TracerProvider pipeline."""

    def __init__(self, provider: TracerProvider) -> None:
        self._target = getattr(provider, "_active_span_processor", None)

    def on_end(self, span: Any) -> None:
        """Forward one finished span."""
        if self._target is not None:
            self._target.on_end(span)


class RunTelemetry:
    """The assembled pipeline of one run: provider, derived metrics, export, span worker."""

    def __init__(self, *, export_plan: ExportPlan, provider_mode: str, resource: Any,
                 sampler: Sampler, is_sampled: Any, global_provider: RunScopedTracerProvider | None,
                 sdk_provider: TracerProvider | None,
                 export: BoundedBatchSpanProcessor | None, derived: DerivedMetricsStage,
                 builder: StepSpanBuilder, worker: SpanBuildWorker) -> None:
        self.export_plan = export_plan
        self.provider_mode = provider_mode
        self.resource = resource
        self.sampler = sampler
        self.is_sampled = is_sampled  # trace id -> sampled? (the proxy span asks too)
        self.global_provider = global_provider
        self.sdk_provider = sdk_provider
        self.export = export
        self.derived = derived
        self.builder = builder
        self.worker = worker

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
        try:
            self.derived.start()  # may raise: e.g. the Prometheus port is taken
        except BaseException:
            if self.export is not None:
                self.export.shutdown(0.5)
            raise
        self.worker.start()
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
        fork_hook = getattr(self.export, "after_fork_in_child", None)
        if fork_hook is not None:
            fork_hook()  # the exporter process belongs to the parent
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


def disabled_reason(options: RunOptions) -> str | None:
    """Why this run records nothing (``enabled=False`` or ``OTEL_SDK_DISABLED``), or None."""
    if not options.enabled:
        return options.where("enabled") + "=False"
    if sdk_disabled():
        return "OTEL_SDK_DISABLED=true"
    return None


def assemble_telemetry(options: RunOptions, identity: RunIdentity, status_dir: Path,
                       recorder: Recorder, drops: DropCounter, self_cost: SelfCostMeter,
                       device: DeviceTiming) -> RunTelemetry:
    """Build (not start) the whole telemetry pipeline of a run from its options."""
    plan = plan_export(options, status_dir, identity.rank, identity.world_size)
    mode, provider = global_provider_for_run()
    if mode == MODE_APP:
        resource = provider.resource
        sampler: Sampler = provider.sampler
    else:
        # service.instance.id, host.name, k8s.pod.name, ... per rank (identity.py)
        resource = build_resource(options.service_name, resource_attributes(identity))
        sampler = build_sampler()

    exporter = None
    own_exporter = False  # the exporter is made from the plan (so the child can make it too)
    joins_app = mode == MODE_APP  # our spans go into the application's own processors
    if mode != MODE_APP or options.sources.get("exporter"):
        own_exporter = True
    elif mode == MODE_APP:
        plan = ExportPlan("application TracerProvider")
        # Our bounded, counted, fast export stage to the application's endpoint instead
        # (application_export.py); trace_export="application" keeps the old way.
        found = exporter_like_application(provider) if options.trace_export == "own" else None
        if found is not None:
            exporter, where = found
            plan, joins_app = ExportPlan(where), False
    scope = InstrumentationScope(INSTRUMENTATION_SCOPE, __version__)

    def in_process_export(made: SpanExporter | None = None) -> BoundedBatchSpanProcessor:
        return BoundedBatchSpanProcessor(
            made or create_exporter(plan), drops, options.max_queued_spans,
            options.export_batch_size, options.export_interval_seconds)

    # The exporter process first: its CPU counter must be on the metrics registry before
    # the derived-metrics stage mirrors the registry's families over OTLP.
    export: Any = None
    collectors: list[Any] = []
    if own_exporter and options.export_process and plan.kind in _PROCESS_KINDS:
        try:
            export = ExportProcessClient(
                plan, resource, scope,
                run_constant_attributes(identity, device.synced, device.device_type), drops,
                options.max_queued_spans, options.export_batch_size,
                options.export_interval_seconds, fallback=in_process_export)
            plan = dataclasses.replace(plan, process_pid=export.pid)
            collectors.append(ExporterProcessCpuCollector(export, identity.rank))
        except Exception as exc:
            _log.warning("otel-train: could not start the exporter process (%r); exporting "
                         "from the training process", exc)
    try:
        derived = DerivedMetricsStage(options, identity, status_dir, recorder, drops,
                                      self_cost, collectors=collectors)
    except BaseException:
        if export is not None:
            export.shutdown(0.5)  # no exporter process outlives a run that never started
        raise
    # Tail sampling (sampling.py) between the derived metrics and export: it applies the
    # ratio itself, so every step is built sampled and the SDK follows its parent.
    if derived.sampler is not None and (own_exporter and plan.kind != "none"
                                        or exporter is not None):
        sampler = ParentBased(ALWAYS_ON)
    is_sampled = sampling_function(sampler)
    builder = StepSpanBuilder(identity, resource, scope, device.synced, device.device_type,
                              is_sampled, epoch_offset_ns())
    if export is None and own_exporter:
        exporter = create_exporter(plan)
    if export is None and exporter is not None:
        export = in_process_export(exporter)

    # The derived metrics (and the tail sampler after them) run in the exporter process
    # too, and this process keeps their state as a copy (derived_chain.py): the span worker
    # then only builds records and hands them over. With metrics over OTLP or an SDK
    # sampler that drops steps, they stay here (not moved yet).
    derive_there = (not joins_app and isinstance(export, ExportProcessClient)
                    and options.metrics_in_export_process and derived.otlp_metrics is None
                    and is_sampled is _always_sampled)
    export_stage: SpanProcessor | None = export
    if derived.sampler is not None and export is not None and not derive_there:
        derived.sampler.downstream = export
        export_stage = derived.sampler  # user spans wait here for their step's decision
    sdk_provider: TracerProvider | None = None
    if mode == MODE_OURS:
        # User spans opened with the OTel API go through this provider into our export.
        sdk_provider = TracerProvider(resource=resource, sampler=sampler, shutdown_on_exit=False)
        if export_stage is not None:
            sdk_provider.add_span_processor(export_stage)

    # The row path (span_rows.py) when nothing downstream needs ReadableSpans made here:
    # export runs in the exporter process, or nothing is exported.
    route: RowRoute | None = None
    if not joins_app and (export is None or isinstance(export, ExportProcessClient)):
        route = RowRoute(derived.shared, derived.sampler if export is not None else None,
                         export, identity.rank)
        if derive_there:
            # There, user spans wait for their step's decision in the exporter process too
            # (sampling.StepTailSampler.filter_frame); this process's sampler only keeps
            # the counts it sends back.
            derived.run_in_exporter_process(export)
            route.metrics = route.sampler = None
    sinks: list[SpanProcessor] = list(derived.processors)
    if export_stage is not None:
        sinks.append(export_stage)
    if joins_app:
        sinks.append(ApplicationProviderSink(provider))
    worker = SpanBuildWorker(recorder, builder, sinks, drops, self_cost, route=route,
                             export=export)
    return RunTelemetry(
        export_plan=plan, provider_mode=mode, resource=resource, sampler=sampler,
        is_sampled=is_sampled,
        global_provider=provider if mode == MODE_OURS else None, sdk_provider=sdk_provider,
        export=export, derived=derived, builder=builder, worker=worker)


def sampling_function(sampler: Sampler) -> Any:
    """trace id -> sampled? Constant when the sampler always samples (the usual case)."""
    if sampler is ALWAYS_ON or (isinstance(sampler, ParentBased)
                                and getattr(sampler, "_root", None) is ALWAYS_ON):
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
