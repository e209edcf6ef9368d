"""Device busy/idle, the steps' bound and peak memory as Prometheus metrics, and the console's
lines about them, from the attributes ``records/device_readings.py`` put on the spans.

Metrics (on the run's own registry, beside ``prometheus_metrics.py``'s):

- ``otel_train_phase_device_busy_seconds_total{phase, rank}``: device busy time per phase;
- ``otel_train_device_idle_seconds_total{rank}``: the steps' device idle time (wall - busy);
- ``otel_train_steps_by_bound_total{bound, rank}``: steps by ``train.step.bound``;
- ``otel_train_phase_memory_peak_bytes{phase, pool, rank}``: the last peak of each phase,
  ``pool`` ``allocated`` or ``reserved``;
- ``otel_train_host_rss_bytes{rank}``: the last host RSS read.

Usage::

    device = DeviceMetricsSpanProcessor(rank)
    metrics.registry.register(device.collector())
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from otel_train.common.units import bytes_to_gib
from otel_train.common import attributes as A
from otel_train.common.sdk_private import SPAN_ATTRIBUTES_FIELD, span_attributes
from otel_train.records.span_rows import P_EXTRA, P_NAME, P_STATUS
from otel_train.records.steps_view import StepView, StepViewProcessor

_extra_of = itemgetter(P_EXTRA)  # a record phase's extra attributes (or None)
_NO_RANK = object()  # no rank seen yet (on_steps)
_BOUND, _IDLE, _RSS = A.STEP_BOUND, A.DEVICE_IDLE, A.HOST_RSS


def root_attributes(view: StepView) -> dict[str, Any]:
    """The step's root attributes (a record's dict, or a span's mapping)."""
    span = view.span
    attrs = span_attributes(span)
    if attrs is None:
        attrs = getattr(span, "attributes", None)
    return attrs if attrs is not None else {}


def phase_extra(phase: tuple[Any, ...]) -> dict[str, Any] | None:
    """A record phase's extra attributes (device readings among them), or None."""
    return phase[P_EXTRA] if len(phase) > P_EXTRA else None


def out_of_memory_phase(view: StepView) -> tuple[str, int | None] | None:
    """(phase name, its peak allocated bytes or None) of the innermost phase that failed out
    of memory, else None."""
    found = None
    for ph in view.phases:
        status = ph[P_STATUS] if len(ph) > P_STATUS else None
        if not status:  # the usual phase: nothing to read (every step, so no text made)
            continue
        text = str(status[1])
        if text.startswith("OutOfMemoryError") or "out of memory" in text.lower():
            extra = phase_extra(ph) or {}
            found = (ph[P_NAME], extra.get(A.MEMORY_PEAK_ALLOCATED))
    return found


def oom_line(view: StepView) -> str | None:
    """The console's line naming the phase that ran out of memory, if one did."""
    oom = out_of_memory_phase(view)
    if oom is None:
        return None
    name, peak = oom
    where = f"⛔ out of memory in {name} (step {view.step})"
    if peak is None:
        return where
    return f"{where}: peak {bytes_to_gib(peak):.1f} GiB allocated"


def bound_line(view: StepView) -> str | None:
    """The breakdown's line: the step's bound and its device busy/idle where known."""
    attrs = root_attributes(view)
    bound = attrs.get(A.STEP_BOUND)
    if bound is None:
        return None
    busy, idle = attrs.get(A.DEVICE_BUSY), attrs.get(A.DEVICE_IDLE)
    if busy is None:
        return f"   bound: {bound} (host clock only: no device events on this step)"
    return f"   bound: {bound} (device busy {busy:.3f}s, idle {idle or 0.0:.3f}s)"


