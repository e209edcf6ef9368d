"""The public entry point: ``start_run`` and the ``Run`` it returns.

Usage::

    import otel_train

    with otel_train.start_run(service_name="tiny-gpt", budget=0.05) as run:
        for step in run.steps(train_loader, loader="train"):
            with step.phase("forward"):
                loss = model(step.batch)
            with step.phase("backward"):
                loss.backward()
            with step.phase("optimizer"):
                opt.step(); opt.zero_grad()
            step.set_attribute("train.loss", loss)
            if step.index % 200 == 0:
                with step.monitor("inference"):
                    model.generate(...)
        print(run.costs())
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from time import perf_counter_ns
from typing import Any

from opentelemetry import context as context_api
from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_train.attributes import INSTRUMENTATION_SCOPE, KIND_TRAIN, PHASE_DATA
from otel_train.context import ActivePhaseSpan
from otel_train.device import DeviceTiming, resolve_device_timing
from otel_train.drop_counter import DropCounter
from otel_train.export import BoundedBatchSpanProcessor
from otel_train.global_provider import global_provider_for_run
from otel_train.identity import RunIdentity, resolve_identity
from otel_train.options import RunOptions
from otel_train.recorder import MonitorRecord, Phase, Recorder, Step
from otel_train.sdk_config import (
    ExportPlan,
    build_resource,
    build_sampler,
    create_exporter,
    plan_export,
    sdk_disabled,
)
from otel_train.self_cost import SelfCostMeter
from otel_train.span_builder import (
    SpanBuildWorker,
    StepSpanBuilder,
    epoch_offset_ns,
    new_span_id,
)
from otel_train.version import __version__

_log = logging.getLogger("otel_train")
_HELD_STEP_GRACE_NS = 1_000_000_000


def start_run(**options: Any) -> Run:
    """Start a run. Options are keyword arguments, each also read from OTEL_TRAIN_<NAME>.

    Raises ``ValueError`` naming the option and the rule when an option is bad, and when
    the Prometheus port is taken.
    """
    return Run(RunOptions.resolve(**options))


class _ActiveSpanProcessorSink(SpanProcessor):
    """Hands our built spans to an application's TracerProvider pipeline."""

    def __init__(self, provider: TracerProvider) -> None:
        self._target = getattr(provider, "_active_span_processor", None)

    def on_end(self, span: Any) -> None:
        if self._target is not None:
            self._target.on_end(span)


