"""Device tensors given to ``set_attribute`` / ``count``, brought to host memory without waiting.

A loss or a token count is often a one-element tensor on the accelerator. Reading it with
``Tensor.item`` waits for the device: on the training thread that is a sync in the loop; in the
background it is worse, since the reading thread waits behind every kernel queued since
(later steps' work too), spinning, and takes the interpreter from the training thread.

So the training thread starts the read and nothing else: a non-blocking copy of the value
into pinned host memory, then a timing-free event recorded after it on the current stream
(``DeviceValueCopier``, the only device calls there, and neither waits). The background
reads the host copy once ``event.query()`` says the copy has landed
(``PendingDeviceValue.ready``); the span worker holds a step back while one of its values is
on its way, up to ``VALUE_WAIT_SECONDS`` after the step ended, and then builds it without
that value, counting it (``records/attribute_values.py``). Nothing here, nor in the
background, calls a blocking ``Tensor.item`` / ``tolist`` / ``cpu`` on a device tensor.

Tensors of more than one element are kept as they are: the background exports their dtype
and shape (host-side metadata), never their values.

Usage::

    copier = DeviceValueCopier(torch.Event, "cuda", work)
    step.attrs["train.loss"] = copier(loss)      # training thread: copy + event, no wait
    value = step.attrs["train.loss"]
    if value.ready():                             # background: event.query()
        number = value.host.item()  # explicit: host memory, no device wait
"""

from __future__ import annotations

from collections.abc import Callable
from time import perf_counter_ns
from typing import Any

from otel_train.common.device_work import DeviceWorkClock
from otel_train.recording.call_checks import detached

#: How long after its step ended a step waits in the queue for its device values (and its
#: sampled device events) to land before it is built without them (counted).
VALUE_WAIT_SECONDS = 2.0


class PendingDeviceValue:
    """A device value on its way to host memory: the pinned copy and the event after it."""

    __slots__ = ("host", "event", "failed")

    def __init__(self, host: Any, event: Any) -> None:
        self.host = host  # a pinned host tensor: valid once ``event`` has completed
        self.event = event
        self.failed = False  # the event could not be queried: the value is never read

    def ready(self) -> bool:
        """True once the copy has landed (``event.query()``: a host-side check, no wait), or
        once asking failed (a device error: nothing to wait for; the value is left out)."""
        try:
            return bool(self.event.query())
        except Exception:
            self.failed = True
            return True

    def value(self) -> Any:
        """The number, from host memory; call only once :meth:`ready`."""
        if self.failed:
            raise RuntimeError("the device value's event could not be queried")
        return self.host.item()  # explicit: a pinned host tensor, no device involved


class PendingDeviceSum:
    """Counts of several micro-batches (``step.count(batch=...)``), some on their way."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts

    def ready(self) -> bool:
        """True once every part's copy has landed."""
        return all(p.ready() for p in self.parts if isinstance(p, PendingDeviceValue))

    @property
    def failed(self) -> bool:
        """A part's event could not be queried: the sum is left out."""
        return any(getattr(p, "failed", False) for p in self.parts)

    def value(self) -> Any:
        """The sum, from host memory; call only once :meth:`ready`."""
        return sum(p.value() if isinstance(p, PendingDeviceValue) else p for p in self.parts)


def is_pending(value: Any) -> bool:
    """True for a value still on its way from the device (or made of such values)."""
    return isinstance(value, (PendingDeviceValue, PendingDeviceSum))


def add_counts(new: Any, earlier: Any) -> Any:
    """``new + earlier`` for a step's counts, where either may be on its way from the device."""
    if not (is_pending(new) or is_pending(earlier)):
        return new + earlier
    parts: list[Any] = []
    for v in (earlier, new):
        parts.extend(v.parts if isinstance(v, PendingDeviceSum) else (v,))
    return PendingDeviceSum(parts)


def is_device_tensor(value: Any) -> bool:
    """A tensor whose storage is on an accelerator (``tensor.device.type`` is not ``cpu``)."""
    device = getattr(value, "device", None)
    kind = getattr(device, "type", None)
    return kind is not None and kind != "cpu" and kind != "meta"


def pinned_host_copy(tensor: Any) -> Any:
    """A non-blocking copy of ``tensor`` into pinned host memory (torch): a copy into pageable
    memory would make the host wait for it."""
    import torch

    host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


class DeviceValueCopier:
    """The recorder's ``keep_value`` on an accelerator: a one-element device tensor becomes a
    :class:`PendingDeviceValue`; anything else is kept as :func:`call_checks.detached` keeps it.
    """

    def __init__(self, event_class: Any, device_type: str, work: DeviceWorkClock | None = None,
                 copy_to_host: Callable[[Any], Any] | None = None) -> None:
        self._event_class = event_class
        self._device_type = device_type
        self._work = work
        self._copy = copy_to_host or pinned_host_copy
        self.failures = 0  # copies that could not start: the value is left out, counted

    def __call__(self, value: Any) -> Any:
        kept = detached(value)
        if not is_device_tensor(kept):
            return kept
        try:
            if kept.numel() != 1:
                return kept  # the background exports dtype and shape only
            t0 = perf_counter_ns()
            # explicit device calls on the training thread, neither of which waits: the copy
            # is queued on the current stream after the work that computes the value, and
            # the event after the copy says when it has landed.
            host = self._copy(kept)
            event = self._event_class(device=self._device_type)
            event.record()
            if self._work is not None:
                self._work.copy_ns += perf_counter_ns() - t0
                self._work.copies += 1
            return PendingDeviceValue(host, event)
        except Exception:
            # Never into training, and never a blocking read later: the value is left out
            # (the background counts it: ``device_value_unread``).
            self.failures += 1
            return _UNREADABLE


class _Unreadable:
    """A device value whose copy could not start: left out of the span, counted."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<device value not copied>"


_UNREADABLE = _Unreadable()


def unreadable(value: Any) -> bool:
    """True for a value whose copy to the host could not start."""
    return value is _UNREADABLE


def _event_done(event: Any) -> bool:
    try:
        return bool(event.query())
    except Exception:  # a device error: building goes on without it
        return True


def record_ready(record: Any) -> bool:
    """True when nothing a finished step (or operation) holds is still on its way from the
    device: its device values and its sampled boundary events (host-side checks only)."""
    attrs = record.attrs
    if attrs and any(is_pending(v) and not v.ready() for v in attrs.values()):
        return False
    phase_attrs = getattr(record, "phase_attrs", None)
    if phase_attrs and any(is_pending(v) and not v.ready()
                           for d in phase_attrs.values() for v in d.values()):
        return False
    dev = getattr(record, "dev", None)
    if dev:
        return all(_event_done(r[0]) for r in dev.values() if r[0] is not None)
    return True
