"""Spans cut off are marked: a step (and its open phases) ended by a shutdown, SIGTERM, an
escaping exception or an exception at interpreter exit is exported with
``train.truncated``, its real start, the end it was cut at and the reason. Real runs, real
span files; the signals and the killed exporter process are real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from train_helpers import one, read_file_spans, run_spans, start_test_run

pytestmark = pytest.mark.timeout(90)
_TWINS = pytest.mark.parametrize("pure", ["0", "1"], ids=["c", "pure"])


def _env(pure: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "OTEL_TRAIN_"))}
    env["OTEL_TRAIN_PURE_PYTHON"] = pure
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    return env


def test_a_step_open_at_shutdown_is_exported_cut_at_the_shutdown(tmp_path: Path) -> None:
    run = start_test_run(tmp_path, export_process=False)
    step = run.step()
    step.phase("forward").__enter__()  # left open, as code running when shutdown is called
    before = time.time_ns()
    run.shutdown()
    after = time.time_ns()
    spans = run_spans(run)
    root = one(spans, "train.step")
    forward = one(spans, "forward")
    for span in (root, forward):
        assert span.attributes["train.truncated"] is True
        assert span.attributes["train.truncated.reason"] == "shutdown"
        assert span.start_ns < before <= span.end_ns <= after  # real start, cut at shutdown
    assert root.status_code == "UNSET"
    data = one(spans, "data") if any(s.name == "data" for s in spans) else None
    assert data is None or "train.truncated" not in data.attributes


def test_steps_that_ended_are_not_marked(tmp_path: Path) -> None:
    with start_test_run(tmp_path, export_process=False) as run:
        for step in run.steps(range(3)):
            with step.phase("forward"):
                pass
        for step in run.steps(range(3)):
            break  # a loop left by break: its step ended, not cut off
        with run.step() as step:
            pass
    assert len([s for s in run_spans(run) if s.name == "train.step"]) == 5
    assert not [s for s in run_spans(run) if "train.truncated" in s.attributes]


def test_an_exception_escaping_the_loop_marks_its_step_cut_off(tmp_path: Path) -> None:
    with pytest.raises(ValueError), start_test_run(tmp_path, export_process=False) as run:
        for step in run.steps(range(5)):
            with step.phase("forward"):
                if step.index == 2:
                    raise ValueError("nan loss")
    spans = run_spans(run)
    cut = [s for s in spans if s.attributes.get("train.truncated")]
    assert [(s.name, s.attributes["train.step"]) for s in cut] == [("train.step", 2)]
    assert cut[0].attributes["train.truncated.reason"] == "exception"
    assert cut[0].status_code == "ERROR" and "nan loss" in (cut[0].status_message or "")


_EXIT_SCRIPT = textwrap.dedent("""
    import sys
    import otel_train
    run = otel_train.start_run(exporter="jsonl", status_dir=sys.argv[1], console=False,
                               prometheus_port=None, report=False, device_sync="off")
    for step in run.steps(range(5)):
        with step.phase("forward"):
            if step.index == 3:
                raise RuntimeError("out of memory")
""")


@_TWINS
def test_an_unhandled_exception_at_interpreter_exit_marks_the_step_it_cut(
        tmp_path: Path, pure: str) -> None:
    done = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, str(tmp_path)], env=_env(pure),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "out of memory" in done.stderr, done.stderr[-3000:]
    roots = {s.attributes["train.step"]: s for s in read_file_spans(tmp_path)
             if s.name == "train.step"}
    assert sorted(roots) == [0, 1, 2, 3]
    assert roots[3].attributes["train.truncated.reason"] == "exception"
    assert roots[3].status_code == "ERROR"
    assert not any("train.truncated" in roots[i].attributes for i in range(3))


_SIGTERM_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import otel_train
    run = otel_train.start_run(exporter="jsonl", status_dir=sys.argv[1], console=False,
                               prometheus_port=None, report=False, export_interval_seconds=0.05,
                               shutdown_timeout_seconds=5.0, device_sync="off")
    for step in run.steps(range(1000)):
        with step.phase("forward"):
            if step.index == 30:
                print("READY", run._telemetry.export.pid, flush=True)
                while True:
                    time.sleep(0.01)  # a phase that never ends: the signal cuts it
""")


@pytest.mark.parametrize("kill_exporter", [False, True], ids=["sigterm", "exporter-killed"])
def test_a_sigtermed_run_exports_its_step_cut_at_the_signal(
        tmp_path: Path, kill_exporter: bool) -> None:
    proc = subprocess.Popen([sys.executable, "-c", _SIGTERM_SCRIPT, str(tmp_path)],
                            env=_env("0"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert line and line[0] == "READY", proc.communicate(timeout=30)
    if kill_exporter:  # the training process takes the export over, then is signalled
        os.kill(int(line[1]), signal.SIGKILL)
        time.sleep(0.5)
    sent = time.time_ns()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM, err[-3000:]
    assert ("exporter process exited" in err) is kill_exporter, err[-3000:]
    spans = read_file_spans(tmp_path)
    root = one(spans, "train.step", **{"train.step": 30})
    forward = one([s for s in spans if s.parent_id == root.span_id], "forward")
    for span in (root, forward):
        assert span.attributes["train.truncated"] is True
        assert span.attributes["train.truncated.reason"] == "sigterm"
        assert span.start_ns < sent <= span.end_ns < sent + 3_000_000_000
    assert root.status_code == "ERROR" and "SIGTERM" in (root.status_message or "")
    assert sorted(s.attributes["train.step"] for s in spans
                  if s.name == "train.step") == list(range(31))


def test_the_report_lists_a_step_cut_off_and_the_export_keeps_the_mark(tmp_path: Path) -> None:
    from otel_train.cli.main import main
    from otel_train.rundir.report import write_report

    run = start_test_run(tmp_path, spans_path=None, export_process=False)
    for step in run.steps(range(3)):
        with step.phase("forward"):
            pass
    step = run.step()
    step.phase("forward").__enter__()
    run.shutdown()
    html = write_report(tmp_path).read_text()
    assert "step 3 cut off (shutdown, <code>train.truncated</code>), rank 0" in html
    assert main(["export", str(tmp_path)]) == 0
    trace = (tmp_path / "trace.json").read_text()
    events = [e for e in json.loads(trace)["traceEvents"] if e.get("ph") == "X"]
    cut = [(e["name"], e["args"].get("step")) for e in events if e["args"].get("truncated")]
    assert sorted(cut) == [("forward", 3), ("train.step", 3)]
    assert {e["args"]["truncated_reason"] for e in events if "truncated" in e["args"]} == {
        "shutdown"}
