"""NvmlGpuSampler against a faithful fake `pynvml`, plus the real one on this GPU-less box."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from otel_train.derived.gpu import GpuSample, NvmlGpuSampler

pytestmark = pytest.mark.timeout(30)

THREAD_NAME = "otel-train-gpu-sampler"
GIB = 1024**3


# --------------------------------------------------------------------------------------------
# A fake pynvml, shaped like nvidia-ml-py's module: same function names and signatures, the same
# NVMLError hierarchy (str(err) is NVML's error string), handles as opaque objects, and "call
# before nvmlInit" failing with NVMLError_Uninitialized like the real library.
# --------------------------------------------------------------------------------------------
class NVMLError(Exception):
    """Fake pynvml.NVMLError: carries NVML's numeric return code in .value."""

    _strings = {
        1: "Uninitialized",
        2: "Invalid Argument",
        3: "Not Supported",
        12: "NVML Shared Library Not Found",
        15: "GPU is lost",
        999: "Unknown Error",
    }

    def __init__(self, value: int) -> None:
        """Keep the return code."""
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        """NVML's error string, as the real NVMLError prints."""
        return self._strings.get(self.value, f"NVML error {self.value}")


class NVMLError_Uninitialized(NVMLError):  # noqa: N801 (pynvml's names)
    def __init__(self) -> None:
        super().__init__(1)


class NVMLError_InvalidArgument(NVMLError):  # noqa: N801
    def __init__(self) -> None:
        super().__init__(2)


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    def __init__(self) -> None:
        super().__init__(3)


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801
    def __init__(self) -> None:
        super().__init__(12)


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    def __init__(self) -> None:
        super().__init__(15)


Script = Iterable[Any]  # each item: a value, an exception instance (raised), or a callable


class FakeGpu:
    """One scripted device. Each query consumes the next script item; the last one repeats."""

    def __init__(self, utilization: Script = (50,), used: Script = (GIB,), total: int = 8 * GIB):
        """Scripts of utilization.gpu percentages and memory used bytes."""
        self._utilization = list(utilization)
        self._used = list(used)
        self.total = total
        self.utilization_calls = 0
        self.memory_calls = 0

    @staticmethod
    def _play(script: list[Any], call: int) -> Any:
        """Return/raise the scripted item for this call number."""
        item = script[min(call, len(script) - 1)]
        if isinstance(item, BaseException):
            raise item
        if callable(item):
            return item()
        return item

    def utilization(self) -> types.SimpleNamespace:
        """Like c_nvmlUtilization_t: .gpu and .memory percentages."""
        call, self.utilization_calls = self.utilization_calls, self.utilization_calls + 1
        value = self._play(self._utilization, call)
        return types.SimpleNamespace(gpu=value, memory=value // 2)

    def memory(self) -> types.SimpleNamespace:
        """Like c_nvmlMemory_t: .total, .free, .used bytes."""
        call, self.memory_calls = self.memory_calls, self.memory_calls + 1
        used = self._play(self._used, call)
        return types.SimpleNamespace(total=self.total, free=self.total - used, used=used)


class _Handle:
    """Opaque device handle (the real one is a ctypes pointer)."""

    def __init__(self, index: int) -> None:
        self.index = index


def make_fake_pynvml(
    gpus: list[FakeGpu], init_error: BaseException | None = None
) -> types.ModuleType:
    """Build a module object exposing the pynvml API the sampler uses."""
    module = types.ModuleType("pynvml")
    state = {"refcount": 0}
    module.init_calls = 0  # type: ignore[attr-defined]
    module.shutdown_calls = 0  # type: ignore[attr-defined]
    lock = threading.Lock()

    def require_init() -> None:
        if state["refcount"] <= 0:
            raise NVMLError_Uninitialized()

    def nvmlInit() -> None:  # noqa: N802
        if init_error is not None:
            raise init_error
        with lock:
            state["refcount"] += 1
            module.init_calls += 1  # type: ignore[attr-defined]

    def nvmlShutdown() -> None:  # noqa: N802
        with lock:
            require_init()
            state["refcount"] -= 1
            module.shutdown_calls += 1  # type: ignore[attr-defined]

    def nvmlDeviceGetCount() -> int:  # noqa: N802
        require_init()
        return len(gpus)

    def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:  # noqa: N802
        require_init()
        if not 0 <= index < len(gpus):
            raise NVMLError_InvalidArgument()
        return _Handle(index)

    def nvmlDeviceGetUtilizationRates(handle: _Handle) -> types.SimpleNamespace:  # noqa: N802
        require_init()
        return gpus[handle.index].utilization()

    def nvmlDeviceGetMemoryInfo(handle: _Handle, version: int | None = None):  # noqa: N802
        require_init()
        return gpus[handle.index].memory()

    for name, value in list(locals().items()):
        if name.startswith("nvml"):
            setattr(module, name, value)
    module.NVMLError = NVMLError  # type: ignore[attr-defined]
    module.NVMLError_Uninitialized = NVMLError_Uninitialized  # type: ignore[attr-defined]
    module.NVMLError_InvalidArgument = NVMLError_InvalidArgument  # type: ignore[attr-defined]
    module.NVMLError_NotSupported = NVMLError_NotSupported  # type: ignore[attr-defined]
    module.NVMLError_LibraryNotFound = NVMLError_LibraryNotFound  # type: ignore[attr-defined]
    module.NVMLError_GpuIsLost = NVMLError_GpuIsLost  # type: ignore[attr-defined]
    module.refcount = lambda: state["refcount"]  # type: ignore[attr-defined]
    return module


@pytest.fixture
def install(monkeypatch: pytest.MonkeyPatch) -> Callable[..., types.ModuleType]:
    """install(gpus, init_error=None) puts a fake pynvml in sys.modules for this test."""

    def _install(gpus: list[FakeGpu], init_error: BaseException | None = None) -> types.ModuleType:
        fake = make_fake_pynvml(gpus, init_error)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    return _install


@pytest.fixture
def sampler_factory() -> Iterable[Callable[..., NvmlGpuSampler]]:
    """Make samplers that are always stopped at teardown."""
    made: list[NvmlGpuSampler] = []

    def _make(**kwargs: Any) -> NvmlGpuSampler:
        sampler = NvmlGpuSampler(**kwargs)
        made.append(sampler)
        return sampler

    yield _make
    for sampler in made:
        sampler.stop(timeout_seconds=2.0)


def sampler_threads() -> list[threading.Thread]:
    """Live sampler threads."""
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def wait_until(condition: Callable[[], bool], timeout_seconds: float = 5.0) -> None:
    """Poll (bounded) until condition() is true; fail the test otherwise."""
    deadline = time.monotonic() + timeout_seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_seconds}s")
        time.sleep(0.005)


