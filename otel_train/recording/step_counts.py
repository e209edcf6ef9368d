"""Tokens, samples and FLOPs of a step, taken on the training thread without a device sync.

What a step trained on goes onto its root span as ``train.tokens`` / ``train.samples``
(``derived/throughput.py`` turns them into rates and MFU in the background):

- ``step.count(tokens=..., samples=...)``: per step, wins over everything else;
- the options ``tokens_per_step`` / ``samples_per_step``: an int (nothing is done here per
  step: the background fills it in) or a callable taking the batch;
- otherwise the batch's shape, where it is unambiguous: a tensor gives samples =
  ``shape[0]`` (and tokens = ``numel()`` when it is a 2-D integer tensor: token ids); a
  dict with ``input_ids`` (Hugging Face style) gives samples = ``shape[0]``, tokens =
  ``numel()`` (padding included: ``attention_mask.sum()`` would wait for the device); a
  tuple or list whose first item is a tensor, the other tensors sharing its first
  dimension, is read as that tensor. Anything else is ambiguous: one hint, then the batch
  is no longer inspected.

Only shapes are read (``shape``, ``ndim``, ``numel()``, ``dtype``): host metadata, never a
device sync. ``count_flops`` runs one early step (index 1: step 0 often compiles) under
``torch.utils.flop_counter.FlopCounterMode``, from just after its fetch to the start of the
next step; that step is marked ``train.flops.counted`` (the counting slows it) and the next
step carries the count (``train.flops``), the matmuls' dtype and the device's peak.

Usage::

    counter = BatchCounter.for_run(CountSettings(tokens_per_step=..., samples_per_step=...))
                                                          # None: nothing to do per batch
    recorder.steps(loader, "train", None, counter)        # run.steps: on_batch per batch
    step.count(tokens=4096)                               # or per step, by hand
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any

from otel_train.common import attributes as A
from otel_train.common.device_peaks import dtype_name, peak_flops_per_second
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.recording.call_checks import detached
from otel_train.recording.device_values import add_counts

_log = logging.getLogger("otel_train")
_warn = RateLimitedLogger(_log)
FLOPS_STEP_INDEX = 1  # the step counted under FlopCounterMode (step 0 often compiles)


_ID_DTYPES: frozenset[Any] = frozenset()  # integer dtypes: a 2-D tensor of them is token ids


def _tensor_type() -> type | None:
    """``torch.Tensor`` once the application imported torch (never imported here: a run
    whose loop has no torch must not pay for it); None until then."""
    global _ID_DTYPES
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "Tensor"):  # not imported (yet), or half-way
        return None
    _ID_DTYPES = frozenset((torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8))
    return torch.Tensor


# Each tensor attribute read costs ~0.1-0.3 us: ``shape`` once, then the torch.Size (a tuple).
def _tensor_counts(t: Any) -> tuple[int | None, int] | None:
    """(tokens or None, samples) of one tensor; None for a scalar."""
    shape = t.shape
    if not shape:
        return None
    if len(shape) == 2 and t.dtype in _ID_DTYPES:
        return shape[0] * shape[1], shape[0]
    return None, shape[0]


def shape_counts(batch: Any, tensor: type | None = None) -> tuple[int | None, int | None] | None:
    """(tokens, samples) read from ``batch``'s shape; None when the batch is ambiguous."""
    tensor = tensor or _tensor_type()
    if tensor is None:
        return None
    if isinstance(batch, tensor):
        return _tensor_counts(batch)
    if type(batch) is tuple or type(batch) is list:
        if not batch or not isinstance(batch[0], tensor):
            return None
        got = _tensor_counts(batch[0])
        if got is None:
            return None
        for x in batch[1:]:  # the others must share its first dimension
            if isinstance(x, tensor):
                shape = x.shape
                if not shape or shape[0] != got[1]:
                    return None
        return got
    if type(batch) is dict or isinstance(batch, Mapping):
        ids = batch.get("input_ids")
        if isinstance(ids, tensor):
            shape = ids.shape
            if shape:
                return prod_of(shape), shape[0]
    return None


def prod_of(shape: Any) -> int:
    """The number of elements of a shape (``numel()`` without another tensor call)."""
    n = 1
    for d in shape:
        n *= d
    return n


def checked_count(name: str, value: Any) -> Any:
    """A count given to ``step.count``, refused (ValueError) unless an int >= 0 or a
    tensor (read in the background)."""
    if (type(value) is int and value >= 0) or hasattr(value, "detach"):
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"step.count({name}={value!r}): must be an integer >= 0 or a tensor")
    return value


