"""A profile of the slow step: after a planted slow step the next K steps run under
``torch.profiler``; the trace lands in ``profiles/`` with each step's trace id, and each
profiled step gets a ``train.profile`` child span with its top operators as events. By hand
with ``run.profile_next``; at most one slow-step capture per interval; off, nothing is
wrapped and ``torch.profiler`` is never imported. Real runs, real torch ops, real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from train_helpers import run_spans, start_test_run

from otel_train.common.drop_counter import DropCounter
from otel_train.pipeline.profile_capture import ProfileCapture
from otel_train.recording.recorder import Recorder

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(120)


def _train(run: Any, steps: int, slow: set[int], until: Any = None) -> None:
    """Small matmuls; a step in ``slow`` sleeps 0.15 s; ``until()`` true ends the loop early."""
    a = torch.randn(64, 64)
    for step in run.steps(range(steps)):
        with step.phase("forward"):
            b = a @ a
            time.sleep(0.003 if step.index not in slow else 0.15)
        with step.phase("backward"):
            torch.relu(b).sum()
        if until is not None and until():
            break


# Only the planted steps are slow (a loaded machine's jitter is not), judged in this process.
_ONLY_PLANTED_SLOW: dict[str, Any] = {"slow_step_factor": 1000.0, "slow_step_seconds": 0.1,
                                      "export_process": False, "export_interval_seconds": 0.05}


def _profiles(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "profiles").glob("step-*-*[0-9].json"))


@pytest.mark.parametrize("export_process", [False, True], ids=["here", "exporter-process"])
def test_a_slow_step_is_followed_by_a_profile_of_the_next_steps_with_their_operators(
        tmp_path: Path, export_process: bool) -> None:
    # In the exporter process the verdict comes back with the chain's state (once a second).
    run = start_test_run(tmp_path, profile_on_slow_steps=2,
                         **{**_ONLY_PLANTED_SLOW, "export_process": export_process})
    _train(run, 2000, slow={30}, until=lambda: bool(run._profiling.files))
    run.shutdown(timeout=10)
    files = _profiles(tmp_path)
    assert len(files) == 1, files
    first, last = (int(x) for x in files[0].stem.split("-")[1:])
    assert last == first + 1 and first > 30  # the two steps after the verdict came back
    spans = run_spans(run)
    roots = {s.attributes["train.step"]: s for s in spans if s.name == "train.step"}
    assert roots[30].attributes["train.slow"] is True
    profiles = sorted((s for s in spans if s.name == "train.profile"),
                      key=lambda s: s.attributes["train.step"])
    assert [p.attributes["train.step"] for p in profiles] == [first, last]
    for p in profiles:
        root = roots[p.attributes["train.step"]]
        assert (p.trace_id, p.parent_id) == (root.trace_id, root.span_id)
        assert p.attributes["train.profile.file"] == f"profiles/{files[0].name}"
        assert p.attributes["train.profile.trigger"] == "slow_step"
        ops = {e[1]["train.profile.op.name"]: e[1] for e in p.events
               if e[0] == "train.profile.op"}
        assert "aten::mm" in ops and ops["aten::mm"]["train.profile.op.calls"] >= 1
        assert ops["aten::mm"]["train.profile.op.self_seconds"] > 0
    trace = json.loads(files[0].read_text())
    meta = trace["otel_train"]
    meta = json.loads(meta) if isinstance(meta, str) else meta
    assert [(m["step"], int(m["trace_id"], 16)) for m in meta["steps"]] == [
        (first, roots[first].trace_id), (last, roots[last].trace_id)]
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {f"otel_train.step#{first}", f"otel_train.step#{last}", "aten::mm"} <= names
    sidecar = json.loads(files[0].with_name(files[0].stem + ".steps.json").read_text())
    assert [s["step"] for s in sidecar["steps"]] == [first, last]


def test_at_most_one_slow_step_capture_per_interval(tmp_path: Path) -> None:
    # A real recorder and capture; the slow-step count and the clock are set by the test,
    # so the interval is tested, not a loaded machine's jitter.
    rec = Recorder(1000, DropCounter(), None)
    slow = SimpleNamespace(slow_steps=0)
    now = [0.0]
    capture = ProfileCapture(rec, tmp_path, "run", on_slow_steps=1, min_interval_seconds=600,
                             slow=slow, emit=None, clock=lambda: now[0])

    def verdict_then_steps(at_seconds: float) -> None:
        now[0] = at_seconds
        slow.slow_steps += 1
        for _ in rec.steps(capture.hooked(range(3)), "train"):
            torch.ones(4).sum()

    verdict_then_steps(0.0)  # the first slow step: a capture
    verdict_then_steps(1.0)  # a verdict on the profiled steps themselves: none, not counted
    verdict_then_steps(100.0)  # within the interval: refused
    verdict_then_steps(700.0)  # past it: a capture
    capture.close()
    assert (capture.captures, capture.skipped) == (2, 1)
    assert [p.name for p in _profiles(tmp_path)] == ["step-0-0.json", "step-9-9.json"]


def test_profile_next_by_hand_profiles_the_next_steps_of_either_loop(tmp_path: Path) -> None:
    run = start_test_run(tmp_path, export_process=False)
    run.profile_next(1)  # before the loop: the loop is armed, its first step profiled
    _train(run, 5, slow=set())
    run.profile_next(2)
    for _ in range(4):
        with run.step(), run.phase("forward"):
            torch.ones(8).sum()
    run.shutdown(timeout=10)
    assert [p.name for p in _profiles(tmp_path)] == ["step-0-0.json", "step-5-6.json"]
    profiles = [s for s in run_spans(run) if s.name == "train.profile"]
    assert sorted(p.attributes["train.step"] for p in profiles) == [0, 5, 6]
    assert {p.attributes["train.profile.trigger"] for p in profiles} == {"request"}
    with pytest.raises(ValueError, match="steps must be an integer"):
        run.profile_next(0)


_OFF_SCRIPT = textwrap.dedent("""
    import sys
    import otel_train
    with otel_train.start_run(exporter="jsonl", status_dir=sys.argv[1], console=False,
                              prometheus_port=None, device_sync="off") as run:
        it = iter(range(50))
        for step in run.steps(it):
            with step.phase("forward"):
                pass
        assert not run._profiling.armed
    assert "torch.profiler" not in sys.modules and "torch" not in sys.modules
    print("OK")
""")


def test_with_the_option_off_nothing_is_wrapped_nor_imported(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", _OFF_SCRIPT, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "OK", done.stderr[-3000:]
    assert not (tmp_path / "profiles").exists()


def test_the_options_are_validated_at_set_up(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="profile_on_slow_steps"):
        start_test_run(tmp_path, profile_on_slow_steps=-1)
    with pytest.raises(ValueError, match="profile_min_interval_seconds"):
        start_test_run(tmp_path, profile_min_interval_seconds=float("inf"))
