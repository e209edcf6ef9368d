"""Device busy/idle per phase, the step's bound and peak memory per phase, from boundary
readings planted on a faithful fake accelerator (tests/fake_accelerator.py), resolved off the
training thread by the record builder; and what CPU alone can tell."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import torch
from fake_accelerator import FakeAccelerator, FakeAllocator
from train_helpers import clean_env  # noqa: F401  (autouse)

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_train.common import attributes as A
from otel_train.common.identity import RunIdentity
from otel_train.common.drop_counter import DropCounter
from otel_train.recording.device import resolve_device_timing
from otel_train.recording.device_probes import resolve_device_probes
from otel_train.recording.device_values import record_ready
from otel_train.recording.recorder import Recorder
from otel_train.records.device_readings import HOST_RSS_REUSE_NS, HostRss, step_bound
from otel_train.records.step_records import StepRecordBuilder, epoch_offset_ns

pytestmark = pytest.mark.timeout(60)

MIB = 1024 ** 2
IDENT = RunIdentity("run-d", rank=0, world_size=1, local_rank=0, run_id_source="option")
RESOURCE = Resource.create({"service.name": "device-test"})
SCOPE = InstrumentationScope("otel_train", "0.1.0")


def _recorder(dev: FakeAccelerator | None, every: int = 1, memory: FakeAllocator | None = None,
              mode: str = "events") -> Recorder:
    timing = (resolve_device_timing(mode, accelerator=dev, event_class=dev.Event)
              if dev is not None else resolve_device_timing("off"))
    probes = resolve_device_probes(timing.make_event, timing.device_type, every,
                                   "on" if memory is not None else "off",
                                   memory=memory.peaks() if memory is not None else None)
    return Recorder(100, DropCounter(), timing.synchronize, probes)


def _records(rec: Recorder, device_type: str = "cuda") -> list[tuple[Any, ...]]:
    """The records, built as the span worker builds them: once their events completed."""
    builder = StepRecordBuilder(IDENT, RESOURCE, SCOPE, False, device_type, lambda t: True,
                                epoch_offset_ns())
    deadline = time.monotonic() + 5.0
    while not all(record_ready(s) for s in rec.queue) and time.monotonic() < deadline:
        time.sleep(0.001)
    return [builder.record(s) for s in rec.queue]


def test_a_step_whose_events_have_not_completed_is_built_without_device_time_never_waiting():
    dev = FakeAccelerator()
    rec = _recorder(dev)
    for step in rec.steps(range(1), None):
        with step.phase("forward"):
            dev.launch(0.5)
    step = rec.queue[0]
    assert not record_ready(step)
    builder = StepRecordBuilder(IDENT, RESOURCE, SCOPE, False, "cuda", lambda t: True,
                                epoch_offset_ns())
    t0 = time.monotonic()
    record = builder.record(step)
    assert time.monotonic() - t0 < 0.25  # no wait for the 0.5 s of device work
    assert A.DEVICE_BUSY not in record[6]


def _phase(record: tuple[Any, ...], name: str) -> dict[str, Any]:
    """A record phase's extra attributes (device readings), by name."""
    for ph in record[9]:
        if ph[0] == name:
            return ph[10] or {}
    raise KeyError(name)


def _sleepy(n: int, seconds: float):
    for i in range(n):
        time.sleep(seconds)
        yield i


def test_busy_per_phase_is_the_device_time_between_its_events_and_data_idle_is_the_wait():
    dev = FakeAccelerator()
    rec = _recorder(dev)
    for step in rec.steps(_sleepy(3, 0.08), None):
        with step.phase("forward"):
            dev.launch(0.05)  # returns at once: 50 ms on the device timeline
        with step.phase("backward"):
            dev.launch(0.03)
        with step.phase("optimizer"):
            dev.item()  # the host waits for the device here
    assert dev.synchronize_calls == 0  # events are never a sync
    for record in _records(rec):
        assert _phase(record, "forward")[A.DEVICE_BUSY] == pytest.approx(0.05, abs=0.015)
        assert _phase(record, "backward")[A.DEVICE_BUSY] == pytest.approx(0.03, abs=0.015)
        data = _phase(record, "data")
        assert A.DEVICE_BUSY not in data
        # The previous step's 80 ms of work drained at once: the device idled for the batch.
        assert data[A.DEVICE_IDLE] == pytest.approx(0.08, abs=0.03)
        root = record[6]
        assert root[A.DEVICE_BUSY] == pytest.approx(0.08, abs=0.03)
        wall = (record[5] - record[4]) / 1e9
        assert root[A.DEVICE_IDLE] == pytest.approx(wall - root[A.DEVICE_BUSY], abs=1e-6)
        assert root[A.STEP_BOUND] == A.BOUND_INPUT


