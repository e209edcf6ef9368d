"""Measurement shared by the benchmarks: the training thread's clock (CPU and schedstat),
the exporter process's CPU, gc counting, a real OTLP receiver in its own process, and
bootstrap medians.

Usage::

    clock = ThreadClock(); a = clock.read(); ...; b = clock.read()
    child = ProcessCpu(run._telemetry.export.pid); child.read_ns()
    receiver = ReceiverProcess(); receiver.endpoint; receiver.count(); receiver.close()
    rounds_main(argv, __doc__, run_workload, workloads="mlp", rounds=3, ...)  # paired-block benches
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from otel_train.common.self_cost import TrainingThreadSchedstat  # noqa: E402


class ThreadClock:
    """Wall, thread CPU, process CPU and schedstat of the calling (training) thread."""

    def __init__(self) -> None:
        # The reader the run's own-cost figures use (otel_train/common/self_cost.py).
        self._schedstat = TrainingThreadSchedstat(threading.get_native_id())

    def read(self) -> tuple[int, int, int, int, int]:
        """(wall, thread cpu, process cpu, on-cpu, run-queue wait) in ns."""
        on, wait = self._schedstat.read() or (0, 0)
        return (time.perf_counter_ns(), time.thread_time_ns(), time.process_time_ns(), on, wait)


class GcCounter:
    """Counts gc collections by generation while ``active``."""

    def __init__(self) -> None:
        self.active = False
        self.counts = [0, 0, 0]
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if self.active and phase == "start":
            self.counts[info["generation"]] += 1


def timed_block(clock: ThreadClock, body: Any, drain: Any = None,
                child: ProcessCpu | None = None, settle: Any = None) -> dict[str, int]:
    """Run ``body()`` (and ``drain()`` after it, timed apart); the block's figures.

    ``settle()`` runs after, untimed (work of another process finishing); ``child``: the
    exporter process, whose CPU from the block's start to the end of ``settle`` is
    ``child_cpu``.
    """
    c0 = child.read_ns() if child is not None else 0
    a = clock.read()
    body()
    b = clock.read()
    out = {"wall": b[0] - a[0], "thread_cpu": b[1] - a[1], "proc_cpu": b[2] - a[2],
           "runq": b[4] - a[4], "blocked": max(0, (b[0] - a[0]) - (b[3] - a[3]) - (b[4] - a[4])),
           "drain_wall": 0, "drain_proc_cpu": 0, "drain_thread_cpu": 0, "child_cpu": 0}
    if drain is not None:
        drain()
        c = clock.read()
        out.update(drain_wall=c[0] - b[0], drain_proc_cpu=c[2] - b[2], drain_thread_cpu=c[1] - b[1])
    if settle is not None:
        settle()
    if child is not None:
        out["child_cpu"] = child.read_ns() - c0
    return out


class ProcessCpu:
    """CPU time of another process (all its threads), from ``/proc/<pid>/task/*/schedstat``."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self._last = 0

    def read_ns(self) -> int:
        """Nanoseconds on a CPU so far (the last value seen once the process is gone)."""
        if self.pid is None:
            return 0
        total = 0
        try:
            for task in os.listdir(f"/proc/{self.pid}/task"):
                try:
                    with open(f"/proc/{self.pid}/task/{task}/schedstat") as f:
                        total += int(f.read().split()[0])
                except (OSError, ValueError, IndexError):
                    pass
        except OSError:
            return self._last
        self._last = max(self._last, total)
        return self._last

    def main_thread_ns(self) -> int:
        """Nanoseconds on a CPU so far of its main thread (0 once the process is gone)."""
        if self.pid is None:
            return 0
        try:
            with open(f"/proc/{self.pid}/task/{self.pid}/schedstat") as f:
                return int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return 0


@contextlib.contextmanager
def live_run(endpoint: str | None, service_name: str,
             **options: Any) -> Iterator[tuple[Any, str]]:
    """One otel-train run for the blocks to run beside: OTLP/HTTP to ``endpoint``, Prometheus
    on a free port, the console on and sent to /dev/null (its cost counts, not its text), the
    status dir a temp dir named after ``service_name``; ``options`` override these. Yields
    (run, that dir); afterwards the run is shut down (if the body did not), stderr restored
    and the dir removed."""
    import otel_train

    tmp = tempfile.mkdtemp(prefix=f"{service_name}-")
    stderr = sys.stderr
    sys.stderr = open(os.devnull, "w")
    run = None
    try:
        kwargs: dict[str, Any] = {
            "exporter": "otlp", "otlp_endpoint": endpoint, "otlp_protocol": "http/protobuf",
            "prometheus_port": 0, "console": True, "status_dir": tmp,
            "service_name": service_name}
        run = otel_train.start_run(**{**kwargs, **options})
        yield run, tmp
    finally:
        if run is not None:
            run.shutdown()  # a no-op where the body shut it down
        sys.stderr.close()
        sys.stderr = stderr
        shutil.rmtree(tmp, ignore_errors=True)


def exporter_pid(run: Any) -> int | None:
    """The pid of a run's exporter process, or None when it exports in-process."""
    return getattr(getattr(run, "_telemetry", None) and run._telemetry.export, "pid", None)


class FrozenBackground:
    """A run's background held still outside its own blocks, so short blocks hold all of it.

    ``freeze()`` pauses the span worker (after the drain it may be in), then stops the
    exporter process and the receiver with SIGSTOP; ``thaw()`` lets them go on. Work a block
    leaves (queued steps, frames, requests) then waits, off every clock, and is done in the
    next instrumented block, inside its clock, not in the bare block between: run after run,
    all of the background's work lands in the instrumented blocks, however short they are.
    What depends on the wall clock (the worker's looks and own-cost samples, the exporter's
    reports) runs about once per block more than a run that never stops would: the A/B and
    the share the run reports both count it. ``leftover_ns``: time spent waiting for a drain
    in progress when a block ended (that drain's rest, done off both clocks).
    """

    def __init__(self, worker: Any, pids: list[int | None]) -> None:
        self.worker = worker
        self.pids = [p for p in pids if p is not None]  # stopped in this order, resumed reversed
        self.leftover_ns = 0
        self.frozen = False

    def freeze(self) -> None:
        """Pause the worker, wait out a drain in progress, stop the processes."""
        self.worker.paused = True
        t0 = time.perf_counter_ns()
        with self.worker._drain_lock:  # a drain in progress ends before the block is over
            pass
        self.leftover_ns += time.perf_counter_ns() - t0
        for pid in self.pids:
            os.kill(pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        """Resume the processes (the receiver first), then the worker."""
        for pid in reversed(self.pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.worker.paused = False
        self.frozen = False


_RECEIVER_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[1])
from otlp_receivers import HttpOtlpReceiver
with HttpOtlpReceiver(keep_spans=False) as r:
    print(r.endpoint, flush=True)
    for line in sys.stdin:
        if line.strip() == "count":
            print(r.span_count(), flush=True)
"""


class ReceiverProcess:
    """tests/otlp_receivers.py's real OTLP/HTTP receiver, in its own process.

    It parses every request in full but keeps only the span count (``keep_spans=False``):
    decoding each span into Python records costs ~210 µs per 7-span step on the MLP loop,
    twice the exporter process, on the same two cores as the loop it measures, which a
    collector (elsewhere, or in Go) does not cost the training machine.
    """

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _RECEIVER_SCRIPT, str(ROOT / "tests")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.endpoint = self._proc.stdout.readline().strip()
        if not self.endpoint.startswith("http"):
            raise RuntimeError("the OTLP receiver did not start")
        self.pid = self._proc.pid

    def count(self) -> int:
        """Spans received so far."""
        self._proc.stdin.write("count\n")
        self._proc.stdin.flush()
        return int(self._proc.stdout.readline())

    def resume(self) -> None:
        """Let it go on if a benchmark's worker left it stopped (``FrozenBackground``)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGCONT)

    def close(self) -> None:
        """Stop the receiver (bounded)."""
        self.resume()
        self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()


def _resample(values: list[float], rng: random.Random, block: int) -> list[float]:
    """One bootstrap sample: ``block``-long runs of neighbours (a moving-block bootstrap, for
    estimates that share a bare block with the next one), cut to ``len(values)``."""
    n = len(values)
    if block <= 1:
        return rng.choices(values, k=n)
    out: list[float] = []
    while len(out) < n:
        i = rng.randrange(n - block + 1)
        out.extend(values[i:i + block])
    return out[:n]


def _median_ci(values: list[float], seed: int = 0, block: int = 1,
               stat: Any = statistics.median) -> tuple[float, float, float]:
    """``stat`` (the median) and its bootstrap 95% interval (2000 resamples)."""
    rng = random.Random(seed)
    med = stat(values)
    if len(values) < 2:
        return med, med, med
    block = min(block, len(values))
    boots = sorted(stat(_resample(values, rng, block)) for _ in range(2000))
    return med, boots[49], boots[1949]


def _fmt_ci(values: list[float], block: int = 1, stat: Any = statistics.median) -> str:
    m, lo, hi = _median_ci(values, block=block, stat=stat)
    return f"{m:6.3f} [{lo:5.3f}, {hi:5.3f}]"


def rounds_main(argv: list[str] | None, doc: str, run_workload: Any, *, workloads: str,
                rounds: int, block_steps: dict[str, int], smoke: tuple[int, int],
                pair: str, rounds_help: str | None = None) -> int:
    """The command line of a bench made of rounds of paired blocks per workload:
    ``run_workload(name, rounds, steps, endpoint)`` for each workload, one torch thread and
    one receiver for all; ``smoke``: (rounds, steps). Where there is no per-thread schedstat
    it says so and does nothing."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--workloads", default=workloads, help="comma list of gpt, mlp")
    ap.add_argument("--rounds", type=int, default=rounds,
                    help=rounds_help or f"{pair} block pairs")
    ap.add_argument("--block-steps", type=int, default=None,
                    help=f"steps per block (default: {block_steps})")
    ap.add_argument("--smoke", action="store_true",
                    help=f"{smoke[0]} round(s) of {smoke[1]}-step blocks")
    args = ap.parse_args(argv)
    if not Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists():
        print(f"{ap.prog}: no per-thread schedstat here (Linux with schedstats only)")
        return 0
    import torch

    torch.set_num_threads(1)
    receiver = ReceiverProcess()
    try:
        for name in [x for x in args.workloads.split(",") if x]:
            steps = smoke[1] if args.smoke else (args.block_steps or block_steps[name])
            run_workload(name, smoke[0] if args.smoke else args.rounds, steps, receiver.endpoint)
    finally:
        receiver.close()
    return 0
