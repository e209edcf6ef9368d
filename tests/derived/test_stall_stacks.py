"""Stacks on a stall: real training processes stuck with the GIL held, with it free, on a signal.

Each child is a script written here, so its stacks must name this test's own file and line.
"""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from otel_train.common.drop_counter import DropCounter
from otel_train.derived.stall_stacks import (
    FLIGHT_RECORDER_SUFFIX,
    StallStacks,
    parse_thread_stacks,
    thread_stack,
)
from otel_train.derived.watchdog import StallWatchdog
from otel_train.recording.recorder import Recorder, Step

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[2]
STALL_SECONDS = 1.0

CHILD = '''
import ctypes, sys, time, otel_train
mode, out = sys.argv[1], sys.argv[2]
with otel_train.start_run(stall_seconds={stall}, watchdog_interval_seconds=0.2,
                          prometheus_port=None, console=False, status_dir=out, run_id="t",
                          export_process=False, exporter="jsonl", device_sync="off",
                          stall_stacks_signal="SIGUSR1") as run:
    for step in run.steps(range(3)):
        with step.phase("forward"):
            if step.index == 1:
                print("stuck", flush=True)
                if mode == "gil":
                    ctypes.PyDLL(None).sleep(4)  # STUCK HOLDING THE GIL
                else:
                    time.sleep(3)  # STUCK WITH THE GIL FREE
                time.sleep(0.5)
'''


def _child(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], Path, Path]:
    script = tmp_path / "train_child.py"
    script.write_text(textwrap.dedent(CHILD.format(stall=STALL_SECONDS)))
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, str(script), mode, str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "stuck"
    return proc, script, out


def _line_of(script: Path, marker: str) -> int:
    return next(i for i, line in enumerate(script.read_text().splitlines(), 1) if marker in line)


