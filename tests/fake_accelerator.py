"""A faithful fake of the torch accelerator API with one in-order device stream.

Kernels are asynchronous, as on a real GPU: ``launch(seconds)`` returns at once and the work
"runs" on the device timeline; ``synchronize()`` blocks the host until the stream drains;
``Event.record()`` marks the stream position, ``Event.synchronize()`` waits for it, and
``elapsed_time`` gives device milliseconds between two recorded events (``enable_timing``
required, as in torch); ``tensor(value)`` is a one-element device tensor whose value is read
with a wait (``item()``, counted in ``blocking_reads``), and ``copy_to_host`` a non-blocking
copy into a pinned host buffer that holds the value once the stream reaches it. It
implements what otel-train touches of ``torch.accelerator`` and ``torch.Event``.

Usage::

    dev = FakeAccelerator()
    timing = resolve_device_timing("events", accelerator=dev, event_class=dev.Event)
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch


class FakeAccelerator:
    """``torch.accelerator``-shaped fake: is_available, current_accelerator, synchronize..."""

    def __init__(self, device_type: str = "cuda", available: bool = True,
                 initialized: bool = True) -> None:
        self.device_type = device_type
        self.available = available
        # As torch.cuda.is_initialized(): False until the process's first device call
        # (a launch here, or a synchronize, which creates the context on a real device).
        self.initialized = initialized
        self._lock = threading.Lock()
        self._busy_until = 0.0  # time.monotonic() at which the stream drains
        self.synchronize_calls = 0
        self.launches = 0
        self.events_recorded = 0
        self.copies = 0  # non-blocking copies to pinned host memory
        self.blocking_reads = 0  # .item() / .tolist() / .cpu() on a device tensor: waits
        self.Event = _make_event_class(self)

    # -- simulated device work ----------------------------------------------------------
    def launch(self, seconds: float) -> None:
        """Queue ``seconds`` of device work on the stream; returns immediately."""
        with self._lock:
            start = max(time.monotonic(), self._busy_until)
            self._busy_until = start + seconds
            self.launches += 1
            self.initialized = True

    def item(self) -> float:
        """A blocking device-to-host read (``tensor.item()``): waits, but is no library sync."""
        _sleep_until(self.stream_position())
        return 0.0

    def tensor(self, value: float) -> FakeDeviceTensor:
        """A one-element tensor on the device, computed by the work queued so far."""
        return FakeDeviceTensor(self, value, self.stream_position())

    def copy_to_host(self, tensor: FakeDeviceTensor) -> FakePinnedTensor:
        """``torch.empty_like(t, device="cpu", pin_memory=True).copy_(t, non_blocking=True)``:
        queued on the stream after the work that computes ``tensor``; returns at once, and
        the host buffer holds the value only once the stream has reached the copy."""
        with self._lock:
            self.copies += 1
            self.initialized = True
        return FakePinnedTensor(tensor.value, self.stream_position())

    @property
    def pending_seconds(self) -> float:
        """Device work still queued."""
        return max(0.0, self.stream_position() - time.monotonic())

    def stream_position(self) -> float:
        """The device time at which work queued now would start."""
        with self._lock:
            return max(time.monotonic(), self._busy_until)

    # -- torch.accelerator API ----------------------------------------------------------
    def is_available(self) -> bool:
        return self.available

    def current_accelerator(self) -> torch.device:
        return torch.device(self.device_type)

    def device_count(self) -> int:
        return 1 if self.available else 0

    def current_device_index(self) -> int:
        return 0

    def is_initialized(self) -> bool:
        """``torch.cuda.is_initialized``: has this process used the device yet?"""
        return self.initialized

    def synchronize(self, device: Any = None) -> None:
        """Block until every launched kernel has finished."""
        with self._lock:
            self.synchronize_calls += 1
            self.initialized = True
        _sleep_until(self.stream_position())


class FakeDeviceTensor:
    """A one-element tensor on the fake device: host-side metadata (device, shape, dtype,
    numel) is free; reading its value (``item``, ``tolist``, ``cpu``) waits for the stream, as
    on a real device, and is counted in ``blocking_reads``."""

    dtype = torch.float32
    shape = torch.Size(())

    def __init__(self, dev: FakeAccelerator, value: float, ready_at: float) -> None:
        self._dev = dev
        self.value = value
        self.ready_at = ready_at
        self.device = torch.device(dev.device_type)

    def detach(self) -> FakeDeviceTensor:
        return self

    def numel(self) -> int:
        return 1

    def _blocking_read(self) -> float:
        self._dev.blocking_reads += 1
        _sleep_until(self._dev.stream_position())  # waits behind everything queued since
        return self.value

    def item(self) -> float:
        return self._blocking_read()

    def tolist(self) -> float:
        return self._blocking_read()

    def cpu(self) -> Any:
        return torch.tensor(self._blocking_read())


class FakePinnedTensor:
    """The pinned host buffer of a non-blocking copy: reading it never waits, and before the
    copy has landed it holds garbage (NaN here), as a real pinned buffer would."""

    device = torch.device("cpu")

    def __init__(self, value: float, lands_at: float) -> None:
        self._value = value
        self._lands_at = lands_at

    def item(self) -> float:
        return self._value if time.monotonic() >= self._lands_at else float("nan")


def _sleep_until(t: float) -> None:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _make_event_class(dev: FakeAccelerator) -> type:
    class FakeEvent:
        """``torch.Event``-shaped: record, query, synchronize, elapsed_time."""

        def __init__(self, device: Any = None, *, enable_timing: bool = False,
                     blocking: bool = False, interprocess: bool = False) -> None:
            self.enable_timing = enable_timing
            self._at: float | None = None

        def record(self, stream: Any = None) -> None:
            self._at = dev.stream_position()
            dev.events_recorded += 1

        def query(self) -> bool:
            return self._at is None or time.monotonic() >= self._at

        def synchronize(self) -> None:
            if self._at is not None:
                _sleep_until(self._at)

        def elapsed_time(self, other: FakeEvent) -> float:
            if not (self.enable_timing and other.enable_timing):
                raise RuntimeError("Both events must be created with enable_timing=True")
            if self._at is None or other._at is None:
                raise RuntimeError("Both events must be recorded before calculating elapsed time")
            if not other.query():
                raise RuntimeError("Event not yet completed (call synchronize first)")
            return (other._at - self._at) * 1000.0

    return FakeEvent


class FakeAllocator:
    """A caching allocator's host-side statistics, as ``torch._C._accelerator_getDeviceStats``
    returns them (nested: pool -> "all" -> current/peak), with peaks that reset.

    ``allocate`` past ``capacity_bytes`` raises ``torch.OutOfMemoryError`` as torch does;
    ``stats_reads`` and ``resets`` count the calls (none of them waits for the device).
    """

    def __init__(self, capacity_bytes: int = 80 * 1024 ** 3, block_bytes: int = 2 * 1024 ** 2
                 ) -> None:
        self.capacity_bytes = capacity_bytes
        self.block_bytes = block_bytes  # reserved memory grows in blocks, as cached segments
        self.allocated = self.reserved = 0
        self.peak_allocated = self.peak_reserved = 0
        self.stats_reads = self.resets = 0

    def allocate(self, nbytes: int) -> None:
        """Allocate ``nbytes`` (raises ``torch.OutOfMemoryError`` past the capacity)."""
        if self.allocated + nbytes > self.capacity_bytes:
            raise torch.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {nbytes / 1024 ** 2:.2f} MiB")
        self.allocated += nbytes
        if self.allocated > self.reserved:
            blocks = -(-self.allocated // self.block_bytes)
            self.reserved = blocks * self.block_bytes
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, nbytes: int) -> None:
        """Free ``nbytes`` (reserved memory stays cached, as in torch)."""
        self.allocated = max(0, self.allocated - nbytes)

    def get_device_stats(self, device_index: int) -> dict[str, Any]:
        self.stats_reads += 1
        return {
            "allocated_bytes": {"all": {"current": self.allocated, "peak": self.peak_allocated}},
            "reserved_bytes": {"all": {"current": self.reserved, "peak": self.peak_reserved}},
            "num_ooms": 0,
        }

    def reset_peak_stats(self, device_index: int) -> None:
        self.resets += 1
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved

    def peaks(self) -> Any:
        """The ``AllocatorPeaks`` otel-train reads this allocator through."""
        from otel_train.recording.device_probes import AllocatorPeaks

        return AllocatorPeaks(self.get_device_stats, self.reset_peak_stats, 0,
                              (torch.OutOfMemoryError,))
