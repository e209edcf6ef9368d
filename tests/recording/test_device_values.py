"""Device tensors given to set_attribute / count: copied to pinned host memory without waiting,
read in the background only once their event has completed, counted when never ready."""

from __future__ import annotations

import time

import pytest
from fake_accelerator import FakeAccelerator
from train_helpers import (  # noqa: F401  (clean_env: autouse fixture)
    clean_env,
    one,
    run_spans,
    start_in_process_run,
    use_fake_accelerator,
)

from otel_train.recording.device_values import (
    DeviceValueCopier,
    PendingDeviceValue,
    add_counts,
    record_ready,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeAccelerator:
    return use_fake_accelerator(monkeypatch)


def test_a_device_scalar_starts_a_copy_and_an_event_and_never_waits():
    dev = FakeAccelerator()
    copier = DeviceValueCopier(dev.Event, "cuda", copy_to_host=dev.copy_to_host)
    dev.launch(0.2)  # the loss is computed by this queued work
    loss = dev.tensor(2.5)
    t0 = time.monotonic()
    kept = copier(loss)
    assert time.monotonic() - t0 < 0.05  # no wait for the 0.2 s of device work
    assert isinstance(kept, PendingDeviceValue)
    assert (dev.copies, dev.events_recorded, dev.blocking_reads) == (1, 1, 0)
    assert not kept.ready()
    time.sleep(0.25)
    assert kept.ready() and kept.value() == 2.5


def test_host_values_and_larger_tensors_are_kept_as_they_are():
    import torch

    dev = FakeAccelerator()
    copier = DeviceValueCopier(dev.Event, "cuda", copy_to_host=dev.copy_to_host)
    cpu = torch.tensor(1.0)
    assert copier(cpu) is not None and not isinstance(copier(cpu), PendingDeviceValue)
    assert copier(3) == 3 and copier("x") == "x"
    assert dev.copies == 0


def test_micro_batch_counts_add_up_once_every_copy_has_landed():
    dev = FakeAccelerator()
    copier = DeviceValueCopier(dev.Event, "cuda", copy_to_host=dev.copy_to_host)
    total = add_counts(copier(dev.tensor(100.0)), 0)
    total = add_counts(copier(dev.tensor(28.0)), total)
    time.sleep(0.01)
    assert total.ready() and total.value() == 128.0


def test_set_attribute_with_a_device_loss_exports_its_value_once_ready_without_a_blocking_read(
        tmp_path, fake):
    with start_in_process_run(tmp_path) as run:
        for step in run.steps(range(3)):
            with step.phase("forward"):
                fake.launch(0.05)  # the loss is ready only when this work has run
                loss = fake.tensor(1.5 + step.index)
            step.set_attribute("train.loss", loss)
            step.count(tokens=fake.tensor(64.0))
        costs = run.costs()
    spans = [s for s in run_spans(run) if s.name == "train.step"]
    losses = sorted(s.attributes["train.loss"] for s in spans)
    assert losses == [1.5, 2.5, 3.5]  # the values, not NaN read before the copy landed
    assert {s.attributes["train.tokens"] for s in spans} == {64}
    assert fake.blocking_reads == 0  # never .item() on the device tensor, on any thread
    assert fake.copies == 6
    assert costs["dropped_attributes"] == {}


def test_a_device_value_that_never_lands_in_time_is_counted_not_waited_for(tmp_path, fake,
                                                                          monkeypatch):
    monkeypatch.setattr("otel_train.pipeline.span_worker._VALUE_WAIT_NS", int(0.3e9))
    with start_in_process_run(tmp_path) as run:
        for step in run.steps(range(1)):
            fake.launch(30.0)  # a device 30 s behind the host
            step.set_attribute("train.loss", fake.tensor(1.0))
        t0 = time.monotonic()
        costs = run.costs()  # a drain: the step is held back, not waited for
        assert time.monotonic() - t0 < 1.0
        time.sleep(0.35)  # past the wait bound: built without the value, counted
        costs = run.costs()
    assert costs["dropped_attributes"] == {"device_value_not_ready": 1}
    root = one(run_spans(run), "train.step")
    assert "train.loss" not in root.attributes
    assert fake.blocking_reads == 0


def test_a_step_is_held_back_while_its_value_is_on_its_way():
    dev = FakeAccelerator()
    copier = DeviceValueCopier(dev.Event, "cuda", copy_to_host=dev.copy_to_host)

    class Record:
        attrs = {"train.loss": None}
        phase_attrs = None
        dev = None

    record = Record()
    dev.launch(0.1)
    record.attrs = {"train.loss": copier(dev.tensor(1.0))}
    assert not record_ready(record)
    time.sleep(0.12)
    assert record_ready(record)


def test_a_value_whose_event_cannot_be_queried_is_not_held_and_is_counted_unread():
    from otel_train.common.drop_counter import DropCounter
    from otel_train.records.attribute_values import plain_attributes

    class BrokenEvent:
        def query(self) -> bool:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    class Record:
        attrs = {"train.loss": PendingDeviceValue(None, BrokenEvent())}
        phase_attrs = None
        dev = None

    record = Record()
    assert record_ready(record)  # nothing to wait for: built at once
    drops = DropCounter()
    assert plain_attributes(record.attrs, drops=drops) == {}
    assert drops.counts() == {"device_value_unread": 1}
