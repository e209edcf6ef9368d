"""What the training thread records at phase boundaries beyond timestamps: device timing events
and the allocator's peak memory, on one step in N.

Nothing here waits for the device. A timing event is recorded on the current stream (creating
and recording one never blocks); the caching allocator keeps its statistics on the host, so
reading and resetting its peaks is host work too (``torch._C._accelerator_getDeviceStats`` /
``_accelerator_resetPeakStats``, the nested dict ``torch.accelerator.memory_stats`` flattens).
The background (``records/device_readings.py``) resolves the events and the peaks into span
attributes.

A sampled step gets ``step.dev``: boundary position in the step's event list -> ``(event or
None, (peak allocated, peak reserved) or None)``; -1 and -2 are the step's own start and end.
Each reading is the allocator's peak since the previous boundary (read, then reset), so a
phase's peak is the largest reading between its start and its end, nested phases included.

Usage::

    probes = resolve_device_probes(timing, every_steps=10, memory_peaks="auto")
    recorder = Recorder(max_queued, drops, timing.synchronize, probes)
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from otel_train.common.device_work import DeviceWorkClock

_log = logging.getLogger("otel_train")

MEMORY_PEAKS_MODES = ("auto", "on", "off")
# The allocator's nested statistics: pool -> {"all": {"peak": bytes, ...}}.
_ALLOCATED, _RESERVED, _ALL, _PEAK = "allocated_bytes", "reserved_bytes", "all", "peak"


class AllocatorPeaks:
    """Reads and resets the device allocator's peak allocated and reserved bytes (no sync)."""

    def __init__(self, get_stats: Callable[[int], Any], reset_peaks: Callable[[int], Any],
                 device_index: int | Callable[[], int],
                 oom_types: tuple[type[BaseException], ...],
                 ready: Callable[[], bool] | None = None) -> None:
        self._get_stats = get_stats
        self._reset = reset_peaks
        # The device index, or how to find it at the first reading: asking at start_run could
        # initialize the device before the program does (and before it forks loader workers).
        self._index = device_index
        self._ready = ready  # False until the program's first allocation: nothing to read
        self.oom_types = oom_types  # a phase that raises one of these keeps its peak

    def read_and_reset(self) -> tuple[int, int] | None:
        """The peaks since the last reset, then a reset; None when the allocator can't tell."""
        try:
            if self._ready is not None and not self._ready():
                return None
            index = self._index
            if not isinstance(index, int):
                index = self._index = int(index())
            stats = self._get_stats(index)
            self._reset(index)
            return (int(stats[_ALLOCATED][_ALL][_PEAK]), int(stats[_RESERVED][_ALL][_PEAK]))
        except Exception:  # an allocator not initialized yet, or no statistics: no reading
            return None


def torch_allocator_peaks(device_type: str) -> AllocatorPeaks | None:
    """The running torch's allocator statistics for the current accelerator, if it has any."""
    torch = sys.modules.get("torch")
    if torch is None or device_type == "cpu":
        return None
    c = getattr(torch, "_C", None)
    get = getattr(c, "_accelerator_getDeviceStats", None)
    reset = getattr(c, "_accelerator_resetPeakStats", None)
    if get is None or reset is None:  # torch < 2.9: CUDA's own entry points
        get = getattr(c, "_cuda_memoryStats", None)
        reset = getattr(c, "_cuda_resetPeakMemoryStats", None)
        if get is None or reset is None or device_type != "cuda":
            return None
    accelerator = getattr(torch, "accelerator", None)
    index = getattr(accelerator, "current_device_index", None) or torch.cuda.current_device
    ready = getattr(c, "_accelerator_isAllocatorInitialized", None)
    oom = getattr(torch, "OutOfMemoryError", None)
    return AllocatorPeaks(get, reset, index, (oom,) if oom is not None else (MemoryError,),
                          ready)


