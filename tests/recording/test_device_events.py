"""Device timing against a faithful fake accelerator: sync attributes device work to the
phase that launched it; events measures it in the background without stalling the host."""

from __future__ import annotations

import time

import pytest
from fake_accelerator import FakeAccelerator
from train_helpers import FileSpan, read_file_spans

import otel_train
from otel_train.recording import device as device_mod


def _run_with(monkeypatch, tmp_path, dev: FakeAccelerator, mode: str, **options):
    real = device_mod.resolve_device_timing

    def fake_resolve(m: str, accelerator=None, event_class=None):
        return real(m, accelerator=dev, event_class=dev.Event)

    monkeypatch.setattr("otel_train.pipeline.assembly.resolve_device_timing", fake_resolve)
    return otel_train.start_run(device_sync=mode, prometheus_port=None, console=False,
                                status_dir=str(tmp_path), exporter="jsonl", **options)


def _spans_by_name(run):
    out: dict[str, list[FileSpan]] = {}
    for s in read_file_spans(run.spans_path):
        out.setdefault(s.name, []).append(s)
    return out


def _seconds(span: FileSpan) -> float:
    return span.duration_seconds


def test_sync_mode_charges_async_device_work_to_the_phase_that_launched_it(monkeypatch,
                                                                           tmp_path):
    dev = FakeAccelerator()
    with _run_with(monkeypatch, tmp_path, dev, "sync") as run:
        for step in run.steps(range(2)):
            with step.phase("forward"):
                dev.launch(0.15)  # returns at once, like a CUDA kernel launch
            with step.phase("optimizer"):
                pass
    spans = _spans_by_name(run)
    assert all(_seconds(s) >= 0.15 for s in spans["forward"])
    assert all(_seconds(s) < 0.1 for s in spans["optimizer"])
    assert all(s.attributes["train.device.synced"] is True for s in spans["forward"])
    assert all(s.attributes["train.device.type"] == "cuda" for s in spans["train.step"])
    assert dev.synchronize_calls >= 2 * 2 * 2  # every boundary of every phase, explicitly


def test_off_mode_lets_async_work_land_in_whichever_phase_waits_for_the_device(monkeypatch,
                                                                               tmp_path):
    dev = FakeAccelerator()
    with _run_with(monkeypatch, tmp_path, dev, "off") as run:
        for step in run.steps(range(1)):
            with step.phase("forward"):
                dev.launch(0.15)
            with step.phase("optimizer"):
                dev.synchronize()  # like loss.item(): the host waits here
    spans = _spans_by_name(run)
    assert _seconds(spans["forward"][0]) < 0.1
    assert _seconds(spans["optimizer"][0]) >= 0.13
    assert spans["forward"][0].attributes["train.device.synced"] is False
    assert dev.synchronize_calls == 1  # only the user's own


def test_events_mode_measures_device_time_per_phase_without_stalling_training(monkeypatch,
                                                                              tmp_path):
    dev = FakeAccelerator()
    with _run_with(monkeypatch, tmp_path, dev, "events", device_events_every_steps=1) as run:
        assert "device events" in run.device.describe()
        host_t0 = time.monotonic()
        for step in run.steps(range(2)):
            with step.phase("forward"):
                dev.launch(0.2)
            with step.phase("backward"):
                dev.launch(0.1)
        host_seconds = time.monotonic() - host_t0
    assert host_seconds < 0.3  # the host never waited for 0.6 s of device work
    assert dev.synchronize_calls == 0
    spans = _spans_by_name(run)
    fwd = [s.attributes["train.device.duration_seconds"] for s in spans["forward"]]
    bwd = [s.attributes["train.device.duration_seconds"] for s in spans["backward"]]
    assert fwd[0] == pytest.approx(0.2, abs=0.03)
    assert bwd[0] == pytest.approx(0.1, abs=0.03)
    roots = [s.attributes["train.device.duration_seconds"] for s in spans["train.step"]]
    assert all(r >= 0.29 for r in roots)
    assert all(_seconds(s) < 0.1 for s in spans["forward"])  # host time stays host time
    assert spans["forward"][0].attributes["train.device.synced"] is False
    # Busy/idle and the bound travel to the span file with the spans.
    assert [s.attributes["train.device.busy_seconds"] for s in spans["forward"]] == fwd
    assert all("train.device.idle_seconds" in s.attributes for s in spans["data"])
    assert {s.attributes["train.step.bound"] for s in spans["train.step"]} <= {
        "compute", "host", "input"}
    assert all(s.attributes["train.device.busy_seconds"] >= 0.29 for s in spans["train.step"])


def test_device_modes_fall_back_to_the_host_clock_on_a_cpu_only_machine():
    for mode in ("auto", "sync", "events", "off"):
        timing = device_mod.resolve_device_timing(mode)
        assert timing.device_type == "cpu"
        assert timing.synchronize is None and timing.make_event is None
        assert "cpu" in timing.describe()
