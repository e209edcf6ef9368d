"""The C accelerator of the hot path (``_recorder_c``) and its pure-Python twin (recorder.py).

The hot-path tests run here against whichever twin this process loaded (the C one wherever it
was built); these tests also run them against the pure-Python twin in a subprocess, check that
both twins leave the same records for the same script, and pin what only C can get wrong:
reference counts, the clock, re-entry and leaving the loop.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from time import perf_counter_ns

import pytest

from otel_train.recording import recorder
from otel_train.common.drop_counter import DropCounter
from otel_train.recording.recorder import Recorder, decode_events

pytestmark = pytest.mark.timeout(120)

TESTS = Path(__file__).resolve().parents[1]
needs_c = pytest.mark.skipif(not recorder.ACCELERATED,
                             reason="the C accelerator was not built here (CI requires it)")


def _env(pure: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OTEL_TRAIN_PURE_PYTHON"}
    if pure:
        env["OTEL_TRAIN_PURE_PYTHON"] = "1"
    return env


def test_ci_builds_and_uses_the_c_accelerator():
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        pytest.skip("only CI must have built it; elsewhere the pure-Python twin is allowed")
    assert recorder.ACCELERATED, "pip install -e . did not build otel_train/recording/_recorder_c.c"
    assert type(recorder.Phase.__enter__).__name__ == "method_descriptor"
    assert type(recorder.Step.phase).__name__ == "method_descriptor"


def test_otel_train_pure_python_selects_the_pure_twin():
    code = ("import otel_train.recording.recorder as r; "
            "print(r.ACCELERATED, type(r.Phase.__enter__).__name__, "
            "type(r.Recorder(1, None, None).steps([], None)).__name__)")
    out = subprocess.run([sys.executable, "-c", code], env=_env(True), capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["False", "function", "generator"]


def test_otel_train_version_says_which_hot_path_runs():
    from otel_train import __version__

    for pure, expected in ((True, "hot path: pure Python (OTEL_TRAIN_PURE_PYTHON is set)"),
                           (False, f"hot path: {recorder.HOT_PATH}")):
        out = subprocess.run([sys.executable, "-m", "otel_train.cli.main", "version"],
                             env=_env(pure), capture_output=True, text=True, check=True)
        assert out.stdout.splitlines() == [__version__, expected]


def test_the_pure_python_twin_passes_the_hot_path_tests():
    files = ["recording/test_recorder.py", "recording/test_step_events.py",
             "recording/test_step_phase_events.py", "recording/test_monitor_record.py",
             "recording/test_device.py", "recording/test_device_events.py",
             "recording/test_context.py", "recording/test_step_loop.py",
             "recording/test_step_ring.py"]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
        cwd=TESTS, env=_env(True), capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


# One script through every path of the loop; each twin prints what it recorded.
_SCRIPT = textwrap.dedent("""
    import json, sys
    from otel_train.common.drop_counter import DropCounter
    from otel_train.recording.recorder import Recorder, decode_events, ACCELERATED

    drops = DropCounter()
    rec = Recorder(10, drops, None)
    out = {"accelerated": ACCELERATED, "events": []}

    def note(what):
        out["events"].append(what)

    def loader(n, fail_at=None):
        for i in range(n):
            if i == fail_at:
                raise KeyError("bad batch")
            yield i

    # 1: an ordinary loop, one step ended in its body, one failed phase (caught)
    for step in rec.steps(loader(4), "train"):
        with step.phase("forward"):
            with step.phase("inner"):
                pass
        if step.index == 1:
            step.end()
            note(("ended in body", step.index))
        elif step.index == 2:
            try:
                with step.monitor("val_loss"):
                    raise ValueError("nan")
            except ValueError:
                pass
    # 2: break, then release the held step
    for step in rec.steps(loader(3), "val"):
        with step.phase("forward"):
            pass
        break
    note(("held", rec.held.index if rec.held else None))
    rec.release_held(RuntimeError("after the loop"))
    # 3: the loader raises on its second batch
    try:
        for step in rec.steps(loader(3, fail_at=1), "train"):
            pass
    except KeyError as exc:
        note(("loader raised", str(exc)))
    # 4: an exception in the loop body (the loop is left holding the step)
    try:
        for step in rec.steps(loader(3), "train"):
            raise OSError("body")
    except OSError:
        note(("held after body error", rec.held.index if rec.held else None))
    rec.release_held(OSError("body"))
    # 5: the queue fills (max_queued=10): the rest are counted as dropped
    for step in rec.steps(loader(4), "train"):
        with step.phase("optimizer"):
            pass
    # 6: nesting is refused; 7: a phase outside a step; 8: a closed recorder yields nothing
    outer = rec.begin_step(None)
    try:
        next(iter(rec.steps(loader(1), "train")))
    except RuntimeError as exc:
        note(("nested", str(exc)))
    rec.finish_step(outer, None)
    try:
        with rec.phase("forward", "train"):
            pass
    except RuntimeError as exc:
        note(("outside", str(exc)))
    rec.closed = True
    note(("closed yields", [s.index for s in rec.steps(loader(2), "train")]))

    for s in rec.queue:
        phases = [(p.phase.name, p.phase.kind, p.phase.loader, p.parent,
                   type(p.error).__name__ if p.error else None, bool(p.end_ns))
                  for p in decode_events(s.ev)]
        out.setdefault("queue", []).append(
            (s.index, s.loader, bool(s.end_ns), type(s.error).__name__ if s.error else None,
             phases, s.batch, "phase" in vars(s)))
    out["drops"] = drops.counts()
    out["next_index"] = rec.next_index
    # 9: epochs with max_steps: one index across the loops, no fetch past the limit
    fetched = []
    def counting(n):
        for i in range(n):
            fetched.append(i)
            yield i
    rec = Recorder(20, DropCounter(), None)
    out["epochs"] = [[s.index for s in rec.steps(counting(5), "train", max_steps=3)]
                     for _ in range(2)]
    out["fetched"] = fetched
    print(json.dumps(out, default=repr))
