"""How phase times are taken: host clock, with or without device synchronization.

Accelerator work is asynchronous: without a synchronize at phase boundaries, a kernel
launched in ``forward`` is paid for in whichever phase next waits on the device (often
``optimizer`` or a ``.item()``). ``device_sync`` chooses:

- ``sync``: synchronize the accelerator at every step and phase boundary (exact attribution,
  at the cost of draining the device queue each time);
- ``events``: host clock for the spans, plus device timing events recorded at every boundary
  of one step in ``device_events_every_steps`` and resolved in the background into
  ``train.device.duration_seconds`` / ``busy_seconds`` / ``idle_seconds`` (no stall;
  ``device_probes.py``, which also reads the allocator's peaks per phase);
- ``off``: host clock only (no stall; device time lands where the host waits);
- ``auto`` (default): ``sync`` when an accelerator is present, else host clock (on CPU the
  host clock is exact, there is nothing to synchronize).

A process that has not initialized its accelerator yet (a CPU loop on a GPU machine, or a
model moved to the device after ``start_run``) is not synchronized until it does: a
synchronize would create a device context (seconds, and memory on the GPU) only to drain an
empty queue, and costs CPU on every boundary (figures in docs/device-timing.md).

Device-agnostic through ``torch.accelerator`` (torch >= 2.6), with ``torch.cuda`` as a
fallback on older torch.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_log = logging.getLogger("otel_train")


@dataclass(frozen=True)
class DeviceTiming:
    """The resolved timing strategy for a run."""

    mode: str  # the option as given: auto | sync | off
    device_type: str  # "cpu", "cuda", "mps", "xpu", ...
    synchronize: Callable[[], None] | None  # called at boundaries when not None
    make_event: Callable[[], Any] | None = None  # events mode: a recorded timing event
    probes: Any = None  # device_probes.DeviceProbes: events / allocator peaks per boundary
    # True when the device was not initialized at start: boundaries synchronize from the
    # process's own first use of it on (``_synchronize_once_in_use``).
    pending_first_use: bool = False

    @property
    def synced(self) -> bool:
        """True when phase boundaries synchronize the device (``train.device.synced``)."""
        return self.synchronize is not None

    def describe(self) -> str:
        """One line for the start-up banner."""
        probes = self.probes
        if probes is not None and probes.active:
            return f"{self._clock()}; {probes.describe()}"
        return self._clock()

    def _clock(self) -> str:
        if self.synchronize is not None and self.pending_first_use:
            return (f"{self.device_type}: synchronized at phase boundaries once this process "
                    f"uses {self.device_type} (not initialized at start; until then host clock)")
        if self.synchronize is not None:
            return f"{self.device_type}: synchronized at phase boundaries"
        if self.make_event is not None:
            return (f"{self.device_type}: host clock + device events resolved in the "
                    "background (no stall)")
        if self.device_type == "cpu":
            return "cpu: host clock (exact on CPU; no accelerator to synchronize)"
        return f"{self.device_type}: host clock only (device_sync=off; async work lands late)"


def _accelerator_api(torch: Any) -> Any | None:
    """The torch accelerator API object: ``torch.accelerator`` or a shim over ``torch.cuda``."""
    api = getattr(torch, "accelerator", None)
    if api is not None and hasattr(api, "is_available") and hasattr(api, "synchronize"):
        return api
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return None

    class _CudaShim:
        @staticmethod
        def is_available() -> bool:
            return bool(cuda.is_available())

        @staticmethod
        def current_accelerator() -> Any:
            return torch.device("cuda")

        @staticmethod
        def synchronize(device: Any = None) -> None:
            cuda.synchronize(device)

    return _CudaShim


def _in_use_check(torch: Any | None, accelerator: Any, device_type: str) -> Any | None:
    """``is_initialized`` of the device's backend (``torch.cuda``, ``torch.xpu``), if it has one."""
    if torch is None:  # a fake accelerator passed in: its own check, if any
        return getattr(accelerator, "is_initialized", None)
    return getattr(getattr(torch, device_type, None), "is_initialized", None)


def _synchronize_once_in_use(synchronize: Callable[[], None],
                             in_use: Callable[[], bool]) -> Callable[[], None]:
    """``synchronize``, skipped while the process has not initialized the device."""
    def synchronize_once_in_use() -> None:
        # One cheap flag read per boundary; a synchronize before the process's own first
        # device call would initialize the device for nothing.
        if in_use():
            synchronize()

    return synchronize_once_in_use


def _synchronized_timing(mode: str, device_type: str, accelerator: Any,
                         torch: Any | None) -> DeviceTiming:
    """``sync`` timing: the bound synchronize, or its wrapper until the device's first use."""
    in_use = _in_use_check(torch, accelerator, device_type)
    try:
        pending = in_use is not None and not in_use()
    except Exception:  # a check that fails says nothing: synchronize as asked
        pending = False
    if pending:
        return DeviceTiming(mode, device_type,
                            _synchronize_once_in_use(accelerator.synchronize, in_use),
                            pending_first_use=True)
    # The bound function itself: one call per boundary, no wrapper frame on the hot path.
    return DeviceTiming(mode, device_type, accelerator.synchronize)


def resolve_device_timing(mode: str, accelerator: Any | None = None,
                          event_class: Any | None = None) -> DeviceTiming:
    """Resolve ``device_sync`` against the accelerator that is present (if any).

    ``accelerator`` and ``event_class`` default to ``torch.accelerator`` and ``torch.Event``
    (tests pass faithful fakes).
    """
    torch = None
    if accelerator is None:
        torch = sys.modules.get("torch")
        if torch is None and mode == "off":
            # Host clock only, and the program never imported torch: importing it here would
            # only cost start-up time (and its teardown in every forked child).
            return DeviceTiming(mode, "cpu", None)
        if torch is None:
            try:
                import torch  # noqa: F401  (users bring torch; the demo and integrations need it)
            except ImportError:
                torch = None
        accelerator = _accelerator_api(torch) if torch is not None else None
    available = False
    device_type = "cpu"
    if accelerator is not None:
        try:
            available = bool(accelerator.is_available())
            if available:
                dev = accelerator.current_accelerator()
                device_type = getattr(dev, "type", None) or str(dev)
        except Exception as exc:  # a broken driver must not stop training
            _log.info("otel-train: accelerator unavailable (%s); timing on the host clock", exc)
            available = False
    if not available or mode == "off":
        return DeviceTiming(mode, device_type, None)
    if mode == "events":
        if event_class is None:
            torch = torch or sys.modules.get("torch")
            event_class = getattr(torch, "Event", None) if torch is not None else None
        if event_class is None:
            _log.info("otel-train: device_sync=events needs torch.Event (torch >= 2.4); "
                      "timing on the host clock")
            return DeviceTiming(mode, device_type, None)
        cls = event_class

        def make_event() -> Any:
            # Recorded on the current stream: it completes when the work queued before it
            # does. Creating and recording an event never waits for the device.
            event = cls(device=device_type, enable_timing=True)
            event.record()
            return event

        return DeviceTiming(mode, device_type, None, make_event)
    return _synchronized_timing(mode, device_type, accelerator, torch)