def test_a_step_whose_device_runs_behind_the_host_is_compute_bound():
    dev = FakeAccelerator()
    rec = _recorder(dev)
    for step in rec.steps(range(3), None):
        with step.phase("forward"):
            dev.launch(0.06)
        with step.phase("backward"):
            dev.launch(0.06)
        with step.phase("optimizer"):
            dev.item()
    for record in _records(rec):
        assert record[6][A.STEP_BOUND] == A.BOUND_COMPUTE
        assert record[6][A.DEVICE_BUSY] >= 0.1
        assert _phase(record, "data")[A.DEVICE_IDLE] < 0.02  # no wait for input


def test_a_step_whose_device_keeps_pace_with_slow_python_is_host_bound():
    dev = FakeAccelerator()
    rec = _recorder(dev)
    for step in rec.steps(range(3), None):
        for name in ("forward", "backward"):
            with step.phase(name):
                time.sleep(0.04)  # Python between tiny kernels: the stream waits for it
                dev.launch(0.001)
        with step.phase("optimizer"):
            dev.launch(0.001)
    assert [r[6][A.STEP_BOUND] for r in _records(rec)] == [A.BOUND_HOST] * 3


def test_exposed_communication_above_its_share_labels_the_step_communication_bound():
    rec = _recorder(None)  # CPU: the label reads the planted attribute and host times
    for step in rec.steps(range(2), None):
        with step.phase("backward"):
            time.sleep(0.03)
        step.set_attribute(A.COMM_EXPOSED, 0.025 if step.index == 0 else 0.001)
    labels = [r[6][A.STEP_BOUND] for r in _records(rec, "cpu")]
    assert labels == [A.BOUND_COMM, A.BOUND_COMPUTE]


def test_on_cpu_the_label_tells_input_from_compute_by_the_data_phase_share():
    rec = _recorder(None)
    for step in rec.steps(_sleepy(2, 0.05), None):
        with step.phase("forward"):
            time.sleep(0.01)
    for step in rec.steps(range(2), None):
        with step.phase("forward"):
            time.sleep(0.02)
    records = _records(rec, "cpu")
    assert [r[6][A.STEP_BOUND] for r in records] == [A.BOUND_INPUT] * 2 + [A.BOUND_COMPUTE] * 2
    assert all(A.DEVICE_BUSY not in r[6] for r in records)  # no device clock on CPU


def test_one_step_in_n_records_events_and_only_those_steps_carry_device_time():
    dev = FakeAccelerator()
    rec = _recorder(dev, every=3)
    for step in rec.steps(range(7), None):
        with step.phase("forward"):
            dev.launch(0.001)
    # Sampled steps 0, 3, 6: a start, an end and two per phase boundary (data's end is the
    # next phase's start): 1 + 2 + 1 = 4 events each; the others record none.
    assert dev.events_recorded == 3 * 4
    records = _records(rec)
    assert [A.DEVICE_BUSY in r[6] for r in records] == [i % 3 == 0 for i in range(7)]
    assert all(A.STEP_BOUND in r[6] for r in records)  # every step is labelled
    assert dev.synchronize_calls == 0


