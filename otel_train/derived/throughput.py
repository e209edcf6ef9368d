"""Throughput, FLOPs and MFU from the steps' root attributes, per rank.

Each step's root span may carry ``train.tokens`` / ``train.samples`` (``step.count``, a
callable option, or the batch's shape: ``recording/step_counts.py``); an int option
``tokens_per_step`` / ``samples_per_step`` is filled in here, on the root too. FLOPs per
step are given (``flops_per_step``) or counted once (``count_flops``: the step after the
counted one carries ``train.flops``); with tokens known, later steps scale the count by
their tokens over the counted step's. The peak is given (``peak_flops_per_second``) or the
device table's (``train.peak_flops_per_second``, found on the training thread once).

Rates cover the recent window (the last ``recent_window_steps`` steps, as the overhead's
``recent``), over the wall time from the window's first step start to its last step end:

- ``tokens_per_second`` = tokens in the window / that wall time (samples alike);
- achieved FLOP/s = FLOPs in the window / that wall time; MFU (basis ``step``) = achieved /
  peak; MFU (basis ``exclude_data``) = FLOPs / (wall time minus the steps' ``data`` phases)
  / peak. The FLOP-counted step (slowed by the counting) keeps its tokens and time in the
  token and sample rates; its time is left out of FLOP/s and MFU.

Per run: the sum over ranks, in PromQL (docs/telemetry.md)::

    sum by (run_id) (otel_train_tokens_per_second
                     * on (job, instance, rank) group_left (run_id) otel_train_run_info)

Usage::

    tput = ThroughputSpanProcessor(rank=0, recent_window_steps=100, tokens_per_step=4096)
    shared = SharedStepSpanProcessor([..., tput]); metrics.registry.register(
        ThroughputCollector(tput))
    tput.snapshot().tokens_per_second
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from otel_train.common.units import si
from otel_train.common import attributes as A
from otel_train.common.sdk_private import SPAN_ATTRIBUTES_FIELD, span_attributes
from otel_train.records.steps_view import (
    P_DURATION,
    P_KIND,
    P_NAME,
    P_PARENT_ID,
    StepView,
    StepViewProcessor,
    set_span_attribute,
)

# Window entries: (tokens, samples, flops, start_ns, end_ns, data_ns, left_out_ns); None:
# not known. left_out_ns: the FLOP-counted step's time, out of the FLOP/s and MFU.
_TOKENS, _SAMPLES, _FLOPS, _START, _END, _DATA, _LEFT_OUT = range(7)
# The root attributes a step's counts come from: a step with none of them (and no count
# given by option or carried from a counted step) adds its times alone.
_COUNT_KEYS = frozenset((A.TOKENS, A.SAMPLES, A.FLOPS, A.FLOPS_COUNTED, A.FLOPS_DTYPE,
                         A.PEAK_FLOPS))
_DATA_PHASE, _TRAIN_KIND = A.PHASE_DATA, A.KIND_TRAIN


@dataclass(frozen=True)
class ThroughputSnapshot:
    """A consistent copy of the throughput figures of one rank."""

    rank: str
    tokens_total: int | None
    samples_total: int | None
    tokens_per_second: float | None
    samples_per_second: float | None
    flops_per_step: float | None
    achieved_flops_per_second: float | None
    peak_flops_per_second: float | None
    mfu: float | None
    mfu_exclude_data: float | None
    flops_dtype: str | None


def _number(value: Any) -> float | None:
    """A count read from an attribute: a number >= 0, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return value


def _ratio(part: float | None, whole: float) -> float | None:
    return part / whole if part is not None and whole > 0 else None


