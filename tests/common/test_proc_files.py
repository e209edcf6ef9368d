"""/proc files re-read through one kept-open descriptor: fresh content, None once gone."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from otel_train.common.proc_files import ProcFileReader
from otel_train.export.process.cpu import ProcessCpuReader, process_cpu_seconds

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def _on_cpu_ns(reader: ProcFileReader) -> int:
    data = reader.read()
    assert data is not None
    return int(data.split()[0])


def test_each_read_is_the_files_content_now_through_the_same_descriptor() -> None:
    path = f"/proc/self/task/{threading.get_native_id()}/schedstat"
    if not Path(path).exists():
        pytest.skip("kernel without schedstats")
    reader = ProcFileReader(path)
    first = _on_cpu_ns(reader)
    fd = reader._fd
    sum(range(2_000_000))  # some CPU on this thread
    assert _on_cpu_ns(reader) > first
    assert reader._fd == fd  # kept open: one pread a read
    assert Path(path).read_bytes().split()[0] != b""  # the same file, read the usual way


def test_a_task_that_has_exited_reads_none_and_a_closed_reader_reopens() -> None:
    tid: list[int] = []
    go = threading.Event()

    def task() -> None:
        tid.append(threading.get_native_id())
        go.wait(10)

    t = threading.Thread(target=task)
    t.start()
    while not tid:
        time.sleep(0.001)
    reader = ProcFileReader(f"/proc/self/task/{tid[0]}/stat")
    assert reader.read() is not None  # opened while the task lives, as the meter's is
    go.set()
    t.join()  # returns as the thread's code ends; the kernel lets the task go just after
    deadline = time.monotonic() + 5
    while reader.read() is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    # The descriptor names the task that exited, even where a new thread takes its id.
    assert reader.read() is None
    mine = ProcFileReader("/proc/self/stat")
    assert mine.read() is not None
    mine.close()
    assert mine._fd is None and mine.read() is not None


def test_a_child_processs_cpu_reads_as_process_cpu_seconds_does_and_none_once_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c",
                              "sum(range(30_000_000)); import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        reader = ProcessCpuReader(child.pid)
        seconds = reader.cpu_seconds()
        assert seconds is not None and seconds >= 0.0
        again = process_cpu_seconds(child.pid)
        assert again is not None and again >= seconds
    finally:
        child.communicate(b"", timeout=30)
    assert reader.cpu_seconds() is None


def test_a_processs_threads_on_cpu_clocks_sum_to_its_cpu_in_nanoseconds_then_none_once_reaped(
        ) -> None:
    if not Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists():
        pytest.skip("kernel without schedstats")
    # Two threads spin, one exits; the main thread spins again.
    script = ("import threading, sys\n"
              "t = threading.Thread(target=lambda: sum(range(20_000_000))); t.start()\n"
              "sum(range(20_000_000)); t.join()\n"
              "print('spun', flush=True); sys.stdin.readline()\n"
              "sum(range(20_000_000)); print('again', flush=True); sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    try:
        reader = ProcessCpuReader(child.pid)
        assert child.stdout.readline() == b"spun\n"
        first = reader.on_cpu_ns()
        stat = reader.cpu_seconds()
        assert first is not None and stat is not None
        # The nanosecond clocks agree with the kernel's tick count (10 ms a tick), the
        # exited thread's time missed by a reader that came after it: at most its share.
        assert 0.3 * stat * 1e9 <= first <= stat * 1e9 + 0.05e9
        child.stdin.write(b"go\n")
        child.stdin.flush()
        assert child.stdout.readline() == b"again\n"
        second = reader.on_cpu_ns()
        assert second is not None and second > first
    finally:
        child.communicate(b"", timeout=30)
    assert reader.on_cpu_ns() is None