def test_each_phase_records_its_own_peak_nested_phases_included():
    dev, mem = FakeAccelerator(), FakeAllocator(block_bytes=MIB)
    rec = _recorder(dev, memory=mem)
    for step in rec.steps(range(1), None):
        with step.phase("forward"):
            mem.allocate(100 * MIB)
            with step.phase("attention"):
                mem.allocate(300 * MIB)
                mem.free(300 * MIB)
            mem.allocate(50 * MIB)
        with step.phase("backward"):
            mem.allocate(200 * MIB)
            mem.free(350 * MIB)
    record = _records(rec)[0]
    assert _phase(record, "attention")[A.MEMORY_PEAK_ALLOCATED] == 400 * MIB
    # forward's peak is attention's, read before attention reset the allocator's peak
    assert _phase(record, "forward")[A.MEMORY_PEAK_ALLOCATED] == 400 * MIB
    assert _phase(record, "backward")[A.MEMORY_PEAK_ALLOCATED] == 350 * MIB
    assert _phase(record, "backward")[A.MEMORY_PEAK_RESERVED] == 400 * MIB  # cached blocks
    assert dev.synchronize_calls == 0


def test_a_phase_that_runs_out_of_memory_keeps_its_peak_and_its_error_even_unsampled():
    dev, mem = FakeAccelerator(), FakeAllocator(capacity_bytes=1024 * MIB, block_bytes=MIB)
    rec = _recorder(dev, every=10, memory=mem)
    with pytest.raises(torch.OutOfMemoryError):
        for step in rec.steps(range(3), None):
            with step.phase("forward"):
                mem.allocate(100 * MIB)
            with step.phase("backward"):
                if step.index == 1:  # not a sampled step
                    mem.allocate(800 * MIB)
                    mem.allocate(500 * MIB)  # past the capacity
            mem.free(mem.allocated)
    rec.release_held()
    record = _records(rec)[1]
    backward = next(ph for ph in record[9] if ph[0] == "backward")
    assert backward[8][1].startswith("OutOfMemoryError: CUDA out of memory")
    assert backward[10][A.MEMORY_PEAK_ALLOCATED] == 900 * MIB


def test_the_bound_rule_orders_communication_input_compute_host():
    assert step_bound(1.0, 0.1, None, None, 0.4) == A.BOUND_COMM
    assert step_bound(1.0, 0.5, 0.4, 0.5, None, 0.5) == A.BOUND_INPUT
    assert step_bound(1.0, 0.5, 0.1, 0.5, None, 0.5) == A.BOUND_COMPUTE  # prefetch overlapped
    assert step_bound(1.0, 0.1, None, 0.9, None, 0.05) == A.BOUND_HOST  # device kept pace
    assert step_bound(1.0, 0.1, None, 0.3, None, 0.5) == A.BOUND_HOST  # device mostly idle
    assert step_bound(1.0, 0.1, None, None, None) == A.BOUND_COMPUTE  # no device clock


def test_host_rss_reads_this_process_resident_bytes_on_every_nth_step_once_per_quarter_second():
    rss = HostRss()
    first = rss.read_bytes()
    assert first is not None and 10 * MIB < first < 64 * 1024 * MIB
    block = bytearray(64 * MIB)  # touched pages become resident
    for i in range(0, len(block), 4096):
        block[i] = 1
    assert rss.read_bytes() == first  # within 0.25 s: the same reading, no syscall
    time.sleep(HOST_RSS_REUSE_NS / 1e9)
    assert rss.read_bytes() >= first + 48 * MIB
    rec = _recorder(None)
    builder = StepRecordBuilder(IDENT, RESOURCE, SCOPE, False, "cpu", lambda t: True,
                                epoch_offset_ns(), host_rss_every_steps=2)
    for step in rec.steps(range(4), None):
        pass
    roots = [builder.record(s)[6] for s in rec.queue]
    assert [A.HOST_RSS in r for r in roots] == [True, False, True, False]