class ThroughputSpanProcessor(StepViewProcessor):
    """Tokens, samples, FLOPs per step; rates and MFU over the recent window."""

    view_by_view = True  # the console reads its figures as of each step
    reads_before = False  # reads none of the overhead's or the budget's figures
    state_fields = ("rank", "_window", "_tokens_total", "_samples_total", "_flops",
                    "_counted_tokens", "_peak", "_dtype")

    def __init__(self, rank: Any = 0, recent_window_steps: int = 100,
                 tokens_per_step: int | None = None, samples_per_step: int | None = None,
                 flops_per_step: float | None = None,
                 peak_flops_per_second: float | None = None) -> None:
        super().__init__()
        if not isinstance(recent_window_steps, int) or recent_window_steps < 1:
            raise ValueError("recent_window_steps must be an integer >= 1")
        self.rank = str(rank)
        self._const_tokens = tokens_per_step if isinstance(tokens_per_step, int) else None
        self._const_samples = samples_per_step if isinstance(samples_per_step, int) else None
        self._peak_given = peak_flops_per_second
        self._window: deque[tuple[Any, ...]] = deque(maxlen=recent_window_steps)
        self._tokens_total: int | None = None
        self._samples_total: int | None = None
        self._flops: float | None = flops_per_step  # per step: given, or the counted step's
        self._counted_tokens: float | None = None  # tokens of the FLOP-counted step
        self._peak: float | None = peak_flops_per_second
        self._dtype: str | None = None

    def on_step(self, view: StepView) -> None:
        """Read the step's counts, fill in the root's, add it to the window."""
        span = view.span
        attrs = span_attributes(span) or {}
        if (self._flops is None and self._const_tokens is None
                and self._const_samples is None and attrs.keys().isdisjoint(_COUNT_KEYS)):
            # Nothing counted on this step (most runs, every step): what the general path
            # below adds for it, without reading each count.
            self._window.append((None, None, None, view.start_ns, view.end_ns,
                                 _data_ns(view), 0))
            return
        tokens = _number(attrs.get(A.TOKENS))
        if tokens is None and self._const_tokens is not None:
            tokens = self._const_tokens
            set_span_attribute(span, A.TOKENS, tokens)
        samples = _number(attrs.get(A.SAMPLES))
        if samples is None and self._const_samples is not None:
            samples = self._const_samples
            set_span_attribute(span, A.SAMPLES, samples)
        if tokens is not None:
            self._tokens_total = (self._tokens_total or 0) + int(tokens)
        if samples is not None:
            self._samples_total = (self._samples_total or 0) + int(samples)
        self._adopt_device(attrs)
        if attrs.get(A.FLOPS_COUNTED):
            # Slowed by the counting: its tokens and time count, its FLOPs and time are left
            # out of FLOP/s and MFU.
            self._counted_tokens = tokens
            self._window.append((tokens, samples, None, view.start_ns, view.end_ns, 0,
                                 view.duration_ns))
            return
        flops = self._step_flops(attrs, tokens)
        if flops is not None and A.FLOPS not in attrs:
            set_span_attribute(span, A.FLOPS, flops)
        if flops is not None and self._peak and view.duration_ns > 0:
            set_span_attribute(span, A.MFU, flops / (view.duration_ns / 1e9) / self._peak)
        self._window.append((tokens, samples, flops, view.start_ns, view.end_ns,
                             _data_ns(view), 0))

    def on_steps(self, views: Sequence[StepView],
                 failed: Callable[[StepViewProcessor, StepView, Exception], None]) -> None:
        """A frame of steps: a step with nothing counted (no count attribute, none given
        by option or carried: most runs, every step) added to the window inline, its data
        time summed in the loop; the others go to ``on_step``."""
        on_step, append = self.on_step, self._window.append
        counting = (self._flops is not None or self._const_tokens is not None
                    or self._const_samples is not None)  # only on_step changes them
        for view in views:
            try:
                # span_attributes(view.span), inline: one builtin call, not two calls
                attrs = getattr(view.span, SPAN_ATTRIBUTES_FIELD, None) or {}
                if counting or not attrs.keys().isdisjoint(_COUNT_KEYS):
                    try:
                        on_step(view)
                    finally:  # it may have found the FLOPs to count from now on
                        counting = (self._flops is not None or self._const_tokens is not None
                                    or self._const_samples is not None)
                    continue
                root, data = view.root_span_id, 0
                for p in view.phases:  # _data_ns(view), inline
                    if p[P_NAME] == _DATA_PHASE and p[P_KIND] == _TRAIN_KIND and (
                            p[P_PARENT_ID] == root):
                        data += p[P_DURATION]
                append((None, None, None, view.start_ns, view.end_ns, data, 0))
            except Exception as exc:
                failed(self, view, exc)

    def _adopt_device(self, attrs: Any) -> None:
        """The dtype and the table's peak, as found once on the training thread."""
        dtype = attrs.get(A.FLOPS_DTYPE)
        if dtype is not None:
            self._dtype = str(dtype)
        peak = _number(attrs.get(A.PEAK_FLOPS))
        if peak and self._peak_given is None:
            self._peak = peak

    def _step_flops(self, attrs: Any, tokens: float | None) -> float | None:
        """This step's FLOPs: its own attribute (the count), else the count scaled by tokens."""
        own = _number(attrs.get(A.FLOPS))
        if own is not None:
            self._flops = own  # the counted step's FLOPs (carried by the next step), or given
            return own
        flops = self._flops
        if flops is None:
            return None
        counted = self._counted_tokens
        if tokens is not None and counted:
            return flops * tokens / counted  # same model, more or fewer tokens this step
        return flops

    def snapshot(self) -> ThroughputSnapshot:
        """Figures over the recent window (call with the lock held, or accept a race)."""
        window = list(self._window)
        tokens_rate = samples_rate = achieved = mfu = mfu_ex = None
        if window:
            wall_s = (window[-1][_END] - window[0][_START]) / 1e9
            data_s = sum(w[_DATA] for w in window) / 1e9
            flops_wall_s = wall_s - sum(w[_LEFT_OUT] for w in window) / 1e9
            tokens_rate = _ratio(_sum(window, _TOKENS), wall_s)
            samples_rate = _ratio(_sum(window, _SAMPLES), wall_s)
            flops = _sum(window, _FLOPS)
            achieved = _ratio(flops, flops_wall_s)
            if self._peak and achieved is not None:
                mfu = achieved / self._peak
                busy = _ratio(flops, flops_wall_s - data_s)
                mfu_ex = busy / self._peak if busy is not None else None
        return ThroughputSnapshot(
            self.rank, self._tokens_total, self._samples_total, tokens_rate, samples_rate,
            self._flops, achieved, self._peak, mfu, mfu_ex, self._dtype)