def gpu_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    """Records of otel_train.gpu at exactly `level`."""
    return [r for r in caplog.records if r.name == "otel_train.gpu" and r.levelno == level]


# --------------------------------------------------------------------------------------------
# Happy path
# --------------------------------------------------------------------------------------------
def test_two_gpus_produce_samples_and_callbacks(install, sampler_factory) -> None:
    fake = install(
        [
            FakeGpu(utilization=[10, 20, 30, 40], used=[1 * GIB, 2 * GIB], total=8 * GIB),
            FakeGpu(utilization=[100, 0], used=[5 * GIB], total=16 * GIB),
        ]
    )
    rounds: list[list[GpuSample]] = []
    sampler = sampler_factory(interval_seconds=0.01, on_sample=rounds.append)

    assert sampler.start() is True
    assert sampler.available and sampler.unavailable_reason is None
    assert sampler.device_indices == [0, 1]
    assert [s.index for s in sampler.latest()] == [0, 1]  # a round is taken inside start()
    first = rounds[0]  # latest() may already hold a later round from the thread
    assert [s.index for s in first] == [0, 1]
    assert first[0] == GpuSample(0, 0.10, 1 * GIB, 8 * GIB, first[0].timestamp_ns)
    assert first[1] == GpuSample(1, 1.0, 5 * GIB, 16 * GIB, first[1].timestamp_ns)
    assert abs(first[0].timestamp_ns - time.time_ns()) < 60 * 10**9
    assert len(sampler_threads()) == 1 and sampler_threads()[0].daemon

    wait_until(lambda: len(rounds) >= 5)
    sampler.stop()
    assert sampler_threads() == []
    assert fake.shutdown_calls == 1 and fake.refcount() == 0

    # Scripts play in order; the last value repeats.
    assert [r[0].utilization_ratio for r in rounds[:5]] == [0.1, 0.2, 0.3, 0.4, 0.4]
    assert [r[0].memory_used_bytes for r in rounds[:3]] == [GIB, 2 * GIB, 2 * GIB]
    assert [r[1].utilization_ratio for r in rounds[:3]] == [1.0, 0.0, 0.0]
    assert all(len(r) == 2 for r in rounds)
    stamps = [s.timestamp_ns for r in rounds for s in r]
    assert stamps == sorted(stamps)
    assert sampler.latest() == rounds[-1]
    assert sampler.errors_total == 0  # in particular no NVML call after shutdown