class Run:
    """One training run: steps, phases, monitoring, and the telemetry they produce."""

    def __init__(self, options: RunOptions) -> None:
        self.options = options
        self._closed = False
        self._lock = threading.Lock()
        self.identity: RunIdentity = resolve_identity(
            options.run_id, options.rank, options.world_size, options.local_rank)
        ident = self.identity
        self.status_dir = Path(options.status_dir or Path("otel-train-runs") / ident.run_id)
        self.device: DeviceTiming = resolve_device_timing(options.device_sync)
        self.drops = DropCounter()
        self.self_cost = SelfCostMeter(_calibrate_hot_path_ns_per_span())
        self._recorder = Recorder(options.max_queued_steps, self.drops, self.device.synchronize,
                                  self.device.make_event)

        # -- tracing pipeline -------------------------------------------------------------
        self.export_plan: ExportPlan = plan_export(
            options, self.status_dir, ident.rank, ident.world_size)
        disabled = sdk_disabled()
        mode, provider = ("disabled", None) if disabled else global_provider_for_run()
        self._provider_mode = mode
        self._global = provider if mode == "ours" else None
        identity_attrs = {"service.instance.id": f"{ident.run_id}/rank{ident.rank}"}
        if mode == "app":
            resource = provider.resource
            sampler: Sampler = provider.sampler
        else:
            resource = build_resource(options.service_name, identity_attrs)
            sampler = build_sampler()
        self.resource = resource
        exporter = None
        if mode != "app" or options.sources.get("exporter"):
            exporter = create_exporter(self.export_plan)
        elif mode == "app":
            self.export_plan = ExportPlan("application TracerProvider")
        self._export: BoundedBatchSpanProcessor | None = None
        if exporter is not None:
            self._export = BoundedBatchSpanProcessor(
                exporter, self.drops, options.max_queued_spans, options.export_batch_size,
                options.export_interval_seconds)
        self._sdk_provider: TracerProvider | None = None
        if mode == "ours":
            self._sdk_provider = TracerProvider(resource=resource, sampler=sampler,
                                                shutdown_on_exit=False)
            if self._export is not None:
                self._sdk_provider.add_span_processor(self._export)
        is_sampled = _sampling_function(sampler)

        # -- derived metrics (overhead, budget, slow steps, console, Prometheus) ----------
        from otel_train.derived_metrics import DerivedMetricsStage
        self._pipeline = DerivedMetricsStage(
            options, ident, self.status_dir, self._recorder, self.drops, self.self_cost)
        sinks: list[SpanProcessor] = list(self._pipeline.processors)
        if self._export is not None:
            sinks.append(self._export)
        if mode == "app":
            sinks.append(_ActiveSpanProcessorSink(provider))

        scope = InstrumentationScope(INSTRUMENTATION_SCOPE, __version__)
        self._builder = StepSpanBuilder(ident, resource, scope, self.device.synced,
                                        self.device.device_type, is_sampled, epoch_offset_ns())
        self._worker = SpanBuildWorker(self._recorder, self._builder, sinks, self.drops,
                                       self.self_cost)
        try:
            self._pipeline.start()  # may raise: e.g. the Prometheus port is taken
        except BaseException:
            if self._export is not None:
                self._export.shutdown(0.5)
            raise
        self._worker.start()
        if self._global is not None:
            self._global.activate(self._sdk_provider)

        # User spans opened inside a phase nest under it: one proxy span, attached once.
        self._proxy = ActivePhaseSpan(self._recorder, ident.run_id, new_span_id, is_sampled)
        self._context_token = context_api.attach(
            trace_api.set_span_in_context(self._proxy))
        self._context_thread = threading.get_ident()
        atexit.register(self._atexit)
        self._banner()

    # -- public API ---------------------------------------------------------------------
    @property
    def run_id(self) -> str:
        """The run id every rank shares."""
        return self.identity.run_id

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self.identity.rank

    @property
    def world_size(self) -> int:
        """The number of ranks."""
        return self.identity.world_size

    @property
    def prometheus_url(self) -> str | None:
        """Base URL of the metrics endpoint (``/metrics`` under it), or None when off."""
        return self._pipeline.prometheus_url

    @property
    def spans_path(self) -> Path | None:
        """The local span file when spans go to one."""
        return self.export_plan.path

    @property
    def current_step(self) -> Step | None:
        """The step in progress, if any."""
        return self._recorder.current

    def steps(self, iterable: Iterable[Any], loader: str | None = "train") -> Iterator[Step]:
        """Yield a Step per item of ``iterable``; fetching the item is the ``data`` phase."""
        self._check_open("steps")
        return self._steps(iterable, loader)

    def _steps(self, iterable: Iterable[Any], loader: str | None) -> Iterator[Step]:
        # The per-step path of most training loops: kept flat (no helper calls) on purpose.
        rec = self._recorder
        sync = rec.synchronize  # the step's start already synchronized: data starts clean
        plain = rec.plain
        queue = rec.queue
        data = rec.phase(PHASE_DATA, KIND_TRAIN)  # its loader is the step's
        it = iter(iterable)
        while True:
            if rec.held is not None:
                self._release_held()
            if rec.closed:
                return
            cur = rec.current
            if cur is not None and not cur.end_ns:
                raise _nested(cur)
            index = rec.next_index
            rec.next_index = index + 1
            step = Step(rec, index, loader, data)  # the data phase opens with the step
            try:
                batch = next(it)
            except StopIteration:
                rec.current = rec.ev = None  # no batch, no step
                rec.next_index = index
                return
            except BaseException as exc:
                step.ev.extend((perf_counter_ns(), exc))
                step._finish(exc)
                raise
            if sync is not None:
                sync()  # explicit: device work of the fetch (e.g. a copy) counts as data
            step.ev.extend((perf_counter_ns(), None))
            step.batch = batch
            try:
                yield step
            except GeneratorExit:
                # The loop was left: by ``break`` or by an exception in its body. Hold the
                # step until the next event so Run.__exit__ can still mark it failed.
                step._finish(None, hold=True)
                raise
            except BaseException as exc:
                step._finish(exc)
                raise
            if plain and not step.end_ns and rec.current is step and len(queue) < rec.max_queued:
                # Step._finish's common case, inlined: host clock, no error, room in the queue.
                step.end_ns = end = perf_counter_ns()
                del step.phase, step.monitor  # back to the methods that refuse an ended step
                step.batch = None
                rec.current = rec.ev = None
                rec.last_step_end_ns = end
                queue.append(step)
            else:
                step._finish(None)

    def step(self, loader: str | None = None, index: int | None = None,
             start_ns: int | None = None) -> Step:
        """A step for loops that fetch their own data (``with run.step() as step:``).

        ``start_ns`` (a ``perf_counter_ns`` value) backdates the start to an event already
        seen, for integrations that learn a step began only after it did.
        """
        self._check_open("step")
        self._release_held()
        step = self._begin_step(loader, index)
        if start_ns is not None and start_ns < step.start_ns:
            step.start_ns = start_ns
        return step

    def timestamp_ns(self) -> int:
        """A phase-boundary timestamp (``perf_counter_ns``), synchronizing per device_sync."""
        sync = self.device.synchronize
        if sync is not None:
            sync()  # explicit: the run's device_sync choice, as at every phase boundary
        return perf_counter_ns()

    def phase(self, name: str) -> Phase:
        """A training phase of the current step."""
        step = self._recorder.current
        if step is None:
            raise RuntimeError(
                f"run.phase({name!r}) called outside a step: use it inside "
                "`for step in run.steps(...)` or `with run.step() as step:`")
        return step.phase(name)

    def monitor(self, name: str) -> Phase | MonitorRecord:
        """Monitoring work: a phase of the current step, or its own span between steps."""
        step = self._recorder.current
        if step is not None and not step.end_ns:
            return step.monitor(name)
        self._check_open("monitor")
        return MonitorRecord(self._recorder, name)

    def costs(self) -> dict[str, Any]:
        """What monitoring cost so far (the content of monitoring_costs.json)."""
        self._worker.drain()  # fold in steps still queued, so the answer is current
        return self._pipeline.costs()

    def flush(self, timeout_seconds: float = 5.0) -> bool:
        """Build and export everything recorded so far; True when it all went out."""
        self._release_held()
        self._worker.drain()
        ok = True
        for proc in self._pipeline.processors:
            ok = proc.force_flush(int(timeout_seconds * 1000)) and ok
        if self._export is not None:
            ok = self._export.force_flush(int(timeout_seconds * 1000)) and ok
        return ok

    def dropped_spans(self) -> dict[str, int]:
        """Spans dropped so far, by reason."""
        return self.drops.counts()

    def shutdown(self, timeout: float | None = None) -> None:
        """Flush and stop everything within ``timeout`` seconds (default: the option)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        budget = self.options.shutdown_timeout_seconds if timeout is None else timeout
        deadline = time.monotonic() + max(0.0, budget)
        rec = self._recorder
        step = rec.current
        if step is not None and not step.end_ns:
            step._finish(None)
        self._release_held()
        rec.closed = True
        # Build what is queued (most of the budget), then final metrics, then export.
        self._worker.stop(max(0.0, (deadline - time.monotonic()) * 0.5))
        try:
            self._pipeline.shutdown(max(0.05, (deadline - time.monotonic()) * 0.3))
        except Exception as exc:
            _log.warning("otel-train: metrics shutdown failed: %r", exc)
        if self._export is not None:
            self._export.shutdown(max(0.0, deadline - time.monotonic()))
        if self._global is not None and self._global.current is self._sdk_provider:
            self._global.activate(None)
        if threading.get_ident() == self._context_thread:
            try:
                context_api.detach(self._context_token)
            except Exception:
                pass  # contexts attached after ours were not detached: leave them be
        try:
            atexit.unregister(self._atexit)
        except Exception:
            pass
        dropped = self.drops.total
        if dropped:
            _log.warning("otel-train: %d span(s) were dropped during this run: %s",
                         dropped, self.drops.counts())

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        rec = self._recorder
        if exc is not None:
            step = rec.current
            if step is not None and not step.end_ns:
                step._finish(exc)
            self._release_held(exc)
        self.shutdown()
        return False

    # -- internals ----------------------------------------------------------------------
    def _check_open(self, what: str) -> None:
        if self._closed:
            raise RuntimeError(f"run.{what}() called after the run was shut down")

    def _begin_step(self, loader: str | None, index: int | None) -> Step:
        rec = self._recorder
        cur = rec.current
        if cur is not None and not cur.end_ns:
            raise _nested(cur)
        if index is None:
            index = rec.next_index
        rec.next_index = index + 1
        return Step(rec, index, loader)  # becomes rec.current

    def _release_held(self, error: BaseException | None = None) -> None:
        if self._recorder.held is not None:
            with self._lock:
                self._recorder.release_held(error)

    def _atexit(self) -> None:
        self.shutdown()

    def _banner(self) -> None:
        ident = self.identity
        lines = [
            f"otel-train: run {ident.run_id} rank {ident.rank}/{ident.world_size}",
            f"  spans   -> {self.export_plan.describe()}",
            f"  metrics -> {self.prometheus_url + '/metrics' if self.prometheus_url else 'off'}",
            f"  timing  -> {self.device.describe()}",
        ]
        if self._provider_mode == "disabled":
            lines.append("  tracing export disabled by OTEL_SDK_DISABLED")
        text = "\n".join(lines)
        if self.options.console:
            print(text, file=sys.stderr, flush=True)
        else:
            _log.info(text)


def _nested(cur: Step) -> RuntimeError:
    return RuntimeError(
        f"step {cur.index} is still in progress: steps do not nest (end it first)")


def _sampling_function(sampler: Sampler) -> Any:
    """trace id -> sampled? Constant when the sampler always samples (the usual case)."""
    if sampler is ALWAYS_ON or (isinstance(sampler, ParentBased)
                                and getattr(sampler, "_root", None) is ALWAYS_ON):
        return lambda trace_id: True

    def is_sampled(trace_id: int) -> bool:
        try:
            return sampler.should_sample(None, trace_id, "train.step").decision.is_sampled()
        except Exception:
            return True
    return is_sampled


def _calibrate_hot_path_ns_per_span(rounds: int = 200) -> float:
    """Measure this machine's CPU cost of one recorded phase (for the self-cost gauge)."""
    from time import thread_time_ns

    from otel_train.drop_counter import DropCounter as _DC
    rec = Recorder(rounds + 1, _DC(), None)
    t0 = thread_time_ns()
    for i in range(rounds):
        step = Step(rec, i, None)
        with step.phase("a"):
            pass
        step._finish(None)
        rec.queue.clear()
    cost = (thread_time_ns() - t0) / (rounds * 2)
    return max(cost, 0.0)
