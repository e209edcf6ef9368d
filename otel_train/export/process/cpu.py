"""The exporter process's CPU: a Prometheus counter and the figures ``run.costs()`` reports.

It holds no GIL of the training process, but it is the library's cost all the same.

Usage::

    registry.register(ExporterProcessCpuCollector(client, rank))
    process_cpu_seconds(client.pid)
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client.metrics_core import CounterMetricFamily, Metric

from otel_train.common.proc_files import ProcFileReader

METRIC_EXPORTER_CPU = "otel_train_exporter_process_cpu_seconds_total"


class ExporterProcessHandle(Protocol):
    """What the collector reads of the client."""

    @property
    def pid(self) -> int | None:
        """The exporter process's pid."""

    @property
    def startup_cpu_seconds(self) -> float | None:
        """Its CPU until it was ready."""

    @property
    def corrupt_report_frames(self) -> int:
        """Its reports that could not be read."""


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return _stat_cpu_seconds(f.read())
    except OSError:
        return None


class ProcessCpuReader:
    """One process's CPU, read at each own-cost sample: ``cpu_seconds`` from its
    ``/proc/<pid>/stat`` (the kernel's total, dead threads included, in clock ticks), and
    ``on_cpu_ns`` from each of its threads' ``schedstat`` (nanoseconds: a tick is 10 ms,
    as long as the exporter process's whole burst of a ring read, so the interval-by-interval
    figure the interference line is fitted on needs the threads' own clocks). Files are
    kept open (one ``pread`` a read, proc_files.py); the thread list is read again every
    ``THREADS_EVERY_SECONDS``."""

    THREADS_EVERY_SECONDS = 2.0

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._file = ProcFileReader(f"/proc/{pid}/stat")
        self._threads: dict[str, ProcFileReader] = {}
        self._thread_ns: dict[str, int] = {}  # each thread's on-CPU ns at its last read
        self._listed = float("-inf")

    def cpu_seconds(self) -> float | None:
        """User + system CPU seconds so far, or None (the process has exited)."""
        data = self._file.read()
        return None if data is None else _stat_cpu_seconds(data)

    def on_cpu_ns(self) -> int | None:
        """The on-CPU nanoseconds of its threads so far (an exited thread's last reading
        kept: the figure never goes back), or None where no thread can be read (no
        ``schedstat`` on this kernel, or the process has exited)."""
        now = time.monotonic()
        if now - self._listed >= self.THREADS_EVERY_SECONDS:
            self._listed = now
            self._list_threads()
        read = False
        for tid, reader in self._threads.items():
            data = reader.read()
            if data is None:
                continue
            try:
                self._thread_ns[tid] = int(data.split(None, 1)[0])
                read = True
            except (ValueError, IndexError):
                continue
        return sum(self._thread_ns.values()) if read else None

    def cpu_ns(self) -> int | None:
        """Its CPU so far in ns for an own-cost interval: its threads' clocks, or where
        they cannot be read its ``/proc/<pid>/stat`` ticks; None once it has exited."""
        on_cpu = self.on_cpu_ns()
        if on_cpu is not None:
            return on_cpu
        seconds = self.cpu_seconds()
        return None if seconds is None else int(seconds * 1e9)

    def _list_threads(self) -> None:
        try:
            tids = set(os.listdir(f"/proc/{self.pid}/task"))
        except OSError:
            return
        for tid in list(self._threads):
            if tid not in tids:
                self._threads.pop(tid).close()
        for tid in tids - set(self._threads):
            self._threads[tid] = ProcFileReader(f"/proc/{self.pid}/task/{tid}/schedstat")

    def close(self) -> None:
        """Close the files."""
        self._file.close()
        for reader in self._threads.values():
            reader.close()


_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat_cpu_seconds(data: bytes) -> float | None:
    """utime + stime of a ``/proc/<pid>/stat`` line, in seconds."""
    try:
        fields = data.rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK
    except (ValueError, IndexError):
        return None


class ExporterProcessCpuCollector:
    """Prometheus collector: the exporter process's CPU seconds, labelled by rank."""

    def __init__(self, client: ExporterProcessHandle, rank: Any) -> None:
        self._client = client
        self._rank = str(rank)
        self._last = 0.0

    def startup_cpu_seconds(self) -> float | None:
        """Of that, the CPU its start-up took (interpreter, imports, the exporter)."""
        return self._client.startup_cpu_seconds

    def corrupt_report_frames(self) -> int:
        """Its reports that could not be read, so far."""
        return self._client.corrupt_report_frames

    def step_ring_counts(self) -> dict[str, int] | None:
        """What became of the step ring's records in it (``ring_link.py``), None when it
        reads no ring."""
        counts = getattr(self._client, "step_ring_counts", None)
        return counts() if counts is not None else None

    def cpu_seconds(self) -> float | None:
        """The exporter process's CPU seconds so far (its last reading once it has exited),
        or None if it was never readable."""
        pid = self._client.pid
        seconds = process_cpu_seconds(pid) if pid is not None else None
        if seconds is None and not self._last:
            return None
        self._last = max(self._last, seconds or 0.0)
        return self._last

    def collect(self) -> Iterator[Metric]:
        """One counter family while the exporter process is (or was) readable."""
        if self.cpu_seconds() is None:
            return
        fam = CounterMetricFamily(
            METRIC_EXPORTER_CPU, "CPU time of otel-train's exporter process (span building, "
            "encoding and sending, out of the training process's GIL).", labels=["rank"])
        fam.add_metric([self._rank], self._last)
        yield fam
