"""User attribute values made safe to export, off the hot path, with the SDK's limits.

``step.set_attribute(key, value)`` stores the value as given (the hot path only appends);
the span builder calls :func:`plain_attributes` in the background. It applies the limits the
OpenTelemetry SDK applies to span attributes (``SpanLimits`` and ``BoundedAttributes``):

- value length: ``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT``, else
  ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``: strings (also inside lists) are cut to that many
  characters. Without either, a default cap of :data:`DEFAULT_VALUE_LENGTH` applies to the
  values set through ``set_attribute`` (the SDK has none; a 5 MiB string would make a whole
  request too large for a collector);
- count: ``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT``, else ``OTEL_ATTRIBUTE_COUNT_LIMIT``, else 128
  attributes a span. Over it the oldest user attributes are dropped, as the SDK drops the
  oldest, except that the contract's own attributes (run id, step, phase...) always stay.

Values that are not attribute types are converted, never ``repr``'d in full: a host tensor
or array of one element becomes its number (``Tensor.item``); a device value becomes its number
once its non-blocking copy has landed (``recording/device_values.py``: the host copy is read,
never the device tensor), else it is left out and counted by reason in ``drops``
(``device_value_not_ready``: not landed by the time the span was built;
``device_value_unread``: its copy could not start, or a device tensor kept without one); a
larger tensor a short summary such as ``tensor(dtype=torch.float32, shape=(1000,))``; a dict
or other object a bounded ``reprlib`` string. A value that had to be changed, cut or dropped
warns once per key.

Usage::

    limits = AttributeLimits.from_env()
    attrs.update(plain_attributes(step.attrs, limits, room=limits.count - len(attrs)))
"""

from __future__ import annotations

import os
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from otel_train.common.drop_counter import DropCounter
from otel_train.common.rate_limited_log import warn_once
from otel_train.recording.device_values import is_device_tensor, is_pending, unreadable

DEFAULT_VALUE_LENGTH = 4096
DEFAULT_COUNT = 128  # the SDK's default span attribute count limit
# Lists longer than this keep their first elements (our guard; the SDK has none).
MAX_SEQUENCE_ITEMS = 1024
_SCALARS = (str, bool, int, float)
_INT64 = (-(1 << 63), (1 << 63) - 1)


def _env_limit(env: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    """The first set limit among ``names`` (SDK rules: a non-negative integer)."""
    for name in names:
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            continue
        try:
            value = int(raw.strip())
            if value >= 0:
                return value
        except ValueError:
            pass
        warn_once(name, "otel-train: %s=%r is not a non-negative integer; ignored", name, raw)
    return None


@dataclass(frozen=True)
class AttributeLimits:
    """The value length and count limits for user attributes on one span."""

    value_length: int = DEFAULT_VALUE_LENGTH
    count: int = DEFAULT_COUNT

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AttributeLimits:
        """Read the OTEL_*_ATTRIBUTE_* limits as the SDK's ``SpanLimits`` does."""
        env = os.environ if env is None else env
        length = _env_limit(env, ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
                                  "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"))
        count = _env_limit(env, ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "OTEL_ATTRIBUTE_COUNT_LIMIT"))
        return cls(DEFAULT_VALUE_LENGTH if length is None else length,
                   DEFAULT_COUNT if count is None else count)


_DEFAULT_LIMITS = AttributeLimits()


def _bounded_repr(limit: int) -> reprlib.Repr:
    r = reprlib.Repr()
    r.maxlevel, r.maxdict, r.maxlist, r.maxtuple, r.maxset = 3, 16, 16, 16, 16
    r.maxstring = r.maxother = r.maxlong = max(16, min(limit, 256))
    return r


def _changed(key: str, why: str) -> None:
    warn_once(f"attribute-value:{key}", "otel-train: attribute %r: %s", key, why)


def _cut(key: str, text: str, limit: int) -> str:
    if len(text) > limit:
        _changed(key, f"value of {len(text)} characters cut to {limit} "
                 "(OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT)")
        return text[:limit]
    return text