def write_counts(step: Any, tokens: Any, samples: Any, keep: Callable[[Any], Any],
                 add: bool = False) -> None:
    """Set the step root's ``train.tokens`` / ``train.samples`` (``add``: add to those of its
    earlier batches, as micro-batches); a None count is left as it is. A tensor count (a
    callable's mask sum) on the device starts its copy to the host here through ``keep``
    (the recorder's ``keep_value``, device_values.py): never read with a wait."""
    attrs = step.attrs
    if attrs is None:
        attrs = step.attrs = {}
    if tokens is not None:
        tokens = keep(tokens) if hasattr(tokens, "detach") else tokens
        attrs[A.TOKENS] = add_counts(tokens, attrs.get(A.TOKENS, 0)) if add else tokens
    if samples is not None:
        samples = keep(samples) if hasattr(samples, "detach") else samples
        attrs[A.SAMPLES] = add_counts(samples, attrs.get(A.SAMPLES, 0)) if add else samples


class StepCounts:
    """``step.count()``: the step's tokens and samples (a mixin of ``recorder.Step``)."""

    attrs: dict[str, Any] | None
    _recorder: Any

    def count(self, tokens: Any = None, samples: Any = None, batch: Any = None) -> None:
        """Tokens / samples this step trained on (root ``train.tokens`` / ``train.samples``).

        ``batch`` counts a batch the way ``run.steps`` does (the options, else its shape),
        for loops that fetch their own, added to the step's earlier batches (one call per
        micro-batch); ``tokens`` / ``samples`` win over it. Never syncs.
        """
        if batch is not None:
            counter = self._recorder.batch_counter
            if counter is not None:
                began = perf_counter_ns()
                counter.count_into(self, batch, add=True)
                counter.spent_ns += perf_counter_ns() - began
        if tokens is None and samples is None:
            return
        write_counts(self, None if tokens is None else checked_count("tokens", tokens),
                     None if samples is None else checked_count("samples", samples),
                     self._recorder.keep_value)


@dataclass(frozen=True)
class CountSettings:
    """What a run counts per batch (pipeline/settings.py ``count_settings``)."""

    tokens_per_step: Any = None  # an int (filled in by the background), a callable or None
    samples_per_step: Any = None
    count_flops: bool = False  # count step 1's FLOPs with torch's FlopCounterMode
    find_peak: bool = False  # flops_per_step given without a peak: the table's, once


