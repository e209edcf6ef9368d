"""The device work otel-train adds on the training thread is timed and, where it is a loss of
the loop, charged to the run's own cost."""

from __future__ import annotations

import time

import pytest
from fake_accelerator import FakeAccelerator
from train_helpers import clean_env, start_in_process_run, use_fake_accelerator  # noqa: F401

from otel_train.common.device_work import DeviceWorkClock
from otel_train.derived.costs import own_cost_line

pytestmark = pytest.mark.timeout(60)
KERNEL_SECONDS = 0.02


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeAccelerator:
    return use_fake_accelerator(monkeypatch)


def test_training_syncs_are_charged_and_monitoring_syncs_reported_apart():
    dev = FakeAccelerator()
    clock = DeviceWorkClock()
    training = clock.timed_sync(dev.synchronize, monitoring=False)
    monitoring = clock.timed_sync(dev.synchronize, monitoring=True)
    dev.launch(0.03)
    training()
    dev.launch(0.02)
    monitoring()
    assert clock.sync_ns >= 0.025e9 and clock.syncs == 1
    assert clock.monitor_sync_ns >= 0.015e9 and clock.monitor_syncs == 1
    assert clock.charged_ns == clock.sync_ns  # the monitoring wait is not a loss


def _loop(run, dev: FakeAccelerator, steps: int) -> None:
    for step in run.steps(range(steps)):
        with step.phase("forward"):
            dev.launch(KERNEL_SECONDS)  # a launch returns at once
        with step.phase("optimizer"):
            time.sleep(0.002)  # host work the device could overlap without a sync


def test_with_sync_chosen_the_own_cost_includes_the_time_spent_in_synchronize(tmp_path, fake):
    steps = 10
    with start_in_process_run(tmp_path, device_sync="sync") as run:
        _loop(run, fake, steps)
        own = run.costs()["own_cost"]
    device = own["device_work"]
    # Each step waits for its kernel at forward's end: ~20 ms a step in synchronize.
    assert device["sync_wait_us_per_step"] >= 0.8 * KERNEL_SECONDS * 1e6
    assert device["syncs"] >= steps * 4
    # The loss the run reports includes that wait (an upper bound on the overlap lost).
    assert own["lost_us_per_step"] >= device["sync_wait_us_per_step"]
    assert own["share_of_step_time"] >= 0.5
    assert "upper bound" in device["charged"]


def test_by_default_the_own_cost_leaves_the_monitoring_waits_out_and_says_so(tmp_path, fake):
    with start_in_process_run(tmp_path) as run:
        for step in run.steps(range(4)):
            with step.phase("forward"):
                fake.launch(KERNEL_SECONDS)
            with step.monitor("val_loss"):
                fake.launch(0.001)
        costs = run.costs()
    own = costs["own_cost"]
    device = own["device_work"]
    assert device["syncs"] == 0 and device["monitoring_syncs"] == 8
    assert "left out: monitoring syncs" in own_cost_line(costs)  # the costs table says so
    assert device["monitoring_sync_wait_us_per_step"] >= 0.5 * KERNEL_SECONDS * 1e6
    # Training work queued before monitoring is not otel-train's loss.
    assert own["lost_us_per_step"] < 0.5 * KERNEL_SECONDS * 1e6
    assert "monitoring boundaries" in device["left_out"]
    assert device["events_and_peaks_us_per_step"] is not None  # step 0 is sampled


def test_a_cpu_run_reports_no_device_work(tmp_path):
    with start_in_process_run(tmp_path) as run:
        for _ in run.steps(range(2)):
            pass
        assert run.costs()["own_cost"]["device_work"] is None
