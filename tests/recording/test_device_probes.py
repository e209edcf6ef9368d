"""DeviceProbes on the training thread: what a sampled step records at its boundaries (device
events, allocator peaks), which steps are sampled, and that none of it synchronizes."""

from __future__ import annotations

import pytest
import torch
from fake_accelerator import FakeAccelerator, FakeAllocator

from otel_train.common.drop_counter import DropCounter
from otel_train.common.options import RunOptions
from otel_train.recording.device import resolve_device_timing
from otel_train.recording.device_probes import (
    AllocatorPeaks,
    resolve_device_probes,
    torch_allocator_peaks,
)
from otel_train.recording.recorder import DeviceEventPhase, Phase, Recorder

pytestmark = pytest.mark.timeout(30)
MIB = 1024 ** 2


def _probes(dev: FakeAccelerator, mem: FakeAllocator | None, every: int = 1):
    timing = resolve_device_timing("events", accelerator=dev, event_class=dev.Event)
    return resolve_device_probes(timing.make_event, "cuda", every,
                                 "on" if mem is not None else "off",
                                 memory=mem.peaks() if mem is not None else None)


def test_a_sampled_step_keeps_an_event_and_a_reading_per_boundary_and_never_syncs():
    dev, mem = FakeAccelerator(), FakeAllocator(block_bytes=MIB)
    rec = Recorder(10, DropCounter(), None, _probes(dev, mem))
    step = rec.begin_step(None, 0)
    with step.phase("forward"):
        mem.allocate(10 * MIB)
    rec.finish_step(step, None)
    assert sorted(step.dev) == [-2, -1, 0, 2]  # step start, phase start and end, step end
    event, peaks = step.dev[2]
    assert event.enable_timing and peaks == (10 * MIB, 10 * MIB)
    assert dev.synchronize_calls == 0
    assert mem.stats_reads == mem.resets == 4


def test_only_every_nth_step_is_sampled_and_the_rest_record_nothing():
    dev, mem = FakeAccelerator(), FakeAllocator()
    rec = Recorder(10, DropCounter(), None, _probes(dev, mem, every=4))
    for step in rec.steps(range(7), None):
        with step.phase("forward"):
            pass
    assert [s.dev is not None for s in rec.queue] == [i % 4 == 0 for i in range(7)]
    assert dev.events_recorded == mem.stats_reads == 2 * 4  # start, forward (2), end


def test_probes_need_the_python_phase_and_a_plain_cpu_run_keeps_the_fast_one():
    dev = FakeAccelerator()
    rec = Recorder(10, DropCounter(), None, _probes(dev, None))
    assert not rec.plain and type(rec.phase("forward", "train")) is DeviceEventPhase
    cpu = resolve_device_probes(None, "cpu", 10, "auto")
    assert cpu is not None and not cpu.active and cpu.host_rss_every_steps == 10
    rec = Recorder(10, DropCounter(), None, cpu)
    assert rec.plain and type(rec.phase("forward", "train")) is Phase
    assert resolve_device_probes(None, "cpu", 10, "off") is None


def test_auto_reads_the_allocator_unless_device_sync_off_chose_the_c_phases():
    mem = FakeAllocator()
    auto = resolve_device_probes(None, "cuda", 10, "auto", memory=mem.peaks())
    assert auto is not None and auto.memory is not None
    off = resolve_device_probes(None, "cuda", 10, "auto", memory=mem.peaks(),
                                host_clock_only=True)
    assert off is not None and not off.active and off.host_rss_every_steps == 10
    forced = resolve_device_probes(None, "cuda", 10, "on", memory=mem.peaks(),
                                   host_clock_only=True)
    assert forced is not None and forced.memory is not None


def test_sync_mode_with_memory_peaks_synchronizes_and_reads_the_allocator():
    dev, mem = FakeAccelerator(), FakeAllocator()
    timing = resolve_device_timing("sync", accelerator=dev)
    probes = resolve_device_probes(timing.make_event, "cuda", 1, "on", memory=mem.peaks())
    rec = Recorder(10, DropCounter(), timing.synchronize, probes)
    step = rec.begin_step(None, 0)
    with step.phase("forward"):
        pass
    rec.finish_step(step, None)
    assert dev.synchronize_calls == 4 and mem.stats_reads == 4
    assert all(event is None for event, _ in step.dev.values())


def test_an_allocator_that_is_not_ready_gives_no_reading_and_no_error():
    calls = []
    peaks = AllocatorPeaks(lambda i: calls.append(i), lambda i: None, lambda: 3,
                           (torch.OutOfMemoryError,), ready=lambda: False)
    assert peaks.read_and_reset() is None and calls == []
    broken = AllocatorPeaks(lambda i: {}, lambda i: None, 0, (MemoryError,))
    assert broken.read_and_reset() is None


def test_the_running_torch_exposes_the_allocator_entry_points_read_without_a_sync():
    # torch.accelerator.memory_stats flattens exactly this nested dict: if torch renames the
    # entry points, peaks silently stop, so the names are checked against the installed torch.
    assert callable(torch._C._accelerator_getDeviceStats)
    assert callable(torch._C._accelerator_resetPeakStats)
    assert callable(torch._C._accelerator_isAllocatorInitialized)
    assert torch_allocator_peaks("cpu") is None
    assert torch_allocator_peaks("cuda") is not None  # built, read only once allocated


def test_options_validate_the_interval_and_the_memory_mode():
    assert RunOptions.resolve(environ={}).device_events_every_steps == 10
    with pytest.raises(ValueError, match="device_events_every_steps"):
        RunOptions.resolve(environ={}, device_events_every_steps=0)
    with pytest.raises(ValueError, match="memory_peaks"):
        RunOptions.resolve(environ={}, memory_peaks="sometimes")
    opts = RunOptions.resolve(environ={"OTEL_TRAIN_MEMORY_PEAKS": "OFF"})
    assert opts.memory_peaks == "off"
    with pytest.raises(ValueError, match="memory_peaks"):
        resolve_device_probes(None, "cuda", 1, "maybe")


def test_the_banner_says_what_the_probes_record_and_how_often():
    dev, mem = FakeAccelerator(), FakeAllocator()
    timing = resolve_device_timing("events", accelerator=dev, event_class=dev.Event)
    probes = resolve_device_probes(timing.make_event, "cuda", 10, "on", memory=mem.peaks())
    import dataclasses

    line = dataclasses.replace(timing, probes=probes).describe()
    assert line.endswith("device events + allocator peaks (1 step in 10)")