""")


@needs_c
def test_both_twins_record_the_same_steps_phases_errors_and_drops():
    runs = {}
    for pure in (False, True):
        proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=_env(pure),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        runs[pure] = json.loads(proc.stdout)
    c, py = runs[False], runs[True]
    assert (c.pop("accelerated"), py.pop("accelerated")) == (True, False)
    assert c == py
    # The script reached every path it meant to.
    assert c["epochs"] == [[0, 1, 2], [3, 4, 5]] and c["fetched"] == [0, 1, 2] * 2
    kinds = [e[0] for e in c["events"]]
    assert kinds == ["ended in body", "held", "loader raised", "held after body error",
                     "nested", "outside", "closed yields"]
    # 13 steps: 10 queued, the last 3 (two of loop 5's 3-span steps, the bare outer step's 1)
    assert len(c["queue"]) == 10 and c["drops"] == {"record_queue_full": 3 + 3 + 1}


def test_phase_timestamps_are_perf_counter_ns():
    rec = Recorder(10, DropCounter(), None)
    before = perf_counter_ns()
    for step in rec.steps([0], None):
        with step.phase("forward"):
            pass
    after = perf_counter_ns()
    stamps = [p for ph in decode_events(rec.queue[0].ev) for p in (ph.start_ns, ph.end_ns)]
    stamps += [rec.queue[0].start_ns, rec.queue[0].end_ns]
    assert all(before <= t <= after for t in stamps), (before, stamps, after)
    assert stamps == sorted(stamps[:4]) + stamps[4:]


def test_ten_thousand_steps_leave_no_reference_behind():
    rec = Recorder(10**6, DropCounter(), None)
    loader_name = "a-loader-name-of-this-test"
    batch = object()
    forward = rec.phase("forward", "train")
    data = rec.phase("data", "train")
    counts = [sys.getrefcount(o) for o in (rec, batch, forward, data, loader_name)]

    def batches(n: int):
        for _ in range(n):
            yield batch

    for _ in range(2):
        for step in rec.steps(batches(5000), loader_name):
            with step.phase("forward"):
                pass
            try:
                with step.phase("forward"):
                    raise ValueError
            except ValueError:
                pass
        rec.queue.clear()
    del step
    assert [sys.getrefcount(o) for o in (rec, batch, forward, data, loader_name)] == counts


@needs_c
def test_the_c_step_loop_refuses_reentry_and_closes_like_a_generator():
    rec = Recorder(10, DropCounter(), None)
    loop = None

    def reentrant():
        yield 0
        next(loop)  # the loader asks for the next step while it is being made

    loop = rec.steps(reentrant(), "train")
    assert next(loop).index == 0
    with pytest.raises(ValueError, match="already executing"):
        next(loop)
    rec.current = rec.ev = None

    loop = rec.steps(range(5), "train")
    step = next(loop)
    loop.close()  # as break does: the step ends and is held
    assert step.end_ns and rec.held is step and list(loop) == []
    loop.close()
    rec.release_held()
    assert rec.queue[-1] is step


@needs_c
def test_a_c_step_loop_in_a_reference_cycle_is_collected_and_holds_its_step():
    import gc

    rec = Recorder(10, DropCounter(), None)

    class Loader:
        def __iter__(self):
            return iter(range(3))

    ld = Loader()
    loop = rec.steps(ld, "train")
    ld.loop = loop  # a cycle through the loader
    step = next(loop)
    del loop, ld
    gc.collect()
    assert step.end_ns and rec.held is step


@needs_c
def test_a_c_phase_or_step_without_init_raises_instead_of_crashing():
    bare = recorder.Phase.__new__(recorder.Phase)
    with pytest.raises(RuntimeError, match="before Phase.__init__"):
        bare.__enter__()
    with pytest.raises(TypeError, match="must be a recorder.Recorder"):
        recorder.Phase(object(), "forward", "train")
    step = recorder.Step.__new__(recorder.Step)
    assert (step.end_ns, step.batch, step.error) == (0, None, None)  # the twin's defaults
    with pytest.raises(RuntimeError, match="before Step.__init__"):
        step.phase("forward")
    with pytest.raises(AttributeError):
        step.index  # noqa: B018  (unset, as a pure-Python attribute would be)
