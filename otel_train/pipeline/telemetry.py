"""The assembled pipeline of one run, as ``assembly.py`` built it, and a disabled run's.

``Run`` talks to its ``RunTelemetry`` only through these methods: start, costs, flush,
shutdown, the collective log, and the fork hook. Starting shows the run's banner (banner.py).

Usage::

    telemetry = assemble_run(options, drops, started_ns).telemetry   # assembly.py
    telemetry.start()            # ValueError when the Prometheus port is taken
    ...
    telemetry.shutdown(deadline)
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import Sampler

from otel_train.common.cpu_affinity import BackgroundCpus
from otel_train.common.sdk_config import ExportPlan
from otel_train.derived.stage import DerivedMetricsStage
from otel_train.pipeline.banner import RunBanner, disabled_banner
from otel_train.export.process.client import ExportProcessClient
from otel_train.pipeline.global_provider import RunScopedTracerProvider
from otel_train.pipeline.plan import MODE_DISABLED, PipelinePlan
from otel_train.pipeline.span_worker import SpanBuildWorker
from otel_train.recording.collectives import CollectiveLog
from otel_train.records.step_records import StepRecordBuilder

__all__ = ["DisabledTelemetry", "RunTelemetry"]

_log = logging.getLogger("otel_train")
_COSTS_SYNC_SECONDS = 2.0  # run.costs() waits this long at most for the exporter process


class RunTelemetry:
    """The assembled pipeline of one run: provider, derived metrics, export, span worker."""

    def __init__(self, *, plan: PipelinePlan, sampler: Sampler,
                 global_provider: RunScopedTracerProvider | None,
                 sdk_provider: TracerProvider | None, export: Any,
                 derived: DerivedMetricsStage, builder: StepRecordBuilder,
                 worker: SpanBuildWorker, banner: RunBanner,
                 background: BackgroundCpus | None = None,
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
        self.banner = banner

    @property
    def prometheus_url(self) -> str | None:
        """Base URL of the metrics endpoint, or None when off."""
        return self.derived.prometheus_url

    @property
    def writes_report(self) -> bool:
        """report.html at shutdown (the banner says so)."""
        return self.banner.writes_report(self.export_plan)

    def collective_log(self) -> CollectiveLog:
        """Where the run's collectives are timed, made on first use (a run without it adds
        nothing per step)."""
        if self.builder.collectives is None:
            self.builder.collectives = CollectiveLog()
            source = self.worker.ring_source
            if source is not None:  # the exporter process's reader waits for their entries
                source.note_collectives()
        return self.builder.collectives

    def costs(self) -> dict[str, Any]:
        """Fold in the steps still queued, then what monitoring cost so far."""
        self._collectives_in(0.1)
        self.worker.drain()
        if self.derived.remote is not None:
            # The exporter process feeds the metrics: its state after those steps (bounded;
            # past the bound, its last state).
            self.derived.remote.sync(_COSTS_SYNC_SECONDS)
        return self.derived.costs()

    def start(self) -> None:
        """Start the metrics endpoint and threads, route the global provider to us, then
        show the banner (it names the endpoint's address, known once it is bound)."""
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
        self.banner.show(self.banner.lines(self.export_plan, self.prometheus_url,
                                           self.derived.scale_out_banner()))

    def _collectives_in(self, timeout_seconds: float) -> None:
        """The collectives of the steps ended so far completed, bounded: the exporter process
        builds a ring step once the collectives sent cover its end, and a flush or a count
        must include the last step (its bucket's done-callback may still be running)."""
        log = self.builder.collectives
        if log is not None and self.worker.reads_ring_in_child():
            log.wait_running(timeout_seconds)

    def flush(self, timeout_seconds: float) -> bool:
        """Build everything queued, then flush processors and export; True if all went out."""
        self._collectives_in(min(0.5, timeout_seconds / 4))
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
    export = None
    sdk_provider = None

    def __init__(self, reason: str, console: bool) -> None:
        self.reason = reason
        self.console = console
        self.export_plan = ExportPlan("none")

    @staticmethod
    def is_sampled(trace_id: int) -> bool:
        """Nothing is sampled: nothing is recorded."""
        return False

    @staticmethod
    def collective_log() -> None:
        """Nothing is timed."""
        return None

    def costs(self) -> dict[str, Any]:
        """A disabled run measured nothing."""
        return {"enabled": False, "disabled_by": self.reason, "steps": 0, "operations": {}}

    def start(self) -> None:
        """Nothing to start: the banner says so, and why."""
        disabled_banner(self.reason, self.console)

    def flush(self, timeout_seconds: float) -> bool:
        """Nothing is pending."""
        return True

    def shutdown(self, deadline: float) -> None:
        """Nothing to stop."""

    def after_fork_in_child(self) -> None:
        """Nothing was inherited."""
