"""Derived-metrics pipeline: the span processors that see every step before export.

One ``SharedStepSpanProcessor`` assembles each step's spans once and hands the view, in
order, to: slow steps (marks ``train.slow`` first, so everything after sees it), GPU step
attributes, overhead, budget, Prometheus metrics, and the console report. Around them: the
Prometheus endpoint, the stall watchdog, the NVML GPU sampler and the periodic
``monitoring_costs.json`` writer. ``run.py`` feeds every built span to ``processors`` and
then to the exporter.

Usage::

    settings = derived_settings(options, identity, plan)  # pipeline/settings.py
    pipeline = DerivedMetricsStage(settings, identity, status_dir, recorder, drops, self_cost,
                                   metrics_resource=resource)  # needed with metrics over OTLP
    pipeline.start()               # ValueError when the Prometheus port is taken
    for span in spans: pipeline.processors[0].on_end(span)
    pipeline.costs()               # the content of monitoring_costs.json
    pipeline.shutdown(1.0)
"""

from __future__ import annotations

import errno
import logging
import re
import socket
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor

from otel_train.derived import otlp_metrics as om
from otel_train.derived.console import ConsoleReportSpanProcessor
from otel_train.derived.costs import CostsFileWriter, CostsReport, add_own_cost, build_costs
from otel_train.common.files import write_json_atomic
from otel_train.derived.chain import StepChain, feed_records
from otel_train.common.drop_counter import DropCounter
from otel_train.derived.goodput import (
    GoodputCollector,
    envelope_line,
    envelope_settings,
    now_epoch_ns_of,
)
from otel_train.derived.gpu import NvmlGpuSampler
from otel_train.derived.governor import IntervalCollector, governor_thread
from otel_train.common.identity import RunIdentity
from otel_train.common.options import DEFAULT, DEFAULT_PROMETHEUS_PORT
from otel_train.recording.recorder import Recorder
from otel_train.derived.sampling import SampledOutCollector
from otel_train.common.self_cost import SelfCostMeter
from otel_train.records.steps_view import SharedStepSpanProcessor, StepViewProcessor
from otel_train.derived.stall_stacks import StallStacks
from otel_train.derived.watchdog import StallWatchdog

_log = logging.getLogger("otel_train")
_DEFAULT_PORT_TRIES = 100  # default port taken: try the next ones, then any free port


@dataclass(frozen=True)
class DerivedSettings:
    """What the stage is built from (pipeline/settings.py ``derived_settings``)."""

    chain: dict[str, Any]  # StepChain's settings: plain data, it crosses the pipe
    metrics: om.MetricsPlan  # Prometheus endpoint, OTLP, both or neither
    at_scale_lines: tuple[str, ...]  # export_ranks / summary mode, for the banner
    console: bool
    budget: float
    critical: float
    budget_action: str
    watchdog_interval_seconds: float
    stall_seconds: float | None
    stall_min_seconds: float
    slow_operation_seconds: float | None
    stall_stacks: Any  # stall_stacks' timer: False, True or seconds
    stall_stacks_signal: Any
    gpu_sample_interval_seconds: float
    costs_interval_seconds: float
    prometheus_host: str
    prometheus_port: Any  # a port, 0 (any free one), None (off) or DEFAULT (9464 + local rank)
    prometheus_port_source: str = "prometheus_port"  # where it was set, for the error
    prometheus_host_source: str = "prometheus_host"


def costs_file_name(identity: RunIdentity) -> str:
    """monitoring_costs.json, or monitoring_costs-rank<N>.json when several ranks share a dir."""
    if identity.world_size == 1:
        return "monitoring_costs.json"
    return f"monitoring_costs-rank{identity.rank}.json"


def targets_paths(status_dir: Path, identity: RunIdentity) -> tuple[Path, Path]:
    """Where Prometheus's file-based discovery finds the run's endpoint.

    Its file discovery globs only the last path element, so every run of a runs root writes
    into one directory: <runs root>/prometheus-targets/<run>-rank<N>.json (a copy in the
    run's own directory says where it was served)."""
    safe_id = re.sub(r"[^A-Za-z0-9_.-]", "_", identity.run_id)
    return (status_dir.parent / "prometheus-targets" / f"{safe_id}-rank{identity.rank}.json",
            status_dir / f"prometheus_targets-rank{identity.rank}.json")