def rate_text(s: ThroughputSnapshot) -> str:
    """The console's throughput: ' 41.2k tok/s, MFU 38.1%' ('' when nothing is counted)."""
    if s.tokens_per_second is not None:
        text = f" {si(s.tokens_per_second)} tok/s"
    elif s.samples_per_second is not None:
        text = f" {si(s.samples_per_second)} samples/s"
    elif s.achieved_flops_per_second is not None:
        text = f" {si(s.achieved_flops_per_second)}FLOP/s"
    else:
        return ""
    if s.mfu is not None:
        text += f", MFU {s.mfu:.1%}"
    return text


def _sum(window: list[tuple[Any, ...]], field: int) -> float | None:
    """The field's sum over the window's steps that have it (None: none has)."""
    values = [w[field] for w in window if w[field] is not None]
    return sum(values) if values else None


def _data_ns(view: StepView) -> int:
    """Time in the step's top-level ``data`` phases (waiting for the batch)."""
    root = view.root_span_id
    total = 0
    for p in view.phases:
        if p[P_NAME] == _DATA_PHASE and p[P_KIND] == _TRAIN_KIND and p[P_PARENT_ID] == root:
            total += p[P_DURATION]
    return total


class ThroughputCollector:
    """The throughput families on the run's Prometheus registry (read at scrape time)."""

    def __init__(self, throughput: ThroughputSpanProcessor) -> None:
        self._tput = throughput

    def collect(self) -> Iterator[Metric]:
        """Every family, always (the OTLP push discovers them at start); series once known."""
        with self._tput._lock:
            s = self._tput.snapshot()
        rank = [s.rank]
        tokens_c = CounterMetricFamily(A.METRIC_TOKENS, "Tokens trained on.", labels=["rank"])
        samples_c = CounterMetricFamily(A.METRIC_SAMPLES, "Samples trained on.",
                                        labels=["rank"])
        gauges = {name: GaugeMetricFamily(name, doc, labels=["rank"]) for name, doc in (
            (A.METRIC_TOKENS_RATE, "Tokens per second (recent window, this rank)."),
            (A.METRIC_SAMPLES_RATE, "Samples per second (recent window, this rank)."),
            (A.METRIC_FLOPS_PER_STEP, "FLOPs of one step (counted once, or given)."),
            (A.METRIC_ACHIEVED_FLOPS, "FLOP/s achieved (recent window, this rank)."),
            (A.METRIC_PEAK_FLOPS, "The device's dense peak FLOP/s for the dtype in use."),
        )}
        mfu = GaugeMetricFamily(A.METRIC_MFU, "Model FLOPs utilization: achieved / peak "
                                "(basis: step = whole step, exclude_data = data wait left out).",
                                labels=["rank", "basis"])
        if s.tokens_total is not None:
            tokens_c.add_metric(rank, s.tokens_total)
        if s.samples_total is not None:
            samples_c.add_metric(rank, s.samples_total)
        for name, value in ((A.METRIC_TOKENS_RATE, s.tokens_per_second),
                            (A.METRIC_SAMPLES_RATE, s.samples_per_second),
                            (A.METRIC_FLOPS_PER_STEP, s.flops_per_step),
                            (A.METRIC_ACHIEVED_FLOPS, s.achieved_flops_per_second),
                            (A.METRIC_PEAK_FLOPS, s.peak_flops_per_second)):
            if value is not None:
                gauges[name].add_metric(rank, value)
        if s.mfu is not None:
            mfu.add_metric([s.rank, "step"], s.mfu)
        if s.mfu_exclude_data is not None:
            mfu.add_metric([s.rank, "exclude_data"], s.mfu_exclude_data)
        yield tokens_c
        yield samples_c
        yield from gauges.values()
        yield mfu
