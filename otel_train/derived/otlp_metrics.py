"""The contract's metrics pushed over OTLP, through the OpenTelemetry metrics SDK.

On a fleet, scraping one Prometheus port per rank means discovering every pod; pushing to the
OTLP endpoint the spans already go to does not. ``OtlpMetricsSpanProcessor`` is fed the same
step views as the Prometheus processor (it sits right after it in the derived-metrics chain):
step and phase durations go into SDK histograms with the same buckets, step counts into SDK
counters; every gauge and the drop counter are observable instruments that read the very
sources the Prometheus endpoint reads, at export time. A ``PeriodicExportingMetricReader``
pushes them through the SDK's OTLP metric exporter (gRPC or HTTP/protobuf), which honours
``OTEL_METRIC_EXPORT_INTERVAL``, ``OTEL_METRIC_EXPORT_TIMEOUT``,
``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE``,
``OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION`` and every
``OTEL_EXPORTER_OTLP_METRICS_*`` (endpoint, headers, timeout, compression, certificates).

Names are chosen so that the OpenTelemetry-to-Prometheus translation (the Collector's
``prometheus`` and ``prometheusremotewrite`` exporters: dots become underscores, the unit
becomes a suffix — ``s`` -> ``_seconds``, ``By`` -> ``_bytes``, ``1`` on a gauge -> ``_ratio``
— and monotonic sums get ``_total``) gives back exactly the contract's Prometheus names:
``otel_train.step.duration`` (unit ``s``) becomes ``otel_train_step_duration_seconds``. The
labels become attributes (``rank``, ``phase``, ...), plus ``run_id`` so that many runs can
share one Prometheus; ``job``/``instance`` come from ``service.name`` and
``service.instance.id`` on the resource.

Usage::

    plan = plan_metrics(options)                     # pipeline/plan.py: MetricsPlan(prometheus=True, otlp=True,...)
    otlp = OtlpMetricsSpanProcessor(create_metric_exporter(plan), prometheus_processor,
                                    run_id="r1", resource=resource)
    shared = SharedStepSpanProcessor([..., prometheus_processor, otlp])
    ...
    otlp.shutdown_within(1.0)                        # final export, bounded
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from otel_train.common import attributes as A
from otel_train.common import sdk_private
from otel_train.derived.prometheus_metrics import (
    DEFAULT_BUCKETS,
    PrometheusMetricsSpanProcessor,
)
from otel_train.records.steps_view import P_DURATION, P_KEY, StepView, StepViewProcessor

METER_NAME = "otel_train"
RUN_ID_ATTRIBUTE = "run_id"

# Prometheus name -> (OpenTelemetry name, unit). Translating the right side back (see the
# module docstring) gives the left side; tests/derived/test_otlp_metrics.py checks every pair.
OTEL_NAMES: dict[str, tuple[str, str]] = {
    A.METRIC_STEP_DURATION: ("otel_train.step.duration", "s"),
    A.METRIC_PHASE_DURATION: ("otel_train.phase.duration", "s"),
    A.METRIC_STEPS: ("otel_train.steps", "{step}"),
    A.METRIC_SLOW_STEPS: ("otel_train.slow_steps", "{step}"),
    A.METRIC_MONITORING_OVERHEAD: ("otel_train.monitoring.overhead", "1"),
    A.METRIC_OPERATION_OVERHEAD: ("otel_train.operation.overhead", "1"),
    A.METRIC_BUDGET: ("otel_train.monitoring.budget", "1"),
    A.METRIC_MONITORING_INTERVAL: ("otel_train.monitoring.interval_steps", "{step}"),
    A.METRIC_LAST_STEP_TIMESTAMP: ("otel_train.last_step.timestamp", "s"),
    A.METRIC_STEP_IN_PROGRESS: ("otel_train.step.in_progress", "s"),
    A.METRIC_SPANS_DROPPED: ("otel_train.spans.dropped", "{span}"),
    A.METRIC_INSTRUMENTATION_OVERHEAD: ("otel_train.instrumentation.overhead", "1"),
    A.METRIC_GPU_UTILIZATION: ("otel_train.gpu.utilization", "1"),
    A.METRIC_GPU_MEMORY_USED: ("otel_train.gpu.memory.used", "By"),
    # Throughput and MFU (derived/throughput.py): the fields' names (train.tokens_per_second,
    # train.mfu) under the library's prefix, so that the translation gives the contract back.
    A.METRIC_TOKENS: ("otel_train.tokens", "{token}"),
    A.METRIC_SAMPLES: ("otel_train.samples", "{sample}"),
    A.METRIC_TOKENS_RATE: ("otel_train.tokens_per_second", "{token}/s"),
    A.METRIC_SAMPLES_RATE: ("otel_train.samples_per_second", "{sample}/s"),
    A.METRIC_FLOPS_PER_STEP: ("otel_train.flops_per_step", "{flop}"),
    A.METRIC_ACHIEVED_FLOPS: ("otel_train.achieved_flops", "{flop}/s"),
    A.METRIC_PEAK_FLOPS: ("otel_train.peak_flops", "{flop}/s"),
    A.METRIC_MFU: ("otel_train.mfu", "1"),
}
# Fed from step views (not read from the Prometheus processor's families).
_FROM_VIEWS = {A.METRIC_STEP_DURATION, A.METRIC_PHASE_DURATION, A.METRIC_STEPS,
               A.METRIC_SLOW_STEPS}
_UNIT_SUFFIXES = (("_ratio", "1"), ("_seconds", "s"), ("_bytes", "By"))


def otel_name_for(prometheus_name: str, counter: bool) -> tuple[str, str]:
    """(OpenTelemetry name, unit) whose Prometheus translation is ``prometheus_name``.

    Known metrics use the table; a metric added to the Prometheus endpoint later (another
    gauge) is mapped by its suffixes, so the push path never silently lacks it.
    """
    known = OTEL_NAMES.get(prometheus_name)
    if known is not None:
        return known
    base = prometheus_name
    if counter and base.endswith("_total"):
        base = base[: -len("_total")]
    unit = ""
    for suffix, ucum in _UNIT_SUFFIXES:
        if base.endswith(suffix) and (ucum != "1" or not counter):
            base, unit = base[: -len(suffix)], ucum
            break
    if counter and not unit:
        unit = "{count}"
    prefix = "otel_train_"
    if base.startswith(prefix):
        base = "otel_train." + base[len(prefix):].replace("_", ".")
    return base, unit


@dataclass(frozen=True)
class MetricsPlan:
    """Where the metrics go: the Prometheus endpoint, OTLP, both or neither."""

    prometheus: bool
    otlp: bool
    protocol: str = "http/protobuf"
    endpoint: str | None = None  # None: the SDK exporter reads OTEL_EXPORTER_OTLP_* itself

    def describe(self) -> str:
        """For the start-up banner."""
        if not self.otlp:
            return "prometheus" if self.prometheus else "off"
        where = f"OTLP {self.protocol} -> {self.endpoint or '(OTEL_EXPORTER_OTLP_* endpoint)'}"
        return where + (" and prometheus" if self.prometheus else "")


def create_metric_exporter(plan: MetricsPlan) -> MetricExporter:
    """The SDK's OTLP metric exporter for ``plan`` (it reads OTEL_EXPORTER_OTLP_METRICS_*)."""
    kwargs: dict[str, Any] = {}
    if plan.endpoint:
        kwargs["endpoint"] = plan.endpoint
    if plan.protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter,
        )
        return OTLPMetricExporter(**kwargs)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpMetricExporter,
    )
    return HttpMetricExporter(**kwargs)