class DeviceProbes:
    """The boundary recorder of one run: events and/or memory peaks, on one step in N."""

    def __init__(self, make_event: Callable[[], Any] | None, memory: AllocatorPeaks | None,
                 every_steps: int, host_rss_every_steps: int = 0,
                 work: DeviceWorkClock | None = None) -> None:
        self.make_event = make_event
        self.memory = memory
        self.every_steps = max(1, int(every_steps))
        # The background reads host RSS on every N-th step's record (no hot-path work).
        self.host_rss_every_steps = host_rss_every_steps
        read = memory.read_and_reset if memory is not None else None
        self._oom = memory.oom_types if memory is not None else ()
        if make_event is not None and read is not None:
            def boundary(dev: dict[int, Any], pos: int) -> None:
                dev[pos] = (make_event(), read())
        elif make_event is not None:
            def boundary(dev: dict[int, Any], pos: int) -> None:
                dev[pos] = (make_event(), None)
        elif read is not None:
            def boundary(dev: dict[int, Any], pos: int) -> None:
                dev[pos] = (None, read())
        else:  # host RSS only: nothing at boundaries (the recorder stays plain)
            def boundary(dev: dict[int, Any], pos: int) -> None:
                return None
        if work is not None and self.active:
            # Timed (two clock reads per boundary of a sampled step): the run's own cost
            # includes its event records and allocator reads (common/device_work.py).
            boundary = work.timed_probe(boundary)
        # One call per boundary of a sampled step, composed once here.
        self.boundary: Callable[[dict[int, Any], int], None] = boundary

    @property
    def active(self) -> bool:
        """True when the training thread records anything at boundaries."""
        return self.make_event is not None or self.memory is not None

    def step_start(self, step: Any) -> None:
        """A sampled step gets its boundary dict and its start reading."""
        if step.index % self.every_steps == 0:
            dev: dict[int, Any] = {}
            self.boundary(dev, -1)
            step.dev = dev

    def step_end(self, step: Any) -> None:
        """The sampled step's end reading."""
        dev = step.dev
        if dev is not None:
            self.boundary(dev, -2)

    def phase_failed(self, step: Any, pos: int, exc: BaseException) -> None:
        """A phase of an unsampled step raised out of memory: keep its peak all the same."""
        if self.memory is not None and isinstance(exc, self._oom) and step.dev is None:
            # The peak since the last reset: a sampled boundary earlier, or the run's start.
            step.dev = {pos: (None, self.memory.read_and_reset())}

    def describe(self) -> str:
        """What the banner says about the boundary probes."""
        parts = []
        if self.make_event is not None:
            parts.append("device events")
        if self.memory is not None:
            parts.append("allocator peaks")
        every = "every step" if self.every_steps == 1 else f"1 step in {self.every_steps}"
        return f"{' + '.join(parts)} ({every})"


def resolve_device_probes(make_event: Callable[[], Any] | None, device_type: str,
                          every_steps: int, memory_peaks: str,
                          memory: AllocatorPeaks | None = None, *,
                          host_clock_only: bool = False,
                          work: DeviceWorkClock | None = None) -> DeviceProbes | None:
    """The run's probes from ``device_sync``'s event maker and ``memory_peaks``; inactive (host
    RSS only, read in the background) or None when the training thread records nothing more.

    ``auto`` reads the allocator where it keeps statistics, except with
    ``host_clock_only`` (``device_sync=off``): that choice keeps the C phases, which peaks
    would replace by Python ones. ``memory`` defaults to the running torch's allocator
    (tests pass a fake's).
    """
    if memory_peaks not in MEMORY_PEAKS_MODES:
        raise ValueError(f"memory_peaks must be one of {', '.join(MEMORY_PEAKS_MODES)}")
    if memory_peaks == "off" or (memory_peaks == "auto" and host_clock_only):
        memory = None
    elif memory is None:
        memory = torch_allocator_peaks(device_type)
        if memory is None and memory_peaks == "on" and device_type != "cpu":
            _log.info("otel-train: memory_peaks=on but the %s allocator has no statistics",
                      device_type)
    # Host RSS on every run with memory_peaks: CPU's only memory figure, and on an
    # accelerator the host side (loader workers' copies, pinned buffers) the allocator can't see.
    rss_every = every_steps if memory_peaks != "off" else 0
    if make_event is None and memory is None:
        if rss_every:
            return DeviceProbes(None, None, every_steps, rss_every)
        return None
    return DeviceProbes(make_event, memory, every_steps, rss_every, work)