def _wait_for_stacks(folder: Path, needle: str, seconds: float) -> float | None:
    """Seconds until a file in ``folder`` holds ``needle`` (None: not within ``seconds``)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        for path in folder.glob("*.txt") if folder.is_dir() else ():
            if needle in path.read_text(errors="replace"):
                return time.monotonic() - t0
        time.sleep(0.05)
    return None


@pytest.mark.parametrize("mode,marker", [("gil", "HOLDING THE GIL"), ("free", "GIL FREE")])
def test_a_stuck_phase_gets_its_stacks_file_naming_the_users_line_within_the_threshold(
        tmp_path: Path, mode: str, marker: str) -> None:
    proc, script, out = _child(tmp_path, mode)
    where = f'File "{script}", line {_line_of(script, marker)} in <module>'
    # Timed from when the step got stuck: the stacks are on disk while it still is.
    took = _wait_for_stacks(out / "stalls", where, STALL_SECONDS + 2.0)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert took is not None, f"no stacks naming {where} within threshold + 2 s:\n{err}"
    named = sorted((out / "stalls").glob("step-1-*.txt"))
    assert named, sorted(p.name for p in (out / "stalls").iterdir())
    text = named[0].read_text()
    assert text.startswith("# otel-train stalls: step 1, rank 0 of 1, run t")
    assert where in text
    assert not (out / "stalls" / "pending-rank0.txt").exists()
    # one line names the training thread's innermost frame and the file
    assert f"stacks in {named[0]}; training thread at {script}:{_line_of(script, marker)}" in err
    spans = gzip.decompress((out / "spans.jsonl.gz").read_bytes()).decode()
    assert "train.stall.stacks_file" in spans and named[0].name in spans


def test_a_signal_dumps_every_threads_stack(tmp_path: Path) -> None:
    proc, script, out = _child(tmp_path, "free")
    where = f'File "{script}", line {_line_of(script, "GIL FREE")} in <module>'
    signal_file = out / "stalls" / "signal-rank0.txt"
    assert signal_file.read_text() == ""  # opened at start, written on the signal only
    # the stall's own stacks first: then the child is surely inside the sleep
    assert _wait_for_stacks(out / "stalls", where, STALL_SECONDS + 2.0) is not None
    proc.send_signal(signal.SIGUSR1)
    t0 = time.monotonic()
    while where not in signal_file.read_text() and time.monotonic() - t0 < 1.0:
        time.sleep(0.05)
    proc.communicate(timeout=30)
    assert where in signal_file.read_text()
    assert proc.returncode == 0  # the dump replaces SIGUSR1's default action (terminate)


def _stuck_step(rec: Recorder, index: int) -> Step:
    step = Step(rec, index, None)
    step.phase("allreduce").__enter__()
    return step


def test_a_stalled_rank_asks_the_others_and_saves_the_flight_recorder_beside(
        tmp_path: Path) -> None:
    folder = tmp_path / "stalls"
    rec0, rec1 = Recorder(10, DropCounter(), None), Recorder(10, DropCounter(), None)
    me = __import__("threading").get_ident()
    stacks0 = StallStacks(folder, 0, 2, me, flight_recorder=lambda: b"fake-fr-trace")
    stacks1 = StallStacks(folder, 1, 2, me, flight_recorder=lambda: None)
    dog0 = StallWatchdog(rec0, stall_seconds=0.01, stacks=stacks0, run_id="r")
    dog1 = StallWatchdog(rec1, stall_seconds=60.0, stacks=stacks1, run_id="r")
    step0 = _stuck_step(rec0, 3)
    _stuck_step(rec1, 3)
    time.sleep(0.05)
    try:
        assert dog0.check() is not None
        assert [p.name for p in folder.glob("request-*")] == ["request-step3-rank0.txt"]
        assert dog1.check() is None  # not stalled itself, but answers the request
        assert dog1.check() is None  # once
    finally:
        dog0.stop()
        dog1.stop()
    rank0 = [p for p in dog0.stacks_written if p.name.endswith("-rank0.txt")]
    rank1 = [p for p in dog1.stacks_written if p.name.endswith("-rank1.txt")]
    assert len(rank0) == 1 and len(rank1) == 1
    assert "# reason: request from rank 0 (stalled at its step 3)" in rank1[0].read_text()
    fr = rank0[0].with_name(rank0[0].stem + FLIGHT_RECORDER_SUFFIX)
    assert fr.read_bytes() == b"fake-fr-trace"
    events = getattr(step0, "stall_events", None)
    assert events and events[0][2]["train.stall.stacks_file"] == str(rank0[0])
    assert events[0][2]["train.stall.phase"] == "allreduce"


def test_the_thread_parser_reads_faulthandlers_format() -> None:
    text = ("Thread 0x00007f0000000001 (most recent call first):\n"
            '  File "/a/b.py", line 12 in wait\n  File "/a/c.py", line 3 in <module>\n\n'
            "Current thread 0x00007f0000000002 (most recent call first):\n"
            '  File "/x.py", line 7 in run\n')
    threads = parse_thread_stacks(text)
    assert [t.thread_id for t in threads] == [0x7F0000000001, 0x7F0000000002]
    assert threads[1].current and not threads[0].current
    stack = thread_stack(text, 0x7F0000000001)
    assert stack is not None and stack.innermost() == "/a/b.py:12 wait"
    assert thread_stack(text, 5) is None


def test_a_clean_run_leaves_no_stalls_folder(tmp_path: Path) -> None:
    rec = Recorder(10, DropCounter(), None)
    stacks = StallStacks(tmp_path / "stalls", 0, 1, 1)
    dog = StallWatchdog(rec, stall_seconds=60.0, stacks=stacks)
    Step(rec, 0, None)
    assert dog.check() is None  # arms the timer: the pending file exists meanwhile
    assert (tmp_path / "stalls" / "pending-rank0.txt").exists()
    dog.stop()
    assert not (tmp_path / "stalls").exists()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_forked_child_can_arm_its_own_timer(tmp_path: Path) -> None:
    """faulthandler's inherited timer state would hang the child on its first arming."""
    stacks = StallStacks(tmp_path / "stalls", 0, 1, 1)
    stacks.arm(0, "# header\n", 100.0)
    pid = os.fork()
    if pid == 0:  # the child: arm and cancel a timer of its own, then leave at once
        import faulthandler
        faulthandler.dump_traceback_later(50.0)
        faulthandler.cancel_dump_traceback_later()
        os._exit(0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung arming faulthandler's timer")
    assert os.waitstatus_to_exitcode(status) == 0
    assert stacks._armed  # the parent's timer is armed again
    stacks.close()


def test_forks_racing_a_thread_that_rearms_the_timer_never_leave_a_child_hanging(
        tmp_path: Path) -> None:
    """A before-fork hook can be preempted between its cancel and the fork: the timer lock
    keeps the watchdog from arming in that gap (else a child hangs at exit, in faulthandler's
    cancel, waiting for a timer thread it does not have)."""
    script = textwrap.dedent(f"""
        import os, sys, threading, time
        from pathlib import Path
        from otel_train.derived.stall_stacks import StallStacks
        stacks = StallStacks(Path({str(tmp_path / "stalls")!r}), 0, 1, threading.get_ident())
        stop = False
        def rearm():  # far more often than a watchdog: a new deadline every millisecond
            n = 0
            while not stop:
                n += 1
                stacks.arm(n % 2, "# header\\n", 300.0 + n % 7)
                time.sleep(0.001)
        threading.Thread(target=rearm, daemon=True).start()
        kids = []
        for _ in range(40):
            pid = os.fork()
            if pid == 0:
                sys.exit(0)  # the interpreter's exit cancels faulthandler's timer
            kids.append(pid)
            time.sleep(0.003)
        hung = 0
        for pid in kids:
            end = time.monotonic() + 10
            while not os.waitpid(pid, os.WNOHANG)[0]:
                if time.monotonic() > end:
                    hung += 1
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    break
                time.sleep(0.01)
        stop = True
        print("HUNG", hung, "PENDING", stacks.pending_path.exists(), flush=True)
        stacks.close()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # none hung; no child removed the parent's pending file as it left
    assert "HUNG 0 PENDING True" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def test_a_run_directory_that_cannot_be_written_never_raises_into_the_watchdog(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    rec = Recorder(10, DropCounter(), None)
    stacks = StallStacks(blocker / "stalls", 0, 2, 1)
    dog = StallWatchdog(rec, stall_seconds=0.01, stacks=stacks)
    _stuck_step(rec, 0)
    time.sleep(0.05)
    text = dog.check()  # stalled: the warning still comes, the stacks cannot
    dog.stop()
    assert text is not None and "looks stalled" in text
    assert not stacks.timer and dog.stacks_written == []
    assert "cannot write stall stacks" in caplog.text


def test_the_timer_s_stacks_are_named_after_the_step_running_when_it_fired(
        tmp_path: Path) -> None:
    """Empty steps after a stall end before the watchdog can look: the queued steps' own
    start and end times say which one ran when the timer fired, not the one that ended last."""
    rec = Recorder(10, DropCounter(), None)
    stacks = StallStacks(tmp_path / "stalls", 0, 1, 1)
    dog = StallWatchdog(rec, stall_seconds=60.0, stacks=stacks)
    try:
        for step in rec.steps(range(4), "train"):
            pass
        steps = list(rec.queue)
        assert [s.index for s in steps] == [0, 1, 2, 3]
        for s, (start, end) in zip(steps, [(0, 10), (20, 5_000), (5_001, 5_002),
                                           (5_003, 5_004)]):
            s.start_ns, s.end_ns = start, end  # step 1 ran from 20 to 5000 ns
        assert dog._queued_step_at(2_000) == 1
        assert dog._queued_step_at(5_001) == 2
        assert dog._queued_step_at(15) is None  # between steps 0 and 1
        assert dog._queued_step_at(9_999) is None  # after them all
    finally:
        dog.stop()
