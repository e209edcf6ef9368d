"""NVML GPU sampler: per-GPU utilization and memory, sampled on a background daemon thread.

`NvmlGpuSampler` polls NVML (through `pynvml`, provided by the ``nvidia-ml-py`` package) every
``interval_seconds`` and keeps a bounded history, so step spans can carry the GPU state in force
during the step and Prometheus gauges (``otel_train_gpu_utilization_ratio``,
``otel_train_gpu_memory_used_bytes``, label ``gpu``) can be fed from ``on_sample``.

Degrades cleanly: with no ``pynvml``, no driver, or no GPU, ``start()`` logs one info line on the
``otel_train.derived.gpu`` logger, starts no thread and returns False; ``unavailable_reason`` says why.
Nothing raises out of the sampler thread: per-device errors are counted in ``errors_total`` and
logged at most once per minute.

Devices that do not support utilization queries (``NVMLError_NotSupported``, e.g. MIG-enabled GPUs)
are kept: their samples carry memory figures and ``utilization_ratio=None`` (never NaN or a fake
number), and the unsupported query is not retried.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = ["GpuSample", "NvmlGpuSampler"]

logger = logging.getLogger("otel_train.gpu")

# At most one warning per this many seconds for sampling/callback errors (they are counted anyway).
_ERROR_LOG_INTERVAL_SECONDS = 60.0
_THREAD_NAME = "otel-train-gpu-sampler"


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU."""

    index: int  # NVML device index
    utilization_ratio: float | None  # 0..1 (utilization.gpu / 100); None when not supported (MIG)
    memory_used_bytes: int
    memory_total_bytes: int
    timestamp_ns: int  # time.time_ns() when taken