def test_device_indices_limit_sampling(install, sampler_factory) -> None:
    install([FakeGpu(), FakeGpu(utilization=[70])])
    sampler = sampler_factory(interval_seconds=0.01, device_indices=[1])
    assert sampler.start()
    assert [(s.index, s.utilization_ratio) for s in sampler.latest()] == [(1, 0.7)]


def test_utilization_not_supported_keeps_memory(install, sampler_factory, caplog) -> None:
    caplog.set_level(logging.INFO, logger="otel_train.gpu")
    mig = FakeGpu(utilization=[NVMLError_NotSupported()], used=[3 * GIB])
    install([FakeGpu(utilization=[25]), mig])
    rounds: list[list[GpuSample]] = []
    sampler = sampler_factory(interval_seconds=0.01, on_sample=rounds.append)
    assert sampler.start()
    wait_until(lambda: len(rounds) >= 3)
    sampler.stop()
    for r in rounds:
        assert r[0].utilization_ratio == 0.25
        assert r[1].utilization_ratio is None and r[1].memory_used_bytes == 3 * GIB
    assert mig.utilization_calls == 1  # unsupported is permanent: not asked again
    assert sampler.errors_total == 0
    assert len([r for r in gpu_records(caplog, logging.INFO) if "not supported" in r.message]) == 1


# --------------------------------------------------------------------------------------------
# Unavailable: clear reason, one info line, no thread
# --------------------------------------------------------------------------------------------
def _assert_unavailable(sampler: NvmlGpuSampler, caplog, reason_start: str) -> None:
    """start() returned False with a reason, logged one info line and started no thread."""
    assert sampler.available is False
    assert sampler.unavailable_reason is not None
    assert sampler.unavailable_reason.startswith(reason_start), sampler.unavailable_reason
    infos = gpu_records(caplog, logging.INFO)
    assert len(infos) == 1 and sampler.unavailable_reason in infos[0].getMessage()
    assert gpu_records(caplog, logging.WARNING) == []
    assert sampler_threads() == []
    assert sampler.latest() == []


def test_nvml_init_failure(install, sampler_factory, caplog) -> None:
    caplog.set_level(logging.INFO, logger="otel_train.gpu")
    fake = install([FakeGpu()], init_error=NVMLError_LibraryNotFound())
    threads_before = threading.active_count()
    sampler = sampler_factory(interval_seconds=0.01)
    assert sampler.start() is False
    _assert_unavailable(sampler, caplog, "NVML could not initialise: ")
    assert "NVML Shared Library Not Found" in sampler.unavailable_reason
    assert threading.active_count() == threads_before
    sampler.stop()
    sampler.stop()
    assert fake.shutdown_calls == 0  # nothing to shut down: init never succeeded


def test_zero_devices(install, sampler_factory, caplog) -> None:
    caplog.set_level(logging.INFO, logger="otel_train.gpu")
    fake = install([])
    sampler = sampler_factory(interval_seconds=0.01)
    assert sampler.start() is False
    _assert_unavailable(sampler, caplog, "no NVIDIA GPU found")
    assert fake.init_calls == 1 and fake.shutdown_calls == 1  # init balanced right away
    sampler.stop()
    assert fake.shutdown_calls == 1


def test_requested_device_missing(install, sampler_factory, caplog) -> None:
    caplog.set_level(logging.INFO, logger="otel_train.gpu")
    fake = install([FakeGpu(), FakeGpu()])
    sampler = sampler_factory(interval_seconds=0.01, device_indices=[5])
    assert sampler.start() is False
    _assert_unavailable(sampler, caplog, "no usable NVIDIA GPU among indices [5]")
    assert fake.refcount() == 0


def test_pynvml_missing(monkeypatch, sampler_factory, caplog) -> None:
    caplog.set_level(logging.INFO, logger="otel_train.gpu")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    sampler = sampler_factory(interval_seconds=0.01)
    assert sampler.start() is False
    _assert_unavailable(sampler, caplog, "pynvml not installed")


@pytest.mark.skipif(
    os.path.exists("/dev/nvidiactl"), reason="this machine has an NVIDIA driver"
)
def test_real_pynvml_on_this_cpu_only_machine(caplog) -> None:
    pytest.importorskip("pynvml")  # nvidia-ml-py is a dependency; the driver is what's missing
    caplog.set_level(logging.INFO, logger="otel_train.gpu")
    sampler = NvmlGpuSampler(interval_seconds=0.01)
    try:
        assert sampler.start() is False
        _assert_unavailable(sampler, caplog, "NVML could not initialise: ")
    finally:
        sampler.stop()