class BatchCounter:
    """Counts each batch per the options; runs the one FLOP-counted step."""

    def __init__(self, tokens_per_step: Any = None, samples_per_step: Any = None,
                 count_flops: bool = False, find_peak: bool = False) -> None:
        self._tokens_fn: Callable[[Any], Any] | None = (
            tokens_per_step if callable(tokens_per_step) else None)
        self._samples_fn: Callable[[Any], Any] | None = (
            samples_per_step if callable(samples_per_step) else None)
        # From the shape: only what no option gives (an int is filled in by the background).
        self._shape_tokens = tokens_per_step is None
        self._shape_samples = samples_per_step is None
        self._tensor = _tensor_type()  # None until torch is imported
        self.flops_index: int | None = FLOPS_STEP_INDEX if count_flops else None
        self._find_peak = find_peak  # flops_per_step given, no peak: the table's, once
        self._flops: FlopCount | None = None
        self.failures = 0  # a callable that raised: counted and logged, never raised
        # The training thread's time counting batches (``on_batch``): not the hot path's
        # calibrated spans, so it is timed where it runs, two clock reads a batch (~0.1 us
        # next to ~1-3 us of shape reads), and charged as the run's own cost.
        self.spent_ns = 0
        self.active = False  # whether anything is left to do per batch or per step
        # What run.steps' loop (the C StepLoop, pure_twin.step_loop) calls per step: 0
        # nothing, 1 ``on_batch`` after each fetch, 2 ``before_fetch`` too (a FLOP count
        # is open); read once a step.
        self.loop_mode = 0
        self._refresh()

    @classmethod
    def for_run(cls, settings: CountSettings) -> BatchCounter | None:
        """The counter a run needs, or None when nothing is done per batch."""
        counter = cls(settings.tokens_per_step, settings.samples_per_step,
                      settings.count_flops, settings.find_peak)
        return counter if counter.active else None

    def _refresh(self) -> None:
        """Recompute ``active`` (read per step) after a change of what is left to do."""
        self._per_step = self.flops_index is not None or self._find_peak
        self.active = bool(self._tokens_fn or self._samples_fn or self._shape_tokens
                           or self._shape_samples or self._per_step or self._flops is not None)
        self.loop_mode = 0 if not self.active else 2 if self._flops is not None else 1

    def count_into(self, step: Any, batch: Any, add: bool = False) -> None:
        """Write the batch's counts on ``step``'s root attributes (``add``: to those of its
        earlier batches, as micro-batches); never raises."""
        tokens = samples = None
        if self._shape_tokens or self._shape_samples:
            if self._tensor is None:
                self._tensor = _tensor_type()
            got = shape_counts(batch, self._tensor) if self._tensor is not None else None
            if got is None:
                self._ambiguous(batch)
            else:
                if self._shape_tokens:
                    tokens = got[0]
                if self._shape_samples:
                    samples = got[1]
        if self._tokens_fn is not None:
            tokens = self._call(self._tokens_fn, batch, "tokens_per_step")
        if self._samples_fn is not None:
            samples = self._call(self._samples_fn, batch, "samples_per_step")
        if tokens is None and samples is None:
            return
        write_counts(step, tokens, samples, getattr(step._recorder, "keep_value", detached),
                     add)

    def _call(self, fn: Callable[[Any], Any], batch: Any, option: str) -> Any:
        try:
            return detached(fn(batch))
        except Exception as exc:  # never into training: logged (rate-limited) and counted
            self.failures += 1
            _warn.warning(option, "otel-train: option %s raised %r; this step is not counted",
                          option, exc)
            return None

    def _ambiguous(self, batch: Any) -> None:
        """One hint, then the shape is no longer read."""
        self._shape_tokens = self._shape_samples = False
        self._refresh()
        _log.info("otel-train: tokens/samples per step not counted: a batch of type %s has no "
                  "unambiguous size; give tokens_per_step= / samples_per_step= (an int or a "
                  "callable taking the batch) or call step.count(tokens=..., samples=...)",
                  type(batch).__name__)

    # -- the step loop and run.step() -------------------------------------------------
    def on_batch(self, step: Any, batch: Any) -> None:
        """The batch ``step`` fetched (run.steps, after its data phase): counted on it, the
        FLOP-counted step opened; timed (``spent_ns``); never raises."""
        began = perf_counter_ns()
        try:
            if self.active:
                self.count_into(step, batch)
                if self._per_step:  # the FLOP-counted step, the peak: once each
                    self.at_step_start(step, batch)
        except Exception as exc:  # never into training
            _warn.warning("count", "otel-train: counting a batch: %r", exc)
        self.spent_ns += perf_counter_ns() - began

    def before_fetch(self, step: Any) -> None:
        """A FLOP count still open ends onto ``step``, before its batch is fetched."""
        began = perf_counter_ns()
        try:
            self.close_flops(step)
        except Exception as exc:  # never into training
            _warn.warning("flops", "otel-train: ending the FLOP count: %r", exc)
        self.spent_ns += perf_counter_ns() - began

    def at_step_start(self, step: Any, batch: Any = None) -> None:
        """The FLOP-counted step starts its counting; the peak is looked up once."""
        if step.index == self.flops_index and self._flops is None:
            self.flops_index = None
            self._flops = FlopCount.open(step, batch)
            self._refresh()
        elif self._find_peak and step.index >= FLOPS_STEP_INDEX:
            self._find_peak = False
            self._refresh()
            try:
                peak, dtype = device_peak(batch_device(batch), None)
            except Exception as exc:  # never into training
                _warn.warning("peak", "otel-train: the device's peak FLOP/s: %r", exc)
                return
            attrs = step.attrs if step.attrs is not None else {}
            if peak is not None:
                attrs[A.PEAK_FLOPS] = peak
                attrs[A.FLOPS_DTYPE] = dtype
                step.attrs = attrs

    def at_manual_step(self, step: Any) -> None:
        """``run.step()`` began ``step``: an open FLOP count ends (onto it), or one begins."""
        if self._flops is not None:
            self.close_flops(step)
        self.at_step_start(step)

    def close_flops(self, step: Any) -> None:
        """End an open FLOP count, writing it onto ``step`` (None: it is lost)."""
        flops, self._flops = self._flops, None
        if flops is not None:
            self._refresh()
            flops.close(step)


def batch_device(batch: Any) -> Any:
    """The device of the batch's (first) tensor, or None."""
    device = getattr(batch, "device", None)
    if device is None and isinstance(batch, Mapping):
        device = getattr(batch.get("input_ids"), "device", None)
    if device is None and isinstance(batch, (tuple, list)) and batch:
        device = getattr(batch[0], "device", None)
    return device


