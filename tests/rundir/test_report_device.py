"""The report's device-time section, from a run on the fake accelerator (monitor_sync)."""

from __future__ import annotations

import pytest
from train_helpers import (  # noqa: F401  (clean_env: autouse fixture)
    FakeAccelerator,
    clean_env,
    start_in_process_run,
    use_fake_accelerator,
)

from otel_train.rundir.report import write_report
from otel_train.rundir.report_data import load_run
from otel_train.rundir.report_device import device_section

pytestmark = pytest.mark.timeout(120)

KERNEL_SECONDS = 0.02  # simulated device work launched in forward


@pytest.fixture
def accelerator(monkeypatch: pytest.MonkeyPatch) -> FakeAccelerator:
    return use_fake_accelerator(monkeypatch)


def _run(tmp_path, acc: FakeAccelerator | None, steps: int = 20) -> None:
    with start_in_process_run(tmp_path, spans_path=None, device_events_every_steps=10,
                              run_id="device-report") as run:
        for step in run.steps(range(steps), loader="train"):
            with step.phase("forward"):
                if acc is not None:
                    acc.launch(KERNEL_SECONDS)  # queued: the host moves on at once
            with step.phase("optimizer"):
                pass
            if step.index % 10 == 5:
                with step.monitor("val_loss"):
                    if acc is not None:
                        acc.launch(KERNEL_SECONDS / 2)


def test_the_report_puts_each_phases_device_time_beside_its_host_time_on_sampled_steps(
        tmp_path, accelerator):
    _run(tmp_path, accelerator)
    data = load_run(tmp_path)
    n, host, device = data.device_phases[("forward", "train")]
    assert n == 2  # steps 0 and 10: one step in 10 carries device time
    # The host only launched the kernel; the device ran it for KERNEL_SECONDS.
    assert device / n >= KERNEL_SECONDS * 0.9 > host / n
    assert data.device_timing["sync"] >= 2  # the two val_loss spans, synchronized
    assert data.device_timing["events"] >= 2 and data.device_timing["host"] > 0
    section = device_section(data)
    assert "device time per span" in section and "<td>forward</td>" in section
    assert "synchronized at start and end" in section
    page = write_report(tmp_path).read_text()
    assert "Device time per phase" in page


def test_a_cpu_run_has_no_device_section(tmp_path):
    _run(tmp_path, None, steps=5)
    data = load_run(tmp_path)
    assert data.device_phases == {} and device_section(data) == ""
    assert "Device time per phase" not in write_report(tmp_path).read_text()