# --------------------------------------------------------------------------------------------
# Errors never kill the thread; stop is bounded and idempotent
# --------------------------------------------------------------------------------------------
def test_errors_mid_run_are_counted_and_survived(install, sampler_factory, caplog) -> None:
    caplog.set_level(logging.INFO, logger="otel_train.gpu")
    lost = NVMLError_GpuIsLost()
    flaky = FakeGpu(
        utilization=[60], used=[GIB, lost, lost, RuntimeError("driver hiccup"), 2 * GIB]
    )
    install([FakeGpu(utilization=[10]), flaky])
    rounds: list[list[GpuSample]] = []
    sampler = sampler_factory(interval_seconds=0.01, on_sample=rounds.append)
    assert sampler.start()
    # GPU 1 recovers after three failing rounds; GPU 0 kept reporting meanwhile.
    wait_until(lambda: len(rounds) >= 6 and rounds[-1][-1].index == 1)
    assert sampler.running
    assert sampler.errors_total == 3
    assert [len(r) for r in rounds[:5]] == [2, 1, 1, 1, 2]
    assert rounds[4][1].memory_used_bytes == 2 * GIB
    warnings = gpu_records(caplog, logging.WARNING)
    assert len(warnings) == 1  # rate limited: one per minute at most
    assert "GPU 1" in warnings[0].getMessage() and "GPU is lost" in warnings[0].getMessage()
    sampler.stop()
    assert sampler_threads() == []


def test_callback_errors_are_counted_and_survived(install, sampler_factory) -> None:
    install([FakeGpu()])
    calls: list[int] = []

    def on_sample(samples: list[GpuSample]) -> None:
        calls.append(len(samples))
        raise ValueError("consumer bug")

    sampler = sampler_factory(interval_seconds=0.01, on_sample=on_sample)
    assert sampler.start()
    wait_until(lambda: len(calls) >= 4)
    assert sampler.running and sampler.errors_total >= 4


def test_every_device_failing_keeps_last_good_round(install, sampler_factory) -> None:
    install([FakeGpu(used=[GIB, NVMLError_GpuIsLost()])])
    rounds: list[list[Any]] = []
    sampler = sampler_factory(interval_seconds=0.01, on_sample=rounds.append)
    assert sampler.start()
    wait_until(lambda: sampler.errors_total >= 3)
    assert sampler.running
    assert [s.memory_used_bytes for s in sampler.latest()] == [GIB]
    assert len(rounds) == 1  # empty rounds are not passed on


def test_stop_is_idempotent_and_balances_nvml(install, sampler_factory) -> None:
    fake = install([FakeGpu()])
    sampler = sampler_factory(interval_seconds=0.01)
    sampler.stop()  # before start: no-op
    assert sampler.start()
    assert sampler.start()  # already running: no second thread, no second init
    assert len(sampler_threads()) == 1 and fake.init_calls == 1
    sampler.stop()
    sampler.stop()
    assert fake.shutdown_calls == 1 and fake.refcount() == 0
    assert not sampler.running and not sampler.available
    # Restartable.
    assert sampler.start() and sampler.running
    sampler.stop()
    assert fake.init_calls == 2 and fake.shutdown_calls == 2 and sampler_threads() == []


def test_stop_is_bounded_when_nvml_blocks(install, sampler_factory) -> None:
    release = threading.Event()
    entered = threading.Event()
    calls = {"n": 0}

    def utilization() -> int:
        calls["n"] += 1
        if calls["n"] >= 2:  # start()'s synchronous round passes; the thread's first one sticks
            entered.set()
            release.wait(10)  # bounded, released by the test below
        return 42

    fake = install([FakeGpu(utilization=[utilization])])
    sampler = sampler_factory(interval_seconds=0.01)
    assert sampler.start()
    assert entered.wait(5)

    started = time.monotonic()
    sampler.stop(timeout_seconds=0.05)
    assert time.monotonic() - started < 2  # generous: the point is that it did not wait 10 s
    sampler.stop(timeout_seconds=0.05)  # idempotent while the thread is still stuck
    assert fake.shutdown_calls == 0  # NVML not pulled out from under the call in flight

    release.set()
    wait_until(lambda: sampler_threads() == [])
    assert fake.shutdown_calls == 1 and fake.refcount() == 0  # the thread shut NVML down


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        NvmlGpuSampler(interval_seconds=0)
