"""``otel-train plan`` prints what a run started here would do, from its flags and the
environment, before anything runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from train_helpers import clean_env  # noqa: F401  (autouse fixture)

REPO = Path(__file__).resolve().parents[2]


def _plan(*flags: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    environ.update(env, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", "from otel_train.cli.main import main; "
                           "raise SystemExit(main())", "plan", *flags],
                          capture_output=True, text=True, timeout=60, env=environ)


def test_the_plan_command_prints_the_route_and_why_from_flags_and_environment():
    done = _plan("--exporter", "otlp", "--otlp-endpoint", "http://collector:4317",
                 "--no-export-process", OTEL_TRAIN_SAMPLE_RATIO="0.2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "route: in-process stage"
    assert "export: OTLP http/protobuf -> http://collector:4317" in lines
    assert "tail sampling: on" in lines  # from OTEL_TRAIN_SAMPLE_RATIO
    assert any("export_process=False" in line for line in lines)


def test_the_plan_command_names_a_bad_option_and_fails():
    done = _plan("--sample-ratio", "7")
    assert done.returncode == 2 and "sample_ratio" in done.stderr


def test_the_plan_command_says_which_device_timing_is_in_force_here():
    done = _plan()
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == (
        "timing: cpu: host clock (exact on CPU; no accelerator to synchronize)")


def test_the_plan_timing_line_on_an_accelerator_names_monitor_sync_and_why(monkeypatch):
    from fake_accelerator import FakeAccelerator

    from otel_train.cli.plan import device_timing_line
    from otel_train.common.options import RunOptions
    from otel_train.recording import device

    acc = FakeAccelerator()
    real = device.resolve_device_timing
    monkeypatch.setattr(device, "resolve_device_timing",
                        lambda mode, *a, **k: real(mode, accelerator=acc))
    line = device_timing_line(RunOptions.resolve(device_events_every_steps=10))
    assert line.startswith("cuda: monitor_sync (device_sync=auto): training phases "
                           "unsynchronized, device time from events 1 step in 10")
    assert line.endswith("; monitoring synchronized at its start and end")
    line = device_timing_line(RunOptions.resolve(device_sync="sync"))
    assert line.startswith("cuda: sync (device_sync=sync): synchronized at every phase boundary")
def test_the_plan_speaks_in_words_a_user_reads_and_names_no_run_dir_that_will_not_exist():
    done = _plan()
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for internal in ("provider: ours", "made rows", "rows as they end"):
        assert internal not in out, internal
    assert "tracer provider: otel-train's, installed as the global tracer provider" in out
    assert ("user spans: nested under the phase they are opened in, exported with the steps "
            "(exporter process)") in out
    # The run draws its id as it starts: the plan shows where its files go, not a made-up id.
    assert "export: span file otel-train-runs/<run id>/spans.jsonl.gz" in out
    assert out.splitlines()[-2].endswith("--run-id or OTEL_TRAIN_RUN_ID sets it")  # timing last
    named = _plan("--run-id", "nightly-7")
    assert "export: span file otel-train-runs/nightly-7/spans.jsonl.gz" in named.stdout
    assert "<run id>" not in named.stdout


def test_the_plan_command_says_what_the_default_step_ring_chose_and_why():
    endpoint = ("--exporter", "otlp", "--otlp-endpoint", "http://collector:4317")
    there = _plan(*endpoint)
    here = _plan(*endpoint, "--no-export-process")
    forced = _plan(*endpoint, "--no-export-process", OTEL_TRAIN_STEP_RING="on")
    assert there.returncode == here.returncode == forced.returncode == 0
    ring = {name: [ln for ln in done.stdout.splitlines() if "step ring:" in ln]
            for name, done in (("there", there), ("here", here), ("forced", forced))}
    assert len(ring["there"]) == len(ring["here"]) == len(ring["forced"]) == 1
    assert "read by the exporter process (step_ring=auto" in ring["there"][0]
    assert "nothing per flat step after the hot path" in ring["there"][0]
    assert "off, steps are queued (step_ring=auto" in ring["here"][0]
    assert "costs no less than the queue" in ring["here"][0]
    assert "read by the span worker in the training process (step_ring=on" in ring["forced"][0]
