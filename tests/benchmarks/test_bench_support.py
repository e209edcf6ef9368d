"""bench_support.py's FrozenBackground holds a run's background still between blocks."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_support import FrozenBackground  # noqa: E402


class _Worker:
    """The two things FrozenBackground touches on the span worker."""

    def __init__(self) -> None:
        self.paused = False
        self._drain_lock = threading.Lock()


def _state(pid: int) -> str:
    """The process's state letter from /proc/<pid>/stat (T: stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def _wait_state(pid: int, want: str) -> str:
    deadline = time.monotonic() + 5.0
    while (got := _state(pid)) != want and time.monotonic() < deadline:
        time.sleep(0.01)
    return got


def test_freeze_pauses_the_worker_and_stops_the_processes_and_thaw_resumes_them() -> None:
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
             for _ in range(2)]
    try:
        worker = _Worker()
        frozen = FrozenBackground(worker, [procs[0].pid, None, procs[1].pid])
        assert frozen.pids == [procs[0].pid, procs[1].pid]  # a run without a child: skipped
        frozen.freeze()
        assert worker.paused and frozen.frozen
        assert [_wait_state(p.pid, "T") for p in procs] == ["T", "T"]
        frozen.thaw()
        assert not worker.paused and not frozen.frozen
        assert [_wait_state(p.pid, "S") for p in procs] == ["S", "S"]
    finally:
        for p in procs:
            p.kill()
            p.wait(5)


def test_freeze_waits_for_a_drain_in_progress_and_counts_that_wait() -> None:
    worker = _Worker()
    frozen = FrozenBackground(worker, [])
    worker._drain_lock.acquire()  # a drain is running on the worker
    threading.Timer(0.05, worker._drain_lock.release).start()
    frozen.freeze()
    assert worker.paused
    assert frozen.leftover_ns >= 40_000_000  # it waited for the drain to end
    assert worker._drain_lock.acquire(blocking=False)  # and does not hold the lock after