def _array_summary(value: Any) -> str | None:
    """``tensor(dtype=..., shape=(...))`` for tensors and arrays; None for other objects."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return None
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        return None
    kind = "tensor" if hasattr(value, "numel") else type(value).__name__
    return f"{kind}(dtype={dtype}, shape={dims})"


def _numel(value: Any) -> int | None:
    numel = getattr(value, "numel", None)
    if callable(numel):
        try:
            return int(numel())
        except Exception:
            return None
    size = getattr(value, "size", None)
    return size if isinstance(size, int) else None


class DeviceValueNotRead(Exception):
    """A device value left out of its span: ``reason`` says why (a drop reason)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _landed(value: Any) -> Any:
    """A device value's number from its pinned host copy, once its event has completed."""
    if unreadable(value):  # its copy could not start
        raise DeviceValueNotRead("device_value_unread")
    if not value.ready():  # event.query(): a host-side check, never a wait
        raise DeviceValueNotRead("device_value_not_ready")
    if value.failed:  # a device error: its event could not be queried
        raise DeviceValueNotRead("device_value_unread")
    return value.value()


def plain_value(key: str, value: Any, limit: int) -> Any:
    """One value as an OTel attribute type, within ``limit`` characters.

    Raises :class:`DeviceValueNotRead` for a device value that is not on the host (yet).
    """
    t = type(value)
    if t is str:
        return _cut(key, value, limit)
    if t is bool or t is float:
        return value
    if t is int:
        if _INT64[0] <= value <= _INT64[1]:
            return value
        _changed(key, "integer outside 64 bits sent as a string")
        return _cut(key, str(value), limit)
    if isinstance(value, bytes):
        if len(value) > limit:
            _changed(key, f"{len(value)} bytes cut to {limit}")
            return value[:limit]
        return value
    if is_pending(value) or unreadable(value):
        return plain_value(key, _landed(value), limit)
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, (list, tuple, dict)):
        n = _numel(value)
        if n == 1 and is_device_tensor(value):
            # Never a blocking read of a device tensor here: it would wait behind every
            # kernel queued since. A run on an accelerator copies it without waiting
            # (device_values.py); one kept without that copy is left out.
            raise DeviceValueNotRead("device_value_unread")
        if n == 1 or (n is None and _array_summary(value) is None):
            # Read off the hot path: a host value (a CPU tensor, an array).
            try:
                scalar = item()
                if isinstance(scalar, _SCALARS):
                    return plain_value(key, scalar, limit)
            except Exception:
                pass
    summary = _array_summary(value)
    if summary is not None:
        _changed(key, f"{summary} sent as that summary; set a number (e.g. a mean) to see it")
        return _cut(key, summary, limit)
    if isinstance(value, (list, tuple)) and all(isinstance(v, _SCALARS) for v in value):
        items = list(value)
        if len(items) > MAX_SEQUENCE_ITEMS:
            _changed(key, f"list of {len(items)} cut to {MAX_SEQUENCE_ITEMS} elements")
            items = items[:MAX_SEQUENCE_ITEMS]
        return [_cut(key, v, limit) if type(v) is str else v for v in items]
    if isinstance(value, str):  # a str subclass
        return _cut(key, str.__str__(value), limit)
    _changed(key, f"{type(value).__name__} is not an attribute type; sent as a short string")
    try:
        text = _bounded_repr(limit).repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return _cut(key, text, limit)


def plain_attributes(attrs: Mapping[Any, Any], limits: AttributeLimits = _DEFAULT_LIMITS,
                     room: int | None = None, drops: DropCounter | None = None
                     ) -> dict[str, Any]:
    """Attribute values OTel accepts, within ``limits``; at most ``room`` of them (the newest).

    A device value not on the host is left out, counted in ``drops`` by reason."""
    out: dict[str, Any] = {}
    limit = limits.value_length
    for key, value in attrs.items():
        if not isinstance(key, str) or not key:
            warn_once(f"attribute-key:{key!r}", "otel-train: attribute key %r dropped: keys "
                      "must be non-empty strings", key)
            continue
        try:
            out[key] = plain_value(key, value, limit)
        except DeviceValueNotRead as exc:
            if drops is not None:
                drops.add(exc.reason)
            warn_once(f"device-value:{key}", "otel-train: attribute %r: a device value left "
                      "out (%s); counted under dropped_attributes in run.costs()", key,
                      exc.reason)
    if room is not None and len(out) > max(0, room):
        keep = max(0, room)
        drop = len(out) - keep
        warn_once("attribute-count", "otel-train: a span had more than %d attributes "
                  "(OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT); %d of the oldest user attributes were "
                  "dropped", limits.count, drop)
        out = dict(list(out.items())[drop:])
    return out
