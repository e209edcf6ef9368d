"""The device work otel-train adds to the training thread, timed where it happens.

Three kinds of device calls run on the training thread, each by an explicit choice of
``device_sync`` (``recording/device.py``) and the probes (``recording/device_probes.py``):

- synchronizes at training boundaries (``device_sync="sync"``): the host waits for the
  device's queue to drain. The time waited is charged to the run's own cost. It is an upper
  bound on the time the loop loses: with every boundary synchronized a step takes its host
  work plus these waits, and without them it takes at least its host work;
- synchronizes at monitoring boundaries (``monitor_sync``, the default on an accelerator):
  the wait before a monitoring call is the training work still queued, which the device runs
  anyway and the monitoring call's own host read would have waited for; the wait after it is
  the monitoring call's own kernels. Neither is a loss of the loop: they are reported apart
  and not charged. What they cost (the device idles after each synchronize until the next
  kernel is queued, about one launch) is not on any clock here;
- event records and allocator reads on sampled steps, and the non-blocking copies of device
  tensors given to ``set_attribute`` / ``count``: host time, timed and charged.

The training thread adds to the counters (plain ints, one writer); the own-cost meter
(``self_cost.py``) reads them from the background.

Usage::

    clock = DeviceWorkClock()
    sync = clock.timed_sync(accelerator.synchronize, monitoring=False)
    meter.device_work = clock
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter_ns
from typing import Any


class DeviceWorkClock:
    """Nanoseconds and calls of otel-train's device work on the training thread."""

    __slots__ = ("sync_ns", "syncs", "monitor_sync_ns", "monitor_syncs", "probe_ns",
                 "probes", "copy_ns", "copies")

    def __init__(self) -> None:
        self.sync_ns = self.syncs = 0  # training boundaries (device_sync=sync): charged
        self.monitor_sync_ns = self.monitor_syncs = 0  # monitoring boundaries: reported apart
        self.probe_ns = self.probes = 0  # event records and allocator reads: charged
        self.copy_ns = self.copies = 0  # non-blocking copies of tensor attributes: charged

    def timed_sync(self, synchronize: Callable[[], None], monitoring: bool
                   ) -> Callable[[], Any]:
        """``synchronize``, its wait added to the training or the monitoring counters; the
        monitoring one returns its wait (ns)."""
        if monitoring:
            def synchronize_monitoring() -> int:
                t0 = perf_counter_ns()
                synchronize()  # explicit: the monitoring boundary's sync, timed
                waited = perf_counter_ns() - t0
                self.monitor_sync_ns += waited
                self.monitor_syncs += 1
                return waited

            return synchronize_monitoring

        def synchronize_training() -> None:
            t0 = perf_counter_ns()
            synchronize()  # explicit: device_sync=sync's boundary sync, timed
            self.sync_ns += perf_counter_ns() - t0
            self.syncs += 1

        return synchronize_training

    def timed_probe(self, boundary: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
        """A sampled step's boundary reading (event, peaks), its time added to ``probe_ns``."""
        def timed_boundary(dev: Any, pos: int) -> None:
            t0 = perf_counter_ns()
            boundary(dev, pos)
            self.probe_ns += perf_counter_ns() - t0
            self.probes += 1

        return timed_boundary

    @property
    def charged_ns(self) -> int:
        """What the loop loses to this work, at most: training syncs, probes, copies."""
        return self.sync_ns + self.probe_ns + self.copy_ns

    def figures(self, steps: int) -> dict[str, Any]:
        """Per-step figures for the costs file's ``own_cost.device_work``."""
        def per_step(ns: int) -> float | None:
            return round(ns / steps / 1e3, 3) if steps else None

        return {
            "sync_wait_us_per_step": per_step(self.sync_ns),
            "syncs": self.syncs,
            "events_and_peaks_us_per_step": per_step(self.probe_ns),
            "tensor_copies_us_per_step": per_step(self.copy_ns),
            "monitoring_sync_wait_us_per_step": per_step(self.monitor_sync_ns),
            "monitoring_syncs": self.monitor_syncs,
            "charged": ("sync waits at training boundaries (an upper bound on the overlap "
                        "lost), event records, allocator reads, tensor copies"),
            "left_out": ("the waits at monitoring boundaries (the training work queued "
                         "before them, and their own kernels: not a loss); the device idle "
                         "after each synchronize until the next kernel is queued (about one "
                         "launch; benchmarks/bench_gpu_default.py measures the whole A/B)"),
        }
