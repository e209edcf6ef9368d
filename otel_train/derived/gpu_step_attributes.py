"""GPU readings on the steps they overlap, and into the GPU gauges.

The NVML sampler (``gpu.py``) calls ``on_samples`` every few seconds from its thread; the
latest reading per GPU goes to the Prometheus gauges, and the recent rounds are kept (bounded)
so each finished step's root span gets ``train.gpu.utilization_ratio`` and
``train.gpu.memory_used_bytes``: the highest reading, over GPUs, among the samples taken
during the step plus the one in force when it began (a step shorter than the sampling
interval still gets one). Without NVML or a GPU, no sample ever comes and nothing is set.

Usage::

    gpu_steps = GpuStepAttributeSpanProcessor(on_latest=metrics.set_gpu_samples)
    sampler = NvmlGpuSampler(5.0, on_sample=gpu_steps.on_samples)
    sampler.start()
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from otel_train.common import attributes as A
from otel_train.records.steps_view import StepView, StepViewProcessor, set_span_attribute


class GpuStepAttributeSpanProcessor(StepViewProcessor):
    """Sets GPU attributes on the root spans of steps that overlap a GPU sample."""

    def __init__(self, on_latest: Callable[[Sequence[Any]], None] | None = None,
                 max_rounds: int = 64,
                 forward: Callable[[tuple[int, float | None, int]], None] | None = None
                 ) -> None:
        super().__init__()
        self._on_latest = on_latest
        # Rounds of (timestamp_ns, max utilization or None, max memory used); its own lock
        # because the sampler thread writes while the span thread reads.
        self._rounds: deque[tuple[int, float | None, int]] = deque(maxlen=max_rounds)
        self._rounds_lock = threading.Lock()
        # Each round's row, to a copy of this processor elsewhere (the exporter process's).
        self._forward = forward

    def on_samples(self, samples: list[Any]) -> None:
        """One sampling round (``GpuSample``s), from the sampler thread."""
        if not samples:
            return
        utils = [s.utilization_ratio for s in samples if s.utilization_ratio is not None]
        ts = max(s.timestamp_ns for s in samples)
        row = (ts, max(utils) if utils else None, max(s.memory_used_bytes for s in samples))
        self.add_round(row)
        if self._forward is not None:
            self._forward(row)  # to the copy of this processor in the exporter process
        if self._on_latest is not None:
            self._on_latest(samples)

    def add_round(self, row: tuple[int, float | None, int]) -> None:
        """One round as (timestamp_ns, max utilization or None, max memory used bytes)."""
        with self._rounds_lock:
            self._rounds.append(row)

    def on_steps(self, views: Sequence[StepView],
                 failed: Callable[[StepViewProcessor, StepView, Exception], None]) -> None:
        """A frame of steps: ``on_step`` on each once a GPU reading came; until then (a
        CPU-only run, every step) a check a step and no call."""
        rounds, on_step = self._rounds, self.on_step
        for view in views:
            if rounds:  # the sampler's thread may add the first round mid-frame
                try:
                    on_step(view)
                except Exception as exc:
                    failed(self, view, exc)

    def on_step(self, view: StepView) -> None:
        """Attach the readings that overlap the step to its root span."""
        rounds = self._rounds
        if not rounds:
            return  # no GPU: the common CPU-only case costs one check
        start, end = view.start_ns, view.end_ns
        util: float | None = None
        mem: int | None = None
        with self._rounds_lock:
            picked = [r for r in rounds if start <= r[0] <= end]
            before = [r for r in rounds if r[0] < start]
        if before:
            picked.append(before[-1])  # the reading in force when the step began
        for _, u, m in picked:
            if u is not None and (util is None or u > util):
                util = u
            if mem is None or m > mem:
                mem = m
        if util is not None:
            set_span_attribute(view.span, A.GPU_UTILIZATION, util)
        if mem is not None:
            set_span_attribute(view.span, A.GPU_MEMORY_USED, mem)