class DeviceMetricsSpanProcessor(StepViewProcessor):
    """Counts device busy/idle per phase and steps by bound; keeps the last memory peaks."""

    state_fields = ("busy", "idle", "bounds", "peaks", "rss")

    def __init__(self, rank: Any = 0) -> None:
        super().__init__()
        self.rank = str(rank)
        self.busy: dict[tuple[str, str], float] = {}  # (phase, rank) -> seconds
        self.idle: dict[str, float] = {}  # rank -> seconds
        self.bounds: dict[tuple[str, str], int] = {}  # (bound, rank) -> steps
        self.peaks: dict[tuple[str, str, str], int] = {}  # (phase, pool, rank) -> bytes
        self.rss: dict[str, int] = {}  # rank -> bytes

    def on_steps(self, views: Sequence[StepView],
                 failed: Callable[[StepViewProcessor, StepView, Exception], None]) -> None:
        """A frame of steps: ``on_step``'s figures, the rank's label and the bound's key
        made once while they stay the same; a step whose phases carry no extra attributes
        (a CPU run's, every step: no device readings) has its phases skipped in one C-level
        pass (``any`` over their extras) instead of a loop."""
        bounds, idle, rss_by = self.bounds, self.idle, self.rss
        rank_obj: Any = _NO_RANK
        rank = ""
        bound_obj: Any = _NO_RANK
        bound_key: tuple[str, str] = ("", "")
        for view in views:
            try:
                if view.rank is not rank_obj:
                    rank_obj, rank = view.rank, str(view.rank)
                    bound_obj = _NO_RANK
                attrs = getattr(view.span, SPAN_ATTRIBUTES_FIELD, None)  # root_attributes, inline
                if attrs is None:
                    attrs = root_attributes(view)
                bound = attrs.get(_BOUND)
                if bound is not None:
                    if bound is not bound_obj:
                        bound_obj, bound_key = bound, (str(bound), rank)
                    bounds[bound_key] = bounds.get(bound_key, 0) + 1
                value = attrs.get(_IDLE)
                if value is not None:
                    idle[rank] = idle.get(rank, 0.0) + float(value)
                value = attrs.get(_RSS)
                if value is not None:
                    rss_by[rank] = int(value)
                try:  # a C-level pass: most steps' phases carry no extras (no readings)
                    readings = any(map(_extra_of, view.phases))
                except IndexError:
                    readings = True
                if readings:
                    self._phase_readings(view.phases, rank)
            except Exception as exc:
                failed(self, view, exc)

    def on_step(self, view: StepView) -> None:
        """Add the step's device readings and bound."""
        rank = str(view.rank)
        attrs = root_attributes(view)
        bound = attrs.get(A.STEP_BOUND)
        if bound is not None:
            key = (str(bound), rank)
            self.bounds[key] = self.bounds.get(key, 0) + 1
        idle = attrs.get(A.DEVICE_IDLE)
        if idle is not None:
            self.idle[rank] = self.idle.get(rank, 0.0) + float(idle)
        rss = attrs.get(A.HOST_RSS)
        if rss is not None:
            self.rss[rank] = int(rss)
        self._phase_readings(view.phases, rank)

    def _phase_readings(self, phases: Sequence[tuple[Any, ...]], rank: str) -> None:
        """Add the phases' device busy time and memory peaks (from their extras)."""
        for ph in phases:
            # phase_extra(ph), inline: most phases carry none (a call per phase costs more)
            if len(ph) <= P_EXTRA or not ph[P_EXTRA]:
                continue
            extra = ph[P_EXTRA]
            busy = extra.get(A.DEVICE_BUSY)
            if busy is not None:
                k = (str(ph[P_NAME]), rank)
                self.busy[k] = self.busy.get(k, 0.0) + float(busy)
            for pool, name in (("allocated", A.MEMORY_PEAK_ALLOCATED),
                               ("reserved", A.MEMORY_PEAK_RESERVED)):
                value = extra.get(name)
                if value is not None:
                    self.peaks[(str(ph[P_NAME]), pool, rank)] = int(value)

    def collector(self) -> _DeviceCollector:
        """The registry's adapter for these metrics."""
        return _DeviceCollector(self)

    def families(self) -> list[Metric]:
        """The metric families, consistent with each other (one lock)."""
        busy_c = CounterMetricFamily(A.METRIC_PHASE_DEVICE_BUSY,
                                     "Device busy time per phase (events between its "
                                     "boundaries), sampled steps.", labels=["phase", "rank"])
        idle_c = CounterMetricFamily(A.METRIC_DEVICE_IDLE, "Device idle time of the steps "
                                     "(wall minus device busy), sampled steps.", labels=["rank"])
        bound_c = CounterMetricFamily(A.METRIC_STEPS_BY_BOUND, "Steps by what bounds them "
                                      "(train.step.bound).", labels=["bound", "rank"])
        peak_g = GaugeMetricFamily(A.METRIC_PHASE_MEMORY_PEAK, "The last peak of device memory "
                                   "per phase, allocated or reserved by the allocator.",
                                   labels=["phase", "pool", "rank"])
        rss_g = GaugeMetricFamily(A.METRIC_HOST_RSS, "This process's resident set size, the "
                                  "last reading.", labels=["rank"])
        with self._lock:
            for (phase, rank), v in self.busy.items():
                busy_c.add_metric([phase, rank], v)
            for rank, v in self.idle.items():
                idle_c.add_metric([rank], v)
            for (bound, rank), n in self.bounds.items():
                bound_c.add_metric([bound, rank], n)
            for (phase, pool, rank), v in self.peaks.items():
                peak_g.add_metric([phase, pool, rank], v)
            for rank, v in self.rss.items():
                rss_g.add_metric([rank], v)
        return [busy_c, idle_c, bound_c, peak_g, rss_g]


class _DeviceCollector:
    """Adapter: the registry asks it; it asks ``DeviceMetricsSpanProcessor``."""

    def __init__(self, device: DeviceMetricsSpanProcessor) -> None:
        self._device = device

    def collect(self) -> Iterator[Metric]:
        yield from self._device.families()
