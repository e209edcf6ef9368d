"""GPU readings become step attributes and gauges (fake samples; no GPU needed)."""

from __future__ import annotations

import pytest
from span_trees import BASE_NS, MS, feed, train_step

from otel_train.common import attributes as A
from otel_train.derived.gpu import GpuSample
from otel_train.derived.gpu_step_attributes import GpuStepAttributeSpanProcessor

pytestmark = pytest.mark.timeout(30)


def test_steps_overlapping_samples_get_the_highest_reading() -> None:
    latest: list[list[GpuSample]] = []
    gpu = GpuStepAttributeSpanProcessor(on_latest=latest.append)
    t0 = BASE_NS  # step 0 spans [t0, t0 + 100 ms]
    gpu.on_samples([GpuSample(0, 0.50, 1000, 8000, t0 - 5 * MS),
                    GpuSample(1, 0.40, 3000, 8000, t0 - 5 * MS)])
    gpu.on_samples([GpuSample(0, 0.90, 2000, 8000, t0 + 50 * MS),
                    GpuSample(1, None, 2500, 8000, t0 + 50 * MS)])
    spans = train_step(0, step_ms=100)
    feed(gpu, spans)
    root = spans[-1]
    assert root.attributes[A.GPU_UTILIZATION] == 0.90
    assert root.attributes[A.GPU_MEMORY_USED] == 3000  # the reading in force at the start
    assert len(latest) == 2


def test_without_samples_no_attribute_is_set() -> None:
    gpu = GpuStepAttributeSpanProcessor()
    spans = train_step(0)
    feed(gpu, spans)
    assert A.GPU_UTILIZATION not in spans[-1].attributes
