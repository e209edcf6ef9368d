"""Prometheus metrics of the telemetry contract, on a registry and HTTP server of our own.

The histograms and counters are kept as plain numbers updated once per step (a bisect and
two additions per observation, no per-sample locks); a custom collector turns them into
metric families when Prometheus scrapes. Gauges that describe "now" (overhead ratios, step
in progress, last step time, drops, GPU) are read at scrape time from their source, so a
stuck step is visible even though its span has not ended. ``otel_train_step_duration_seconds``
carries the step's trace id as an OpenMetrics exemplar on the bucket it fell in.

Never the global registry: every run has its own ``CollectorRegistry``.

Usage::

    metrics = PrometheusMetricsSpanProcessor(rank=0, budget=0.05, overhead=overhead,
                                             critical=0.10, run_id="run-1", world_size=8)
    provider.add_span_processor(metrics)
    url = metrics.start_server("127.0.0.1", 0)      # "http://127.0.0.1:PORT"
    ...
    metrics.stop_server()
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from otel_train.common import attributes as A
from otel_train.common.drop_counter import DROP_REASONS, DropCounter
from otel_train.derived.metrics_rank_label import without_rank
from otel_train.derived.overhead import OverheadSpanProcessor
from otel_train.records.steps_view import (P_DURATION, P_KEY, P_KIND, P_LOADER, P_NAME,
                                           StepView, StepViewProcessor)

# Seconds. 30 must be a bound: the "one monitoring call > 30 s" alert reads le="30".
DEFAULT_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0, 1800.0,
)

# The old meaning of the overhead ratio (monitoring / wall time), under its own name.
# (A contract name: belongs with the others in attributes.py when that file is free.)
METRIC_MONITORING_WALL_SHARE = "otel_train_monitoring_wall_share_ratio"

# (in-progress seconds, last step end as unix seconds); from the watchdog
# The running phase of the step in progress: the stall alert carries it as a label.
# (A contract name: belongs with the others in attributes.py when that file is free.)
METRIC_PHASE_IN_PROGRESS = "otel_train_step_phase_in_progress_seconds"
ProgressSource = Callable[[], tuple[float, float]]

# The run's thresholds, exported so alerts compare against the run's own values (same labels
# as the budget gauge), and the run's identity (joins a rank's series to its run's other ranks).
METRIC_CRITICAL = "otel_train_monitoring_critical_ratio"
METRIC_SLOW_STEP_FACTOR = "otel_train_slow_step_factor"
METRIC_SLOW_OPERATION = "otel_train_slow_operation_seconds"
METRIC_RUN_INFO = "otel_train_run_info"


_NO_RANK = object()  # no rank seen yet (on_steps)
_NO_PHASE = (_NO_RANK, _NO_RANK, _NO_RANK, None)  # no phase at this position yet (on_steps)


class _Histogram:
    """Non-cumulative bucket counts, sum, and the last exemplar per bucket (optional)."""

    __slots__ = ("counts", "total", "exemplars")

    def __init__(self, n: int, exemplars: bool) -> None:
        self.counts = [0] * (n + 1)  # the last one is +Inf
        self.total = 0.0
        self.exemplars: list[tuple[int, float, float] | None] | None = (
            [None] * (n + 1) if exemplars else None)


class PrometheusMetricsSpanProcessor(StepViewProcessor):
    """Feeds the contract's metrics from step views; serves them on its own registry."""

    def __init__(
        self,
        rank: Any = 0,
        budget: float | None = None,
        overhead: OverheadSpanProcessor | None = None,
        progress: ProgressSource | None = None,
        drops: DropCounter | None = None,
        buckets: Sequence[float] = DEFAULT_BUCKETS,
        critical: float | None = None,
        slow_step_factor: float | None = None,
        slow_operation_seconds: float | None = None,
        run_id: str | None = None,
        world_size: int | None = None,
        phase_progress: Callable[[], tuple[str, float]] | None = None,
        histogram_rank_label: bool = True,
    ) -> None:
        super().__init__()
        bounds = tuple(float(b) for b in buckets)
        if not bounds or list(bounds) != sorted(set(bounds)) or bounds[-1] == float("inf"):
            raise ValueError("buckets must be finite, increasing and non-empty")
        if slow_operation_seconds is not None and slow_operation_seconds not in bounds:
            # The "one monitoring call too long" alert reads the bucket whose le is the limit.
            bounds = tuple(sorted((*bounds, float(slow_operation_seconds))))
        self._bounds = bounds
        self._le = [floatToGoString(b) for b in bounds] + ["+Inf"]
        self.rank = str(rank)
        # False: the step and phase histograms drop rank
        self.histogram_rank_label = histogram_rank_label
        self.budget = budget
        self.critical = critical
        self.slow_step_factor = slow_step_factor
        self.slow_operation_seconds = slow_operation_seconds
        self.run_id = run_id
        self.world_size = world_size
        self.overhead = overhead
        self.progress = progress
        # (running phase or '', seconds in it); from the watchdog too
        self.phase_progress = phase_progress
        self.drops = drops
        self._steps: dict[str, _Histogram] = {}
        # rank -> (phase, kind, loader or None) -> histogram
        self._phases: dict[str, dict[tuple[Any, ...], _Histogram]] = {}
        self._steps_total: dict[str, int] = {}
        self._slow_total: dict[str, int] = {}
        self._last_end_s: dict[str, float] = {}
        self._gpu: dict[str, tuple[float | None, int]] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.url: str | None = None

    # -- feeding (background thread, under the lock) ----------------------------------
    def on_step(self, view: StepView) -> None:
        """Observe the step and each of its phases."""
        rank = str(view.rank)
        bounds = self._bounds
        seconds = view.duration_ns / 1e9
        hist = self._steps.get(rank)
        if hist is None:
            hist = self._steps[rank] = _Histogram(len(bounds), exemplars=True)
            self._steps_total[rank] = 0
            self._slow_total[rank] = 0
            self._phases.setdefault(rank, {})
        i = bisect_left(bounds, seconds)
        hist.counts[i] += 1
        hist.total += seconds
        end_s = view.end_ns / 1e9
        hist.exemplars[i] = (view.trace_id, seconds, end_s)  # type: ignore[index]
        self._steps_total[rank] += 1
        if view.slow:
            self._slow_total[rank] += 1
        self._last_end_s[rank] = end_s
        phases = self._phases[rank]
        for ph in view.phases:
            key = ph[P_KEY]
            h = phases.get(key)
            if h is None:
                h = phases[key] = _Histogram(len(bounds), exemplars=False)
            s = ph[P_DURATION] / 1e9
            h.counts[bisect_left(bounds, s)] += 1
            h.total += s

    def on_steps(self, views: Sequence[StepView],
                 failed: Callable[[StepViewProcessor, StepView, Exception], None]) -> None:
        """A frame of steps: ``on_step`` on each, its lookups made once a frame (the
        rank's histograms and counters while the rank stays the same), and each phase's
        histogram found by its position: the same name, kind and loader objects as the
        phase there in the step before (steps repeat their phases) take that one's, no
        key made and hashed."""
        bounds, last_end, steps_total = self._bounds, self._last_end_s, self._steps_total
        rank_obj: Any = _NO_RANK
        rank = ""
        hist = phases = None
        at: list[Any] = []  # by position: (name, kind, loader, histogram) of the last step
        for view in views:
            try:
                if view.rank is not rank_obj:
                    rank, at = str(view.rank), []
                    if rank not in self._steps:
                        rank_obj = _NO_RANK
                        self.on_step(view)  # the rank's first step makes its figures
                        continue
                    hist, phases = self._steps[rank], self._phases[rank]
                    rank_obj = view.rank
                seconds = view.duration_ns / 1e9
                i = bisect_left(bounds, seconds)
                hist.counts[i] += 1  # type: ignore[union-attr]
                hist.total += seconds  # type: ignore[union-attr]
                end_s = view.end_ns / 1e9
                hist.exemplars[i] = (view.trace_id, seconds, end_s)  # type: ignore[union-attr, index]
                steps_total[rank] += 1
                if view.slow:
                    self._slow_total[rank] += 1
                last_end[rank] = end_s
                k, step_phases = 0, view.phases
                if len(at) < len(step_phases):
                    at += [_NO_PHASE] * (len(step_phases) - len(at))
                for ph in step_phases:
                    c = at[k]
                    if (ph[P_NAME] is c[0] and ph[P_KIND] is c[1]  # the key's, by identity
                            and ph[P_LOADER] is c[2]):
                        h = c[3]
                    else:
                        key = ph[P_KEY]
                        h = phases.get(key)  # type: ignore[union-attr]
                        if h is None:
                            h = phases[key] = _Histogram(len(bounds), exemplars=False)  # type: ignore[index]
                        at[k] = (*key, h)
                    k += 1
                    s = ph[P_DURATION] / 1e9
                    h.counts[bisect_left(bounds, s)] += 1
                    h.total += s
            except Exception as exc:
                failed(self, view, exc)

    def on_operation(self, view: StepView) -> None:
        """Monitoring between steps: a monitor phase without a loader."""
        phases = self._phases.setdefault(str(view.rank), {})
        key = (view.name, A.KIND_MONITOR, view.loader)
        h = phases.get(key)
        if h is None:
            h = phases[key] = _Histogram(len(self._bounds), exemplars=False)
        s = view.duration_ns / 1e9
        h.counts[bisect_left(self._bounds, s)] += 1
        h.total += s

    def export_state(self) -> dict[str, Any]:
        """Histograms and counters as plain data (GPU readings are fed on each side)."""
        def hist(h: _Histogram) -> tuple[Any, ...]:
            return (list(h.counts), h.total, None if h.exemplars is None else list(h.exemplars))
        return {
            "steps": {rank: hist(h) for rank, h in self._steps.items()},
            "phases": {rank: [(key, hist(h)) for key, h in by_key.items()]
                       for rank, by_key in self._phases.items()},
            "steps_total": dict(self._steps_total), "slow_total": dict(self._slow_total),
            "last_end_s": dict(self._last_end_s),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from ``export_state``'s figures (same buckets)."""
        def hist(data: tuple[Any, ...]) -> _Histogram:
            counts, total, exemplars = data
            if len(counts) != len(self._bounds) + 1:
                raise ValueError("histogram state has other buckets")
            h = _Histogram(len(self._bounds), exemplars is not None)
            h.counts, h.total = list(counts), total
            if exemplars is not None:
                h.exemplars = [tuple(e) if e is not None else None for e in exemplars]
            return h
        self._steps = {rank: hist(h) for rank, h in state["steps"].items()}
        self._phases = {rank: {tuple(key): hist(h) for key, h in pairs}
                        for rank, pairs in state["phases"].items()}
        self._steps_total = dict(state["steps_total"])
        self._slow_total = dict(state["slow_total"])
        self._last_end_s = dict(state["last_end_s"])

    def set_gpu_samples(self, samples: Sequence[Any]) -> None:
        """Latest GPU readings (``GpuSample``s), from the sampler thread."""
        with self._lock:
            for s in samples:
                self._gpu[str(s.index)] = (s.utilization_ratio, s.memory_used_bytes)

    # -- HTTP endpoint ------------------------------------------------------------------
    def start_server(self, host: str, port: int) -> str:
        """Serve /metrics on ``host:port`` (0: a free port); return the base URL.

        Raises ``OSError`` when the port is taken (the caller names the option).
        """
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        self._server, self._thread = server, thread
        bound_port = server.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{bound_port}"
        return self.url

    def bound_address(self) -> tuple[str, int]:
        """(host, port) the endpoint listens on."""
        if self._server is None:
            raise RuntimeError("the metrics endpoint is not serving")
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def close_inherited_socket(self) -> None:
        """In a forked child: close our copy of the listening socket (the parent serves)."""
        server, self._server, self._thread = self._server, None, None
        if server is not None:
            try:
                server.socket.close()  # not shutdown(): no serve_forever loop runs here
            except Exception:
                pass

    def stop_server(self, timeout_seconds: float = 1.0) -> None:
        """Stop serving (bounded); idempotent."""
        server, self._server = self._server, None
        thread, self._thread = self._thread, None
        if server is None:
            return
        # shutdown() waits for serve_forever to notice (it polls every 0.5 s): in a thread,
        # so a wedged request can't hold the caller past its bound.
        stopper = threading.Thread(target=server.shutdown, daemon=True)
        stopper.start()
        stopper.join(timeout_seconds)
        try:
            server.server_close()
        except Exception:
            pass
        if thread is not None:
            thread.join(max(0.0, timeout_seconds / 2))

    # -- scrape -------------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        """All metric families, consistent with each other (one lock)."""
        with self._lock:
            step_families = self._step_families_locked()
            last = dict(self._last_end_s)
            gpu = dict(self._gpu)
        if not self.histogram_rank_label:  # metrics_rank_label="gauges" (bounded series)
            step_families = [without_rank(f) for f in step_families]
        yield from step_families
        yield from self._progress_families(last)
        yield from self._ratio_families()
        yield from self._run_families()
        yield self._drop_family()
        yield from _gpu_families(gpu)

    def _step_families_locked(self) -> list[Metric]:
        """Step and phase histograms, step counters (the caller holds the lock)."""
        le = self._le
        step_h = HistogramMetricFamily(
            A.METRIC_STEP_DURATION, "Duration of training steps (root train.step spans).",
            labels=["rank"], unit="")
        phase_h = HistogramMetricFamily(
            A.METRIC_PHASE_DURATION, "Duration of step phases, by phase, kind and loader.",
            labels=["phase", "kind", "loader", "rank"])
        steps_c = CounterMetricFamily(A.METRIC_STEPS, "Training steps completed.",
                                      labels=["rank"])
        slow_c = CounterMetricFamily(A.METRIC_SLOW_STEPS, "Steps flagged slow.", labels=["rank"])
        for rank, h in self._steps.items():
            step_h.add_metric([rank], _buckets(h, le), h.total)
        for rank, by_phase in self._phases.items():
            for (phase, kind, loader), h in by_phase.items():
                phase_h.add_metric([str(phase), str(kind), loader or "", rank],
                                   _buckets(h, le), h.total)
        for rank, n in self._steps_total.items():
            steps_c.add_metric([rank], n)
        for rank, n in self._slow_total.items():
            slow_c.add_metric([rank], n)
        return [step_h, phase_h, steps_c, slow_c]

    def _progress_families(self, last: dict[str, float]) -> Iterator[Metric]:
        """When each rank's last step ended, and how long the current one has run."""
        last_g = GaugeMetricFamily(A.METRIC_LAST_STEP_TIMESTAMP,
                                   "Unix time the last step ended (0 before any).",
                                   labels=["rank"])
        prog_g = GaugeMetricFamily(A.METRIC_STEP_IN_PROGRESS,
                                   "Seconds the current step has been running (0 between steps).",
                                   labels=["rank"])
        if self.progress is not None:
            in_progress, last_end = self.progress()
            last[self.rank] = max(last.get(self.rank, 0.0), last_end)
            prog_g.add_metric([self.rank], in_progress)
        else:
            for rank in last:
                prog_g.add_metric([rank], 0.0)
        if not last:
            last[self.rank] = 0.0
        for rank, ts in last.items():
            last_g.add_metric([rank], ts)
        yield last_g
        yield prog_g
        if self.phase_progress is not None:
            phase_g = GaugeMetricFamily(
                METRIC_PHASE_IN_PROGRESS, "Seconds the running phase of the current step has "
                "been running, labelled with the phase ('' outside any phase; 0 between steps).",
                labels=["rank", "phase"])
            phase, seconds = self.phase_progress()
            phase_g.add_metric([self.rank, phase], seconds)
            yield phase_g

    def _drop_family(self) -> Metric:
        """Spans dropped, by reason."""
        drops = CounterMetricFamily(A.METRIC_SPANS_DROPPED,
                                    "Spans dropped (not exported), by reason.", labels=["reason"])
        if self.drops is not None:
            # Known reasons start at 0, so rate() and dashboards have a series before any drop.
            counts = dict.fromkeys(DROP_REASONS, 0)
            counts.update(self.drops.counts())
            for reason, n in sorted(counts.items()):
                drops.add_metric([reason], n)
        return drops

    def _ratio_families(self) -> Iterator[Metric]:
        overhead = GaugeMetricFamily(
            A.METRIC_MONITORING_OVERHEAD,
            "Monitoring time / training time, monitoring excluded from training (window: "
            "recent, cumulative; steady: first calls and warm-up steps left out).",
            labels=["window", "rank"])
        wall_share = GaugeMetricFamily(
            METRIC_MONITORING_WALL_SHARE,
            "Monitoring time / wall time, monitoring included (window: recent, cumulative).",
            labels=["window", "rank"])
        per_op = GaugeMetricFamily(
            A.METRIC_OPERATION_OVERHEAD,
            "Time in one monitoring operation / training time (monitoring excluded).",
            labels=["operation", "rank"])
        own = GaugeMetricFamily(
            A.METRIC_INSTRUMENTATION_OVERHEAD,
            "Share of the training loop's wall time otel-train takes from the training thread "
            "(hot path + its wait for otel-train's threads; recent window, start-up apart).",
            labels=["rank"])
        if self.overhead is not None:
            snap = self.overhead.snapshot()
            rank = self.rank if snap.rank is None else str(snap.rank)
            overhead.add_metric(["recent", rank], snap.recent_ratio)
            overhead.add_metric(["cumulative", rank], snap.cumulative_ratio)
            overhead.add_metric(["steady", rank], snap.steady_ratio)
            wall_share.add_metric(["recent", rank], snap.recent_wall_share)
            wall_share.add_metric(["cumulative", rank], snap.wall_share)
            for name, op in sorted(snap.operations.items()):
                per_op.add_metric([name, rank], op.share)
            if snap.instrumentation_ratio is not None:
                own.add_metric([rank], snap.instrumentation_ratio)
        yield overhead
        yield wall_share
        yield per_op
        yield own
        if self.budget is not None:
            yield GaugeMetricFamily(A.METRIC_BUDGET, "The configured monitoring budget (0..1).",
                                    value=self.budget)


    def _run_families(self) -> Iterator[Metric]:
        """The run's thresholds and its identity (constant for the run)."""
        for name, doc, value in (
            (METRIC_CRITICAL, "The configured critical monitoring overhead (0..1).",
             self.critical),
            (METRIC_SLOW_STEP_FACTOR, "A step is slow above this multiple of its baseline.",
             self.slow_step_factor),
            (METRIC_SLOW_OPERATION, "One monitoring call longer than this warns (seconds).",
             self.slow_operation_seconds),
        ):
            if value is not None:
                yield GaugeMetricFamily(name, doc, value=value)
        if self.run_id is not None:
            info = GaugeMetricFamily(METRIC_RUN_INFO, "The run this rank belongs to (always 1).",
                                     labels=["run_id", "rank", "world_size"])
            info.add_metric([self.run_id, self.rank, str(self.world_size or 1)], 1.0)
            yield info


def _gpu_families(gpu: dict[str, tuple[float | None, int]]) -> Iterator[Metric]:
    """GPU utilization and memory, by GPU index."""
    util = GaugeMetricFamily(A.METRIC_GPU_UTILIZATION, "GPU utilization (0..1), by GPU.",
                             labels=["gpu"])
    mem = GaugeMetricFamily(A.METRIC_GPU_MEMORY_USED, "GPU memory in use, bytes, by GPU.",
                            labels=["gpu"])
    for index, (u, used) in sorted(gpu.items()):
        if u is not None:
            util.add_metric([index], u)
        mem.add_metric([index], float(used))
    yield util
    yield mem


def _buckets(h: _Histogram, le: list[str]) -> list[tuple[Any, ...]]:
    """Cumulative (le, count[, exemplar]) rows."""
    out: list[tuple[Any, ...]] = []
    acc = 0
    ex = h.exemplars
    for i, n in enumerate(h.counts):
        acc += n
        e = ex[i] if ex is not None else None
        if e is not None:
            out.append((le[i], acc, Exemplar({"trace_id": format(e[0], "032x")}, e[1], e[2])))
        else:
            out.append((le[i], acc))
    return out


class _Collector:
    """Adapter: the registry asks it; it asks ``PrometheusMetricsSpanProcessor``."""

    def __init__(self, metrics: PrometheusMetricsSpanProcessor) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        """Every family, at scrape time."""
        return self._metrics.collect()
