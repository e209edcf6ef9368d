"""How phase times are taken: host clock, device events, and where the device is synchronized.

Accelerator work is asynchronous: without a synchronize at phase boundaries, a kernel
launched in ``forward`` is paid for in whichever phase next waits on the device (often
``optimizer`` or a ``Tensor.item``). A synchronize at every boundary gives exact attribution but
drains the device's queue each time, and the CPU/GPU overlap every training loop relies on is
lost. ``device_sync`` chooses:

- ``monitor_sync``: training phases (data, forward, backward, optimizer, the user's own) on
  the host clock with no synchronize; device time from timing events recorded at every
  boundary of one step in ``device_events_every_steps`` and resolved in the background (as
  ``events``); monitoring phases (``step.monitor``, ``run.monitor``, monitor phases opened by
  integrations) synchronized at their start (the training work still queued is charged to
  training, not to them) and at their end (their own kernels are charged to them);
- ``sync``: synchronize at every step and phase boundary (exact per-phase attribution, at
  the cost of draining the device queue each time; the time spent waiting in those
  synchronizes is reported as own cost, an upper bound on the overlap lost);
- ``events``: host clock for the spans, plus device timing events on one step in
  ``device_events_every_steps`` resolved in the background into
  ``train.device.duration_seconds`` / ``busy_seconds`` / ``idle_seconds``; no synchronize
  anywhere (``device_probes.py``, which also reads the allocator's peaks per phase);
- ``off``: host clock only (no stall; device time lands where the host waits);
- ``auto`` (default): ``monitor_sync`` when an accelerator is present, else host clock (on
  CPU the host clock is exact, there is nothing to synchronize).

A process that has not initialized its accelerator yet (a CPU loop on a GPU machine, or a
model moved to the device after ``start_run``) is not synchronized until it does: a
synchronize would create a device context (seconds, and memory on the GPU) only to drain an
empty queue, and costs CPU on every boundary (figures in docs/device-timing.md).

Every synchronize this module hands out is timed (``DeviceWorkClock``): the run's own cost
includes the wait at training boundaries (``sync``), and reports the wait at monitoring
boundaries apart (that wait is the training work queued before them, not a loss).

Device-agnostic through ``torch.accelerator`` (torch >= 2.6), with ``torch.cuda`` as a
fallback on older torch.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from otel_train.common.device_work import DeviceWorkClock
from otel_train.recording.device_values import DeviceValueCopier

_log = logging.getLogger("otel_train")


#: The values of ``device_sync``; ``auto`` resolves to one of the others.
DEVICE_SYNC_MODES = ("auto", "monitor_sync", "sync", "events", "off")
#: ``train.device.timing`` of a span: ``sync`` (a synchronize bracketed it: its host time
#: includes its device work), ``events`` (it carries device time from events:
#: ``train.device.duration_seconds`` / ``busy_seconds``), ``host`` (host clock only).
TIMING_SYNC, TIMING_EVENTS, TIMING_HOST = "sync", "events", "host"


@dataclass(frozen=True)
class DeviceTiming:
    """The resolved timing strategy for a run."""

    mode: str  # the option as given: auto | monitor_sync | sync | events | off
    device_type: str  # "cpu", "cuda", "mps", "xpu", ...
    synchronize: Callable[[], None] | None  # called at every boundary when not None
    make_event: Callable[[], Any] | None = None  # events / monitor_sync: a recorded event
    probes: Any = None  # device_probes.DeviceProbes: events / allocator peaks per boundary
    # True when the device was not initialized at start: boundaries synchronize from the
    # process's own first use of it on (``_synchronize_once_in_use``).
    pending_first_use: bool = False
    # Called at monitoring boundaries only (monitor_sync); None in every other mode (sync's
    # ``synchronize`` covers monitoring boundaries too).
    monitor_synchronize: Callable[[], None] | None = None
    resolved: str = "off"  # what runs: monitor_sync | sync | events | off
    # The time spent in the synchronizes above, event records, allocator reads, copies.
    work: DeviceWorkClock = field(default_factory=DeviceWorkClock)
    # ``torch.Event``-like class for the non-blocking tensor copies (None: no accelerator).
    event_class: Any = None
    # How a device tensor is copied to pinned host memory without waiting (None: torch's,
    # ``device_values.pinned_host_copy``; a fake accelerator brings its own).
    copy_to_host: Callable[[Any], Any] | None = None

    @property
    def synced(self) -> bool:
        """True when every phase boundary synchronizes the device (``train.device.synced``
        of the training spans; monitoring spans under monitor_sync are synced too)."""
        return self.synchronize is not None

    @property
    def span_timing(self) -> str | None:
        """``train.device.timing`` when every span of the run has the same one, else None
        (events, monitor_sync: it depends on the step being sampled, and on the kind)."""
        if self.synchronize is not None:
            return TIMING_SYNC
        if self.make_event is None and self.monitor_synchronize is None:
            return TIMING_HOST
        return None

    def describe(self) -> str:
        """One line for the start-up banner and ``otel-train plan``: the mode and why."""
        probes = self.probes
        clock = self._clock()
        if self.resolved == "monitor_sync":
            return clock
        if probes is not None and probes.active:
            return f"{clock}; {probes.describe()}"
        return clock

    def _why(self) -> str:
        return "device_sync=auto" if self.mode == "auto" else f"device_sync={self.mode}"

    def _events_every(self) -> str:
        if self.make_event is None:
            return "no device events (torch.Event missing)"
        every = getattr(self.probes, "every_steps", None)
        if every is None:  # probes not resolved yet
            return "device time from events"
        return ("device time from events every step" if every == 1
                else f"device time from events 1 step in {every}")

    def _clock(self) -> str:
        pending = (f" once this process uses {self.device_type} (not initialized at start; "
                   "until then host clock)") if self.pending_first_use else ""
        if self.resolved == "monitor_sync":
            peaks = (" + allocator peaks" if self.probes is not None
                     and getattr(self.probes, "memory", None) is not None else "")
            return (f"{self.device_type}: monitor_sync ({self._why()}): training phases "
                    f"unsynchronized, {self._events_every()}{peaks}; monitoring synchronized "
                    f"at its start and end{pending}")
        if self.synchronize is not None:
            return (f"{self.device_type}: sync ({self._why()}): synchronized at every phase "
                    f"boundary (exact per phase; the waits are reported as own cost){pending}")
        if self.make_event is not None:
            return (f"{self.device_type}: events ({self._why()}): host clock + device events "
                    "resolved in the background (no synchronize anywhere)")
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
            synchronize()  # explicit: device_sync's chosen boundary sync

    return synchronize_once_in_use


def _in_use_sync(device_type: str, accelerator: Any, torch: Any | None
                 ) -> tuple[Callable[[], None], bool]:
    """The accelerator's synchronize, wrapped to wait for the process's first use of the
    device when it is not initialized yet; and whether it is (``pending_first_use``)."""
    in_use = _in_use_check(torch, accelerator, device_type)
    try:
        pending = in_use is not None and not in_use()
    except Exception:  # a check that fails says nothing: synchronize as asked
        pending = False
    if pending:
        return _synchronize_once_in_use(accelerator.synchronize, in_use), True
    return accelerator.synchronize, False


def _event_once_in_use(make_event: Callable[[], Any], in_use: Callable[[], bool]
                       ) -> Callable[[], Any]:
    """``make_event``, giving None while the process has not initialized the device."""
    def event_once_in_use() -> Any:
        return make_event() if in_use() else None

    return event_once_in_use


def _event_maker(device_type: str, cls: Any) -> Callable[[], Any]:
    def make_event() -> Any:
        # Recorded on the current stream: it completes when the work queued before it
        # does. Creating and recording an event never waits for the device.
        event = cls(device=device_type, enable_timing=True)
        event.record()
        return event

    return make_event


def resolve_device_timing(mode: str, accelerator: Any | None = None,
                          event_class: Any | None = None) -> DeviceTiming:
    """Resolve ``device_sync`` against the accelerator that is present (if any).

    ``accelerator`` and ``event_class`` default to ``torch.accelerator`` and ``torch.Event``
    (tests pass faithful fakes; a fake accelerator's own ``Event`` is used when it has one).
    """
    if mode not in DEVICE_SYNC_MODES:
        raise ValueError(f"device_sync={mode!r}: must be one of {', '.join(DEVICE_SYNC_MODES)}")
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
    elif event_class is None:
        event_class = getattr(accelerator, "Event", None)
    device_type = _available_device(accelerator)
    if device_type is None:
        return DeviceTiming(mode, "cpu", None)
    if event_class is None:
        running = torch or sys.modules.get("torch")
        event_class = getattr(running, "Event", None) if running is not None else None
    return _timing_on(mode, device_type, accelerator, torch, event_class)


def _available_device(accelerator: Any | None) -> str | None:
    """The accelerator's device type ("cuda", "xpu", ...), None when none is available."""
    if accelerator is None:
        return None
    try:
        if accelerator.is_available():
            dev = accelerator.current_accelerator()
            return getattr(dev, "type", None) or str(dev)
    except Exception as exc:  # a broken driver must not stop training
        _log.info("otel-train: accelerator unavailable (%s); timing on the host clock", exc)
    return None


def _timing_on(mode: str, device_type: str, accelerator: Any, torch: Any | None,
               event_class: Any | None) -> DeviceTiming:
    """``device_sync`` on an available accelerator."""
    # A fake accelerator's faithful non-blocking copy; torch's pinned copy otherwise.
    copy = getattr(accelerator, "copy_to_host", None) if torch is None else None
    if mode == "off":
        return DeviceTiming(mode, device_type, None, event_class=event_class, copy_to_host=copy)
    work = DeviceWorkClock()
    if mode == "sync":
        sync, pending = _in_use_sync(device_type, accelerator, torch)
        return DeviceTiming(mode, device_type, work.timed_sync(sync, monitoring=False),
                            pending_first_use=pending, resolved="sync", work=work,
                            event_class=event_class, copy_to_host=copy)
    make_event = _event_maker(device_type, event_class) if event_class is not None else None
    if mode == "events":
        if make_event is None:
            _log.info("otel-train: device_sync=events needs torch.Event (torch >= 2.4); "
                      "timing on the host clock")
            return DeviceTiming(mode, device_type, None)
        return DeviceTiming(mode, device_type, None, make_event, resolved="events", work=work,
                            event_class=event_class, copy_to_host=copy)
    # auto and monitor_sync: no synchronize in training phases (it would drain the queue
    # and lose the overlap every training loop relies on); one at each monitoring boundary.
    sync, pending = _in_use_sync(device_type, accelerator, torch)
    if pending and make_event is not None:
        # No event before the process's first use of the device either: recording one
        # would create the device context, as a synchronize would.
        make_event = _event_once_in_use(make_event,
                                        _in_use_check(torch, accelerator, device_type))
    return DeviceTiming(mode, device_type, None, make_event, pending_first_use=pending,
                        monitor_synchronize=work.timed_sync(sync, monitoring=True),
                        resolved="monitor_sync", work=work, event_class=event_class,
                        copy_to_host=copy)


def device_value_copier(timing: DeviceTiming) -> DeviceValueCopier | None:
    """What ``set_attribute`` / ``count`` keep of a device tensor on this run's accelerator: a
    non-blocking copy to host memory and an event (``device_values.py``); None on CPU, or
    without ``torch.Event`` (a device tensor is then exported as its dtype and shape)."""
    if timing.device_type == "cpu" or timing.event_class is None:
        return None
    return DeviceValueCopier(timing.event_class, timing.device_type, timing.work,
                             timing.copy_to_host)