class DerivedMetricsStage:
    """Builds, starts and stops the derived-metrics processors of one run."""

    def __init__(self, settings: DerivedSettings, identity: RunIdentity, status_dir: Path,
                 recorder: Recorder, drops: DropCounter, self_cost: SelfCostMeter,
                 collectors: Sequence[Any] = (),
                 attribute_drops: DropCounter | None = None, sampler_downstream: Any = None,
                 metrics_resource: Resource | None = None) -> None:
        self.stage_settings = options = settings
        self.identity = identity
        self.drops = drops
        self.attribute_drops = attribute_drops or DropCounter()  # device values left out
        self.status_dir = Path(status_dir)
        self.self_cost = self_cost
        self.settings = dict(settings.chain)
        self.costs_path = self.status_dir / costs_file_name(identity)
        # The job envelope: this process's start, and what a previous attempt left (goodput.py).
        self.settings["envelope"] = envelope_settings(
            self.costs_path, now_epoch_ns_of(self_cost.started_ns))
        # The watchdog first: the Prometheus families read its progress (and the drops).
        self.watchdog = self._stall_watchdog(recorder)
        self.chain = StepChain(self.settings, self_cost, sampler_downstream=sampler_downstream,
                               progress=self.watchdog.progress,
                               phase_progress=self.watchdog.phase_progress, drops=drops,
                               gpu_forward=self._forward_gpu_round)
        self.slow, self.overhead = self.chain.slow, self.chain.overhead
        self.budget = self.chain.budget
        self.metrics, self.gpu_steps = self.chain.metrics, self.chain.gpu_steps
        self.console: ConsoleReportSpanProcessor | None = self.chain.console
        chain: list[StepViewProcessor] = self.chain.processors
        self.goodput = self.chain.goodput
        if self.goodput is not None:
            self.metrics.registry.register(GoodputCollector(self.goodput, identity.rank))
        for collector in collectors:  # extra families (the exporter process's CPU)
            self.metrics.registry.register(collector)
        # step.due's intervals in force, and their governor (derived/governor.py).
        self.schedule = recorder.schedule
        self.metrics.registry.register(IntervalCollector(self.schedule, identity.rank))
        # The exporter process's CPU, reported in the costs beside this process's own.
        self._exporter_cpu = [c for c in collectors if hasattr(c, "cpu_seconds")]
        self.otlp_metrics: Any = self._scale_out(chain, metrics_resource)
        # One lock for the chain's processors, held by the governor's reads of them too.
        lock = threading.RLock()
        self.governor = governor_thread(options.budget_action, options.budget, self.schedule,
                                        self.overhead, lock)
        self.gpu_sampler = NvmlGpuSampler(options.gpu_sample_interval_seconds,
                                          on_sample=self.gpu_steps.on_samples)
        self.targets_paths = targets_paths(self.status_dir, identity)
        self._run_over = False  # set at shutdown, before the final costs
        self.costs_writer = CostsFileWriter(self.costs_path, self.costs,
                                            options.costs_interval_seconds)
        self.shared = SharedStepSpanProcessor(chain, lock=lock)
        self.processors: list[SpanProcessor] = [self.shared]
        self.prometheus_url: str | None = None
        self._started = False
        # The exporter process that feeds the chain (run_in_exporter_process), or None.
        self.remote: Any = None
        self.state_loads = 0  # states loaded from the exporter process

    def _typical_step_seconds(self) -> float | None:
        """The watchdog's typical step: the slow-step processor's median (None before it)."""
        return self.chain.slow.median_seconds()

    def _forward_gpu_round(self, row: tuple[int, float | None, int]) -> None:
        """A GPU round's row, to the chain's copy in the exporter process when it feeds the
        chain (``run_in_exporter_process``); nothing otherwise."""
        remote = self.remote
        if remote is not None:
            remote.send_gpu_round(row)

    def _stall_watchdog(self, recorder: Recorder) -> StallWatchdog:
        """The stall watchdog; its typical step is the chain's (read once it runs)."""
        opts = self.stage_settings
        stacks = self._stall_stacks()
        return StallWatchdog(
            recorder, opts.watchdog_interval_seconds, opts.stall_seconds,
            opts.stall_min_seconds, typical_step_seconds=self._typical_step_seconds,
            slow_operation_seconds=opts.slow_operation_seconds,
            stacks=stacks, run_id=self.identity.run_id)

    def _stall_stacks(self) -> StallStacks | None:
        """The stall stacks files (made on the thread that starts the run: the training one)."""
        opts = self.stage_settings
        if not opts.stall_stacks and opts.stall_stacks_signal is None:
            return None
        return StallStacks(self.status_dir / "stalls", self.identity.rank,
                           self.identity.world_size, threading.get_ident(),
                           timer=opts.stall_stacks, signal_name=opts.stall_stacks_signal)

    def run_in_exporter_process(self, client: Any) -> None:
        """Let the exporter process feed the chain; this one becomes its copy.

        ``client`` (export_process.ExportProcessClient) builds the same chain there from
        ``self.settings``, sends its state back once a second (``load_state``), and
        if it dies, feeds this chain from where its last state left it (``feed_records``).
        """
        self.remote = client
        # Until the child is ready, this process feeds the chain (the console's first lines
        # on time), except with tail sampling: the child decides on every step, as its
        # counts of what it left out must match what it was sent.
        client.derive_metrics(self.settings, self.self_cost, on_state=self.load_state,
                              feed=self.feed_records,
                              take_state=self.export_state if self.sampler is None else None)

    def load_state(self, state: dict[str, Any]) -> None:
        """The exporter process's chain state: this copy continues from it."""
        with self.shared.lock:
            self.chain.load_state(state)
            self.state_loads += 1

    def export_state(self) -> dict[str, Any]:
        """This chain's state (for the exporter process, when this one fed it first)."""
        with self.shared.lock:
            return self.chain.export_state()

    def feed_records(self, recs: Sequence[tuple[Any, ...]]) -> None:
        """Span records the exporter process will never see: through this chain."""
        feed_records(self.shared, recs, self.identity.rank)

    def _scale_out(self, chain: list[StepViewProcessor], metrics_resource: Resource | None
                   ) -> StepViewProcessor | None:
        """The tail sampler (the chain's: assembly.py puts it before export, after these
        processors, here or in the exporter process), and metrics over OTLP too
        (otlp_metrics.py), after the Prometheus one, with the run's ``metrics_resource``."""
        self.sampler = self.chain.sampler  # here or in the exporter process (assembly.py)
        if self.sampler is not None:
            self.metrics.registry.register(SampledOutCollector(self.sampler,
                                                               self.identity.rank))
        self.metrics_plan = self.stage_settings.metrics
        if not self.metrics_plan.otlp:
            return None
        if metrics_resource is None:
            raise ValueError("metrics_resource: metrics over OTLP need the run's resource "
                             "(service, run, rank's instance, host, pod)")
        proc = om.OtlpMetricsSpanProcessor(
            om.create_metric_exporter(self.metrics_plan), self.metrics, self.identity.run_id,
            metrics_resource)
        chain.insert(chain.index(self.metrics) + 1, proc)
        return proc

    def scale_out_banner(self) -> str:
        """Start-up lines for metrics over OTLP and sampling ('' when neither is on)."""
        lines = []
        if self.metrics_plan.otlp:
            lines.append(f"  metrics -> {self.metrics_plan.describe()}")
        lines += self.stage_settings.at_scale_lines
        if self.sampler is not None and self.sampler.keep_monitor:
            lines.append(f"  sampled -> {self.sampler.ratio:.0%} of ordinary steps by trace id; "
                         "slow, failed, monitoring and first steps always")
        return "\n".join(lines)

    def start(self) -> None:
        """Start the Prometheus endpoint, then the threads.

        The default port (9464 + local rank) moves to the next free one when taken, with one
        warning; an explicit port that is taken raises ``ValueError`` (it was asked for).
        """
        port = self.stage_settings.prometheus_port
        if not self.metrics_plan.prometheus:  # metrics over OTLP only (plan_metrics)
            port = None
        if port is DEFAULT:
            self.prometheus_url = self._serve_default(self.stage_settings.prometheus_host)
        elif port is not None:
            self.prometheus_url = self._serve(self.stage_settings.prometheus_host, port)
        if self.prometheus_url is not None:
            self._write_targets_file()
        self._started = True
        self.watchdog.start()
        self.gpu_sampler.start()  # False on CPU-only: one info line, no thread
        self.costs_writer.start()
        if self.governor is not None:
            self.governor.start()

    def _serve_default(self, host: str) -> str:
        first = DEFAULT_PROMETHEUS_PORT + self.identity.local_rank
        for port in range(first, first + _DEFAULT_PORT_TRIES):
            try:
                url = self.metrics.start_server(host, port)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    continue
                return self._serve(host, port)  # not a taken port: the usual clear error
            if port != first:
                _log.warning("otel-train: metrics port %d (the default: %d + local rank %d) is "
                             "taken; serving on %s/metrics instead (the run's targets file "
                             "tells Prometheus)", first, DEFAULT_PROMETHEUS_PORT,
                             self.identity.local_rank, url)
            return url
        url = self._serve(host, 0)
        _log.warning("otel-train: metrics ports %d-%d are all taken; serving on %s/metrics",
                     first, first + _DEFAULT_PORT_TRIES - 1, url)
        return url

    def _write_targets_file(self) -> None:
        """Where Prometheus's file-based discovery finds this run (deploy/prometheus)."""
        host, port = self.metrics.bound_address()
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        shown = f"[{host}]" if ":" in host else host
        # Only labels that no exposed metric carries: otherwise Prometheus renames ours.
        entry = {"targets": [f"{shown}:{port}"],
                 "labels": {"otel_train_run": self.identity.run_id}}
        for path in self.targets_paths:
            try:
                write_json_atomic(path, [entry])
            except OSError as exc:
                _log.warning("otel-train: cannot write %s: %r", path, exc)

    def _serve(self, host: str, port: int) -> str:
        opts = self.stage_settings
        try:
            return self.metrics.start_server(host, port)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                how = (f" (the default: {DEFAULT_PROMETHEUS_PORT} + local rank "
                       f"{self.identity.local_rank})"
                       if opts.prometheus_port is DEFAULT else "")
                raise ValueError(
                    f"{opts.prometheus_port_source}: port {port}{how} on {host} is already "
                    "in use; choose another with prometheus_port= or OTEL_TRAIN_PROMETHEUS_PORT, "
                    "0 for a free port, or None to turn the metrics endpoint off") from exc
            raise ValueError(
                f"{opts.prometheus_host_source}={host!r} with {opts.prometheus_port_source}"
                f"={port}: cannot serve metrics there: {exc}") from exc

    def costs(self) -> CostsReport:
        """What monitoring cost so far (monitoring_costs.json's content; str() is the table)."""
        with self.shared.lock:
            snapshot = self.overhead.snapshot()
            slow_steps = self.slow.slow_steps
            slow_ops = dict(self.budget.slow_operations)
            # The console's rule, for the table; once the run is over, an operation seen at
            # one step only is a one-off (a final evaluation), not waiting for a second call.
            evidence_gap = self.budget.evidence_gap(run_over=self._run_over)
            envelope = self.goodput.envelope() if self.goodput is not None else None
        data = build_costs(snapshot, self.stage_settings.budget, self.stage_settings.critical,
                           slow_steps=slow_steps, slow_operations=slow_ops,
                           run_id=self.identity.run_id,
                           governing=self.schedule.describe())
        if data["rank"] is None:
            data["rank"] = self.identity.rank
        data["verdict_evidence"] = evidence_gap
        data["dropped_spans"] = self.drops.counts()
        data["dropped_attributes"] = self.attribute_drops.counts()
        if envelope is not None:
            data["envelope"] = envelope
        seconds = startup = None
        for source in self._exporter_cpu:
            seconds = source.cpu_seconds()
            if seconds is not None:
                # Another process, on another core: not in this process's time, but
                # otel-train's cost all the same.
                # Rounded first, so the per-step figure is exactly what the two fields give.
                seconds = round(seconds, 6)
                startup = round(min(seconds, source.startup_cpu_seconds() or 0.0), 6)
                data["exporter_process_cpu_seconds"] = seconds
                data["exporter_process_startup_cpu_seconds"] = startup
                data["exporter_process_cpu_seconds_per_step"] = (
                    (seconds - startup) / snapshot.steps if snapshot.steps else None)
            ring_counts = getattr(source, "step_ring_counts", None)
            ring = ring_counts() if ring_counts is not None else None
            if ring is not None:  # the exporter process reads the step ring
                ring["full_dropped_spans"] = data["dropped_spans"].get("step_ring_full", 0)
                data["step_ring"] = ring
            corrupt = source.corrupt_report_frames()
            if corrupt:
                data["exporter_process_corrupt_report_frames"] = corrupt
        add_own_cost(data, self.self_cost.figures(seconds, startup))
        return data

    def after_fork_in_child(self) -> None:
        """In a forked child: close the inherited metrics socket; start nothing, join nothing."""
        self._started = False
        self.metrics.close_inherited_socket()
        if self.otlp_metrics is not None:
            self.otlp_metrics.after_fork_in_child()

    def shutdown(self, timeout_seconds: float) -> None:
        """Final monitoring_costs.json, then stop threads and the endpoint, within the bound."""
        deadline = time.monotonic() + max(0.0, timeout_seconds)

        def left(share: float) -> float:
            return max(0.0, (deadline - time.monotonic()) * share)

        if self.otlp_metrics is not None:
            self.otlp_metrics.shutdown_within(left(0.5))  # the final push, bounded
        if not self._started:
            self.metrics.stop_server(left(1.0))
            return
        self._started = False
        if self.governor is not None:
            self.governor.stop(left(0.1))  # its last changes said before the final costs
        self._run_over = True  # the final costs: no operation will run again
        self.costs_writer.stop(left(0.3))  # joins, then the final write
        self.watchdog.stop(left(0.3))
        self.gpu_sampler.stop(left(0.3))
        self.shared.shutdown()  # the processors' last lines (the slow steps not yet said)
        if self.stage_settings.console and self.goodput is not None:
            # The run's last console line, after everything said about its steps.
            print(f"otel-train: {envelope_line(self.costs().get('envelope') or {})}",
                  file=sys.stderr, flush=True)
        if self.prometheus_url is not None:
            for path in self.targets_paths:
                try:
                    path.unlink()  # the run is over: Prometheus stops scraping it
                except OSError:
                    pass
        self.metrics.stop_server(left(1.0))