class OtlpMetricsSpanProcessor(StepViewProcessor):
    """Feeds OTel SDK instruments from step views; gauges read the Prometheus sources."""

    def __init__(
        self,
        exporter: MetricExporter,
        prometheus: PrometheusMetricsSpanProcessor,
        run_id: str,
        resource: Resource | None = None,
        export_interval_millis: float | None = None,
        buckets: Sequence[float] = DEFAULT_BUCKETS,
    ) -> None:
        super().__init__()
        self.prometheus = prometheus
        self.run_id = run_id
        # None: OTEL_METRIC_EXPORT_INTERVAL / _TIMEOUT, read by the SDK's reader.
        self.reader = PeriodicExportingMetricReader(exporter, export_interval_millis)
        self.provider = MeterProvider(resource=resource or Resource.create({}),
                                      metric_readers=[self.reader], shutdown_on_exit=False)
        meter = self.provider.get_meter(METER_NAME)
        bounds = [float(b) for b in buckets]
        name, unit = OTEL_NAMES[A.METRIC_STEP_DURATION]
        self._step_h = meter.create_histogram(
            name, unit, "Duration of training steps (root train.step spans).",
            explicit_bucket_boundaries_advisory=bounds)
        name, unit = OTEL_NAMES[A.METRIC_PHASE_DURATION]
        self._phase_h = meter.create_histogram(
            name, unit, "Duration of step phases, by phase, kind and loader.",
            explicit_bucket_boundaries_advisory=bounds)
        name, unit = OTEL_NAMES[A.METRIC_STEPS]
        self._steps_c = meter.create_counter(name, unit, "Training steps completed.")
        name, unit = OTEL_NAMES[A.METRIC_SLOW_STEPS]
        self._slow_c = meter.create_counter(name, unit, "Steps flagged slow.")
        # Attribute dicts built once per (rank) and per (phase, kind, loader, rank).
        self._step_attrs: dict[Any, dict[str, Any]] = {}
        self._unranked = {RUN_ID_ATTRIBUTE: run_id}
        self._phase_attrs: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._families_at = 0.0
        self._families: dict[str, Any] = {}
        self._families_lock = threading.Lock()
        self.observable_names: list[str] = []
        # Every family the endpoint serves (extra collectors on its registry included).
        for family in prometheus.registry.collect():
            counter = family.type == "counter"
            # prometheus_client strips _total from a counter family's name
            full = family.name + "_total" if counter else family.name
            if full in _FROM_VIEWS or family.type not in ("gauge", "counter"):
                continue
            self._observe(meter, family.name, full, counter, family.documentation)

    def _observe(self, meter: Any, prom_name: str, full: str, counter: bool,
                 doc: str) -> None:
        name, unit = otel_name_for(full, counter)

        def callback(options: CallbackOptions) -> Iterable[Observation]:
            return self._observations(prom_name)

        if counter:
            meter.create_observable_counter(name, [callback], unit, doc)
        else:
            meter.create_observable_gauge(name, [callback], unit, doc)
        self.observable_names.append(full)

    def _observations(self, prom_name: str) -> list[Observation]:
        # One snapshot of every family per export: all instruments read consistent values.
        with self._families_lock:
            now = time.monotonic()
            if now - self._families_at > 0.5:
                self._families = {f.name: f for f in self.prometheus.registry.collect()}
                self._families_at = now
            family = self._families.get(prom_name)
        if family is None:
            return []
        out = []
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            attrs = {k: v for k, v in sample.labels.items() if v != ""}
            attrs[RUN_ID_ATTRIBUTE] = self.run_id
            out.append(Observation(sample.value, attrs))
        return out

    # -- fed from step views (background thread, the shared lock held) ------------------
    def on_step(self, view: StepView) -> None:
        """Record the step and its phases."""
        attrs = self._step_attrs.get(view.rank)
        if attrs is None:
            attrs = self._step_attrs[view.rank] = {"rank": str(view.rank),
                                                   RUN_ID_ATTRIBUTE: self.run_id}
        # The step's trace as the context: the SDK keeps it as the bucket's exemplar, as the
        # Prometheus endpoint does.
        ctx = trace_api.set_span_in_context(NonRecordingSpan(SpanContext(
            view.trace_id, view.root_span_id, False, TraceFlags(TraceFlags.SAMPLED))))
        # metrics_rank_label="gauges": the histograms without rank, as on the endpoint
        ranked = self.prometheus.histogram_rank_label
        self._step_h.record(view.duration_ns / 1e9, attrs if ranked else self._unranked,
                            context=ctx)
        self._steps_c.add(1, attrs)
        if view.slow:
            self._slow_c.add(1, attrs)
        for ph in view.phases:
            self._record_phase(ph[P_KEY], ph[P_DURATION], view.rank)

    def on_operation(self, view: StepView) -> None:
        """Monitoring between steps: a monitor phase."""
        self._record_phase((view.name, A.KIND_MONITOR, view.loader), view.duration_ns,
                           view.rank)

    def _record_phase(self, key: tuple[Any, ...], duration_ns: int, rank: Any) -> None:
        full = key + (rank,)
        attrs = self._phase_attrs.get(full)
        if attrs is None:
            name, kind, loader = key
            attrs = {"phase": str(name), "kind": str(kind), "rank": str(rank),
                     RUN_ID_ATTRIBUTE: self.run_id}
            if not self.prometheus.histogram_rank_label:
                del attrs["rank"]
            if loader:
                attrs["loader"] = str(loader)
            self._phase_attrs[full] = attrs
        self._phase_h.record(duration_ns / 1e9, attrs)

    # -- lifecycle ----------------------------------------------------------------------
    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Collect and export now."""
        try:
            return bool(self.provider.force_flush(timeout_millis))
        except Exception:
            return False

    def after_fork_in_child(self) -> None:
        """In a forked child (a DataLoader worker): never push the parent's metrics.

        The SDK's periodic reader restarts its thread in every forked child; it must find
        nothing to collect and stop.
        """
        self._stopped = True
        reader = self.reader
        reader.collect = lambda *args, **kwargs: None  # type: ignore[method-assign]
        sdk_private.metric_reader_shutdown_event(reader).set()

    def shutdown(self) -> None:
        """Final export and stop (bounded by the default shutdown bound)."""
        self.shutdown_within(2.0)

    def shutdown_within(self, timeout_seconds: float) -> None:
        """Final export and stop; never blocks past ``timeout_seconds`` (collector down)."""
        if getattr(self, "_stopped", False):
            return
        self._stopped = True
        stopper = threading.Thread(
            target=self._shutdown_provider, args=(int(max(0.05, timeout_seconds) * 1000),),
            name="otel-train-metrics-shutdown", daemon=True)
        stopper.start()
        stopper.join(max(0.05, timeout_seconds))

    def _shutdown_provider(self, timeout_millis: int) -> None:
        try:
            self.provider.shutdown(timeout_millis)
        except Exception:
            pass
