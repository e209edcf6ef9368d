"""The chain of derived-metrics processors, built the same way in either process.

Each step's view goes, in order, to: slow steps (marks ``train.slow`` first, so everything
after sees it), GPU step attributes, Prometheus histograms and counters, device, comm,
goodput, then overhead, budget, throughput and the console report. From span records (a
frame in the exporter process, a drain in the training process:
``SharedStepSpanProcessor.on_views``), each processor takes the whole frame in turn, in that
order, except the last four, which take it view by view together, so a console line reads
the figures as of its own step. Without the console, the budget alone reads another's
figures as of a step (the overhead's, at its status checks and slow operations): the
overhead and the budget then take a frame of steps in one loop, the overhead's
(``BudgetSpanProcessor.take_group``), and the throughput takes it whole after them.
``DerivedMetricsStage`` (derived/stage.py) builds this chain
in the training process; with the exporter process (export/process/child.py) and
``metrics_in_export_process`` on, the exporter process builds it too from the same
``chain_settings`` (pipeline/settings.py) and feeds it, and the training process's chain becomes a copy: it loads
the state the exporter process sends once a second (``StepChain.load_state``) and
serves ``/metrics``, ``run.costs()`` and the watchdog's typical step from it. Nothing in the
training process then spends its GIL on these processors; if the exporter process dies,
the copy takes over from its last state.

Usage::

    settings = chain_settings(options, identity)  # pipeline/settings.py: plain data, it crosses the pipe
    chain = StepChain(settings, self_cost)
    shared = SharedStepSpanProcessor(chain.processors)
    shared.on_views(views)                                # a frame of StepViews, in order
    other = StepChain(settings, self_cost); other.load_state(chain.export_state())
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from otel_train.derived.budget import BudgetSpanProcessor
from otel_train.derived.device_metrics import DeviceMetricsSpanProcessor
from otel_train.derived.comm_metrics import CommMetricsSpanProcessor
from otel_train.derived.console import ConsoleReportSpanProcessor
from otel_train.derived.goodput import GoodputSpanProcessor
from otel_train.derived.gpu_step_attributes import GpuStepAttributeSpanProcessor
from otel_train.derived.overhead import OverheadSpanProcessor
from otel_train.common.drop_counter import DropCounter
from otel_train.derived.prometheus_metrics import PrometheusMetricsSpanProcessor, ProgressSource
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.derived.sampling import StepTailSampler, build_step_sampler
from otel_train.derived.slow_steps import SlowStepSpanProcessor
from otel_train.derived.step_ordered_log import StepOrderedLog
from otel_train.derived.throughput import ThroughputCollector, ThroughputSpanProcessor
from otel_train.records.span_rows import views_from_records
from otel_train.records.steps_view import SharedStepSpanProcessor, StepViewProcessor

_warn = RateLimitedLogger(logging.getLogger("otel_train"))


def feed_records(shared: SharedStepSpanProcessor, recs: Sequence[tuple[Any, ...]],
                 rank: Any) -> None:
    """The span records' views through the chain, in order, a frame at a time
    (``SharedStepSpanProcessor.on_views``); a bad record is skipped."""
    views = views_from_records(recs, rank, _view_failed)
    if views:
        shared.on_views(views)  # never raises: it guards each processor


def _view_failed(exc: Exception) -> None:
    _warn.warning("record", "otel-train: a step's metrics failed: %r", exc)


class StepChain:
    """The derived-metrics processors of one run, in order, and their state as plain data."""

    def __init__(self, settings: dict[str, Any], self_cost: Any,
                 console_stream: TextIO | None = None,
                 sampler_downstream: Any = None, progress: ProgressSource | None = None,
                 phase_progress: Callable[[], tuple[str, float]] | None = None,
                 drops: DropCounter | None = None,
                 gpu_forward: Callable[[tuple[int, float | None, int]], None] | None = None
                 ) -> None:
        s = settings
        window, warmup, world = s["window"], s["warmup"], s["world_size"]
        # With the console on, the slow-step and budget warnings wait for the console's
        # lines of their step (step_ordered_log.py): one stream, in step order.
        ordered = StepOrderedLog(logging.getLogger("otel_train")) if s["console"] else None
        self.slow = SlowStepSpanProcessor(s["slow_step_factor"], s["slow_step_seconds"], window,
                                          warmup_steps=warmup, world_size=world,
                                          explain=s["console"], logger=ordered)
        self.overhead = OverheadSpanProcessor(window, self_cost, warmup_steps=warmup)
        self.budget = BudgetSpanProcessor(self.overhead, s["budget"], s["critical"],
                                          s["slow_operation_seconds"], world_size=world,
                                          logger=ordered)
        # ``progress`` and ``phase_progress`` (the watchdog) and ``drops``: from the stage
        # that serves the families (None in the exporter process, which serves none).
        self.metrics = PrometheusMetricsSpanProcessor(
            s["rank"], s["budget"], self.overhead, progress, drops, critical=s["critical"],
            phase_progress=phase_progress,
            slow_step_factor=s["slow_step_factor"],
            slow_operation_seconds=s["slow_operation_seconds"], run_id=s["run_id"],
            world_size=world,
            histogram_rank_label=s.get("metrics_rank_label", "all") == "all")
        self.gpu_steps = GpuStepAttributeSpanProcessor(on_latest=self.metrics.set_gpu_samples,
                                                       forward=gpu_forward)
        self.device = DeviceMetricsSpanProcessor(s["rank"])  # device busy/idle, bound, memory
        self.metrics.registry.register(self.device.collector())
        self.comm = CommMetricsSpanProcessor()  # collectives and own work (comm_metrics.py)
        self.comm.register_on(self.metrics.registry)
        self.console: ConsoleReportSpanProcessor | None = None
        self.throughput = ThroughputSpanProcessor(s["rank"], window, **s.get("throughput", {}))
        self.metrics.registry.register(ThroughputCollector(self.throughput))
        # The job envelope and goodput (goodput.py); absent from settings built by hand.
        self.goodput = (GoodputSpanProcessor(s["envelope"]) if s.get("envelope") else None)
        self.processors: list[StepViewProcessor] = [self.slow, self.gpu_steps, self.metrics,
                                                    self.device, self.comm]
        if self.goodput is not None:
            self.processors.append(self.goodput)
        # Last, fed view by view as a group (``view_by_view``): the console's line of a step
        # reads the overhead, the budget and the throughput as of that step.
        self.processors += [self.overhead, self.budget, self.throughput]
        if s["console"]:
            self.console = ConsoleReportSpanProcessor(
                s["log_every"], self.overhead, self.budget, stream=console_stream,
                breakdown_min_share=s["console_breakdown_min_share"],
                eval_operations=s["eval_operations"], warmup_steps=warmup, world_size=world,
                min_interval_seconds=s["console_min_interval_seconds"], ordered_log=ordered,
                throughput=self.throughput)
            self.processors.append(self.console)
        # The tail sampler (sampling.py): not a view processor, it decides on each step's
        # record after them (the worker here, or the exporter process, filter_frame).
        self.sampler: StepTailSampler | None = build_step_sampler(s, sampler_downstream)
        self._stateful = self._stateful_parts()

    def _stateful_parts(self) -> dict[str, Any]:
        """The processors whose running figures ``export_state`` carries, by role."""
        parts: dict[str, Any] = {"slow": self.slow, "overhead": self.overhead,
                                 "budget": self.budget, "metrics": self.metrics,
                                 "device": self.device, "comm": self.comm,
                                 "throughput": self.throughput, "console": self.console,
                                 "sampler": self.sampler, "goodput": self.goodput}
        return {role: proc for role, proc in parts.items() if proc is not None}

    def export_state(self) -> dict[str, Any]:
        """Every processor's running figures (take the chain's shared lock around it)."""
        return {role: proc.export_state() for role, proc in self._stateful.items()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from another chain's ``export_state`` (take the shared lock around it)."""
        for role, proc in self._stateful.items():
            if role in state:
                proc.load_state(state[role])