def device_peak(device: Any, dtype: Any) -> tuple[float | None, str | None]:
    """(the table's peak, dtype name) for ``device`` (None: CUDA's current, if in use)."""
    torch = sys.modules.get("torch")
    if torch is None:  # no torch in this process: no device to look up
        return None, None
    if getattr(device, "type", None) != "cuda" and not (
            device is None and torch.cuda.is_initialized()):
        return None, None  # CPU (or unknown): no table entry; peak_flops_per_second gives one
    index = device.index if device is not None and device.index is not None else None
    name = torch.cuda.get_device_name(index)
    if dtype is None:
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") \
            else torch.get_default_dtype()
    label = dtype_name(dtype, torch.backends.cuda.matmul.allow_tf32)
    return (peak_flops_per_second(name, label) if label else None), label


class FlopCount:
    """One step under ``FlopCounterMode``; the matmuls' dtype noted on the way."""

    def __init__(self, mode: Any, device: Any, start_ns: int) -> None:
        self.mode = mode
        self.device = device
        self.start_ns = start_ns

    @classmethod
    def open(cls, step: Any, batch: Any) -> FlopCount | None:
        """Start counting on ``step`` (marked ``train.flops.counted``); None without torch."""
        try:
            mode = _dtype_flop_counter()(display=False, custom_mapping=_cpu_attention())
            mode.__enter__()
        except Exception as exc:
            _warn.warning("count_flops", "otel-train: count_flops could not start: %r", exc)
            return None
        attrs = step.attrs if step.attrs is not None else {}
        attrs[A.FLOPS_COUNTED] = True
        step.attrs = attrs
        return cls(mode, batch_device(batch), perf_counter_ns())

    def close(self, step: Any) -> None:
        """Stop counting; the count, dtype and peak go onto ``step``'s root attributes."""
        try:
            self.mode.__exit__(None, None, None)
            flops = int(self.mode.get_total_flops())
            peak, dtype = device_peak(self.device, self.mode.matmul_dtype)
            if dtype is None and self.mode.matmul_dtype is not None:
                dtype = dtype_name(self.mode.matmul_dtype)
        except Exception as exc:
            _warn.warning("count_flops", "otel-train: count_flops failed: %r", exc)
            return
        _log.debug("otel-train: counted %d FLOPs in %.3f s", flops,
                   (perf_counter_ns() - self.start_ns) / 1e9)
        if step is None or not flops:
            return
        attrs = step.attrs if step.attrs is not None else {}
        attrs[A.FLOPS] = flops
        if dtype is not None:
            attrs[A.FLOPS_DTYPE] = dtype
        if peak is not None:
            attrs[A.PEAK_FLOPS] = peak
        step.attrs = attrs


_COUNTER_CLASS: Any = None


def _cpu_attention() -> dict[Any, Any]:
    """The CPU kernels of ``scaled_dot_product_attention``, which the counter's own table
    lacks (the CUDA ones are in it): counted with its formulas for the other kernels."""
    import torch
    from torch.utils import flop_counter

    def raw(formula: Callable[..., int]) -> Callable[..., int]:
        def count(*args: Any, **kwargs: Any) -> int:
            return formula(*args, **kwargs)  # already reads shapes from the tensors
        count._get_raw = True  # type: ignore[attr-defined]
        return count

    aten = torch.ops.aten
    pairs = (("_scaled_dot_product_flash_attention_for_cpu", "sdpa_flop"),
             ("_scaled_dot_product_flash_attention_for_cpu_backward", "sdpa_backward_flop"))
    return {getattr(aten, op): raw(getattr(flop_counter, formula)) for op, formula in pairs
            if hasattr(aten, op) and hasattr(flop_counter, formula)}


def _dtype_flop_counter() -> Any:
    """``FlopCounterMode`` that also notes the dtype of the first counted operator."""
    global _COUNTER_CLASS
    if _COUNTER_CLASS is None:
        from torch.utils.flop_counter import FlopCounterMode

        class DtypeFlopCounter(FlopCounterMode):  # type: ignore[misc]
            matmul_dtype: Any = None

            def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
                if self.matmul_dtype is None and func_packet in self.flop_registry:
                    for a in args:
                        dt = getattr(a, "dtype", None)
                        if dt is not None:
                            self.matmul_dtype = dt
                            break
                return super()._count_flops(func_packet, out, args, kwargs)

        _COUNTER_CLASS = DtypeFlopCounter
    return _COUNTER_CLASS