class NvmlGpuSampler:
    """Samples NVML GPUs on a daemon thread; unavailable NVML/GPU is a clear state, not an error.

    One round = one sample per device. A round in which every device failed is not passed on,
    and ``latest()`` keeps the last non-empty round (which readings overlap which step is
    ``gpu_step_attributes.py``'s business). ``on_sample`` receives each non-empty round's samples, on the sampler thread
    (the first round, taken inside ``start()``, on the caller's thread).
    """

    def __init__(
        self,
        interval_seconds: float = 5.0,
        on_sample: Callable[[list[GpuSample]], None] | None = None,
        device_indices: Sequence[int] | None = None,
    ) -> None:
        """Configure only; NVML is touched in start()."""
        if not interval_seconds > 0:
            raise ValueError("interval_seconds must be > 0")
        self.interval_seconds = float(interval_seconds)
        self._on_sample = on_sample
        self._device_indices = None if device_indices is None else [int(i) for i in device_indices]
        self._lock = threading.Lock()
        self._latest: list[GpuSample] = []
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: ModuleType | None = None
        self._nvml_inits = 0  # successful nvmlInit calls not yet matched by nvmlShutdown
        self._handles: list[tuple[int, Any]] = []
        self._no_utilization: set[int] = set()  # devices whose utilization query is unsupported
        self._available = False
        self._unavailable_reason: str | None = None
        self._last_error_log = float("-inf")
        self.errors_total = 0  # sampling and on_sample errors since construction

    # -- state -----------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        """True after a successful start(): NVML initialised and at least one GPU found."""
        return self._available

    @property
    def unavailable_reason(self) -> str | None:
        """Why start() found no usable GPU (None when available or not started yet)."""
        return self._unavailable_reason

    @property
    def device_indices(self) -> list[int]:
        """NVML indices being sampled (empty until a successful start())."""
        return [index for index, _ in self._handles]

    @property
    def running(self) -> bool:
        """True while the sampler thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> bool:
        """Init NVML and start sampling; False (one info line, no thread) when unavailable."""
        if self.running:
            return True
        reason = self._init_nvml()
        if reason is not None:
            self._available = False
            self._unavailable_reason = reason
            logger.info("GPU metrics disabled: %s", reason)
            return False
        self._available = True
        self._unavailable_reason = None
        # A fresh event per run: a thread left over from a timed-out stop() stays stopped.
        self._stop_event = stop_event = threading.Event()
        self._sample_once(stop_event)  # so latest() is meaningful as soon as start() returns
        thread = threading.Thread(
            target=self._run, args=(stop_event,), name=_THREAD_NAME, daemon=True
        )
        try:
            thread.start()
        except RuntimeError as exc:  # "can't start new thread": degrade, don't raise
            self._shutdown_nvml()
            self._available = False
            self._unavailable_reason = f"could not start the sampler thread: {exc}"
            logger.info("GPU metrics disabled: %s", self._unavailable_reason)
            return False
        self._thread = thread
        return True

    def stop(self, timeout_seconds: float = 1.0) -> None:
        """Stop the thread (bounded join); NVML is shut down as the thread exits. Idempotent."""
        self._stop_event.set()
        self._available = False
        thread, self._thread = self._thread, None
        if thread is None:
            return  # never started, already stopped, or start() failed (it cleaned up itself)
        if thread is threading.current_thread():
            return  # called from on_sample: the loop ends after this round
        thread.join(timeout=max(0.0, timeout_seconds))
        if thread.is_alive():
            # Stuck inside an NVML call: the thread still shuts NVML down once the call returns,
            # rather than us pulling the library out from under a call in flight.
            logger.warning(
                "GPU sampler thread did not stop within %.1f s; it will exit on its own",
                timeout_seconds,
            )

    def __enter__(self) -> NvmlGpuSampler:
        """Start on entering the block (check `available` for the outcome)."""
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Stop on leaving the block."""
        self.stop()

    # -- reading ---------------------------------------------------------------------------
    def latest(self) -> list[GpuSample]:
        """The most recent round of samples (empty before any sample)."""
        with self._lock:
            return list(self._latest)

    # -- internals -------------------------------------------------------------------------
    def _init_nvml(self) -> str | None:
        """Import pynvml, init NVML, get handles; return a reason string when unusable."""
        try:
            import pynvml  # lazy: only users who want GPU metrics pay for (or need) it
        except ImportError:
            return "pynvml not installed (pip install nvidia-ml-py)"
        except Exception as exc:  # noqa: BLE001 (a broken install must not break training)
            return f"pynvml could not be imported: {exc}"
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # noqa: BLE001 (NVMLError, or OSError from a broken driver)
            return f"NVML could not initialise: {exc}"
        with self._lock:
            self._nvml = pynvml
            self._nvml_inits += 1
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except Exception as exc:  # noqa: BLE001
            self._shutdown_nvml()
            return f"NVML could not count GPUs: {exc}"
        if count <= 0:
            self._shutdown_nvml()
            return "no NVIDIA GPU found"
        wanted = list(range(count)) if self._device_indices is None else self._device_indices
        handles: list[tuple[int, Any]] = []
        problems: list[str] = []
        for index in wanted:
            if not 0 <= index < count:
                problems.append(f"GPU {index} does not exist ({count} found)")
                continue
            try:
                handles.append((index, pynvml.nvmlDeviceGetHandleByIndex(index)))
            except Exception as exc:  # noqa: BLE001
                problems.append(f"GPU {index}: {exc}")
        if problems and handles:
            logger.warning("some GPUs will not be sampled: %s", "; ".join(problems))
        if not handles:
            self._shutdown_nvml()
            detail = f" ({'; '.join(problems)})" if problems else ""
            return f"no usable NVIDIA GPU among indices {wanted}{detail}"
        self._handles = handles
        self._no_utilization.clear()
        return None

    def _shutdown_nvml(self) -> None:
        """nvmlShutdown once per successful nvmlInit (NVML counts them); never raises."""
        with self._lock:
            nvml = self._nvml
            if nvml is None or self._nvml_inits <= 0:
                return
            self._nvml_inits -= 1
        try:
            nvml.nvmlShutdown()
        except Exception as exc:  # noqa: BLE001
            logger.debug("nvmlShutdown failed: %s", exc)

    def _run(self, stop_event: threading.Event) -> None:
        """Thread body: sample every interval until stopped; never raises."""
        try:
            while not stop_event.wait(self.interval_seconds):
                self._sample_once(stop_event)
        finally:
            # The thread owns the NVML session it samples, so shutdown never races a call.
            self._shutdown_nvml()

    def _sample_once(self, stop_event: threading.Event) -> None:
        """Take one round, store it and call on_sample; errors are counted, never raised."""
        try:
            samples = self._take_round(stop_event)
        except Exception as exc:  # noqa: BLE001 (belt and braces: the thread must survive)
            self._count_error("GPU sampling failed: %s", exc)
            return
        if not samples or stop_event.is_set():
            return  # nothing read, or stop() already returned: consumers expect no more calls
        with self._lock:
            self._latest = samples
        if self._on_sample is not None:
            try:
                self._on_sample(list(samples))
            except Exception as exc:  # noqa: BLE001 (a consumer's bug must not stop sampling)
                self._count_error("GPU on_sample callback failed: %s", exc)

    def _take_round(self, stop_event: threading.Event) -> list[GpuSample]:
        """One sample per device; a failing device is skipped (and counted) for this round."""
        nvml = self._nvml
        if nvml is None:
            return []
        not_supported = getattr(nvml, "NVMLError_NotSupported", None)
        samples: list[GpuSample] = []
        for index, handle in self._handles:
            if stop_event.is_set():
                break  # stopping: don't start new NVML calls
            try:
                utilization: float | None = None
                if index not in self._no_utilization:
                    try:
                        rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                        utilization = min(max(float(rates.gpu) / 100.0, 0.0), 1.0)
                    except Exception as exc:
                        if not_supported is None or not isinstance(exc, not_supported):
                            raise
                        # MIG and some boards: expected and permanent; say so once, report memory.
                        self._no_utilization.add(index)
                        logger.info(
                            "GPU %d: utilization not supported (%s); memory only", index, exc
                        )
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                samples.append(
                    GpuSample(
                        index=index,
                        utilization_ratio=utilization,
                        memory_used_bytes=int(memory.used),
                        memory_total_bytes=int(memory.total),
                        timestamp_ns=time.time_ns(),
                    )
                )
            except Exception as exc:  # noqa: BLE001
                self._count_error(f"GPU {index} sample failed: %s", exc)
        return samples

    def _count_error(self, message: str, exc: BaseException) -> None:
        """Count an error; warn at most once per _ERROR_LOG_INTERVAL_SECONDS."""
        now = time.monotonic()
        with self._lock:
            self.errors_total += 1
            should_log = now - self._last_error_log >= _ERROR_LOG_INTERVAL_SECONDS
            if should_log:
                self._last_error_log = now
            total = self.errors_total
        if should_log:
            logger.warning(
                message + " (%d GPU sampler error(s) so far; at most one warning per minute)",
                exc,
                total,
            )