def test_a_validation_fetch_without_boundaries_of_its_own_gets_no_peak_of_its_parents():
    dev, mem = FakeAccelerator(), FakeAllocator(block_bytes=MIB)
    rec = _recorder(dev, memory=mem)
    for step in rec.steps(range(1), None):
        with step.monitor("val_loss"):
            for _ in step.iter_data([0], loader="val"):
                pass
            mem.allocate(64 * MIB)
    record = _records(rec)[0]
    fetch = next(ph for ph in record[9] if ph[0] == "data" and ph[2] == "val")
    assert A.MEMORY_PEAK_ALLOCATED not in (fetch[10] or {})
    assert _phase(record, "val_loss")[A.MEMORY_PEAK_ALLOCATED] == 64 * MIB


def test_steps_between_sampled_ones_take_the_last_sampled_verdict_unless_input_bound():
    dev = FakeAccelerator()
    rec = _recorder(dev, every=3)
    for step in rec.steps(_sleepy(6, 0.0), None):
        for name in ("forward", "backward"):
            with step.phase(name):
                time.sleep(0.02)  # the device keeps pace with slow Python: host-bound
                dev.launch(0.001)
    labels = [r[6][A.STEP_BOUND] for r in _records(rec)]
    assert labels == [A.BOUND_HOST] * 6  # not "compute", as the host clock alone would say


def test_a_builder_that_takes_the_sampled_records_over_labels_the_steps_between_alike():
    """The exporter process builds the ring's steps, the training process the sampled ones
    (device readings): taking each sampled record over, its builder carries the verdict."""
    from otel_train.records.device_readings import device_verdict

    dev = FakeAccelerator()
    rec = _recorder(dev, every=3)
    for step in rec.steps(_sleepy(7, 0.0), None):
        for name in ("forward", "backward"):
            with step.phase(name):
                time.sleep(0.02)  # the device keeps pace with slow Python: host-bound
                dev.launch(0.001)
    records = _records(rec)
    here = StepRecordBuilder(IDENT, RESOURCE, SCOPE, False, "cuda", lambda t: True,
                             epoch_offset_ns())
    there = StepRecordBuilder(IDENT, RESOURCE, SCOPE, False, "cuda", lambda t: True,
                              epoch_offset_ns())
    labels, alone = [], []
    for step, built in zip(rec.queue, records):
        if step.dev:  # sampled: built in the training process, taken over there
            assert device_verdict(built[6], built[9], built[5] - built[4],
                                  built[2]) == A.BOUND_HOST
            there.take_device_verdict(built)
            labels.append(built[6][A.STEP_BOUND])
            alone.append(built[6][A.STEP_BOUND])
        else:
            labels.append(there.record(step)[6][A.STEP_BOUND])
            alone.append(here.record(step)[6][A.STEP_BOUND])  # never took a verdict over
    assert labels == [r[6][A.STEP_BOUND] for r in records] == [A.BOUND_HOST] * 7
    assert alone.count(A.BOUND_COMPUTE) == 4  # what the host clock alone says


def test_phases_opened_and_closed_by_timestamps_get_device_time_and_peaks_too():
    dev, mem = FakeAccelerator(), FakeAllocator(block_bytes=MIB)
    rec = _recorder(dev, memory=mem)
    step = rec.begin_step(None, 0)  # as the integrations' hooks and callbacks do
    step.open_phase("forward")
    dev.launch(0.03)
    mem.allocate(32 * MIB)
    step.close_phase()
    rec.finish_step(step, None)
    forward = _phase(_records(rec)[0], "forward")
    assert forward[A.DEVICE_BUSY] == pytest.approx(0.03, abs=0.015)
    assert forward[A.MEMORY_PEAK_ALLOCATED] == 32 * MIB


def test_host_rss_of_another_process_reads_that_process_resident_bytes():
    import subprocess
    import sys

    big = subprocess.Popen([sys.executable, "-c", "import sys, time; b = bytearray(300 << 20); "
                            "b[::4096] = b'x' * len(b[::4096]); print('up', flush=True); "
                            "time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert big.stdout.readline().strip() == "up"
        other = HostRss(pid=big.pid).read_bytes()
        mine = HostRss().read_bytes()
        assert other is not None and other > 300 * 2**20
        assert mine is not None and mine != other
        assert HostRss(pid=os.getpid()).read_bytes() == pytest.approx(mine, rel=0.2)
    finally:
        big.kill()
        big.wait()
