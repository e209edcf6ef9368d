"""Which training steps otel-train's threads slow down on the CPU, step by step.

The all-in A/B (``bench_training_loop.py --block-steps 1500``) finds the MLP's training thread
spending more CPU per step while the run exports, beyond its hot path; a block's speed moves
by ~15% on a shared machine, so blocks seconds apart cannot say which steps pay it. This bench
looks at single steps instead. A sampler process reads the on-CPU clocks
(``/proc/<pid>/task/<tid>/schedstat``) of the span worker and of the exporter process's
threads at ~1 kHz, the training thread notes each step's start, end and thread CPU, and each
step is compared with the median of its 50 neighbours (a machine's drift over ~0.1 s cancels).

Blocks alternate, in one process beside one live run: ``idle`` runs the bare loop (the run
only polls), ``active`` the README's loop through ``run.steps`` and phases (the run drains and
exports while training). For each block kind it prints the steps that otel-train's threads
ran beside (at least 20 us of their CPU inside the step), their training-thread CPU over
their neighbours' median beyond that of the quiet steps (median and mean), and that extra
spread over all steps. A slowdown lasting longer than
~25 steps is in the neighbours' median too, so the per-step figure is a lower bound.

Usage::

    python benchmarks/bench_step_interference.py                     # mlp, 3 rounds
    python benchmarks/bench_step_interference.py --workloads mlp,gpt --rounds 5
    python benchmarks/bench_step_interference.py --smoke             # seconds; the test runs it
"""

from __future__ import annotations

import array
import bisect
import glob
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loop_workloads import Workload  # noqa: E402
from bench_support import ROOT, exporter_pid, live_run, rounds_main  # noqa: E402

sys.path.insert(0, str(ROOT))

BLOCK_STEPS = {"gpt": 400, "mlp": 5000}
NEIGHBOURS = 25  # each side
BUSY_NS = 20_000  # otel-train's CPU inside a step that makes it a step "beside" it

# Reads each file's first field (on-CPU ns) every ~0.5 ms until the stop file appears; writes
# rows of (perf_counter ns, value per file) as int64.
_SAMPLER = """
import array, os, sys, time
out, paths = sys.argv[1], sys.argv[2:]
fds = [os.open(p, os.O_RDONLY) for p in paths]
rows = array.array("q")
while not os.path.exists(out + ".stop"):
    rows.append(time.perf_counter_ns())
    for fd in fds:
        try:
            rows.append(int(os.pread(fd, 128, 0).split()[0]))
        except (OSError, ValueError, IndexError):
            rows.append(-1)
    time.sleep(0.0005)
with open(out, "wb") as f:
    rows.tofile(f)
"""


def _bare_steps(w: Workload, n: int) -> list[tuple[int, int, int, int]]:
    """The bare loop; per step (start ns, end ns, thread CPU at start, at end)."""
    forward, opt, out = w.forward, w.opt, []
    clock, cpu = time.perf_counter_ns, time.thread_time_ns
    for x, y in w.batches(n):
        a, c = clock(), cpu()
        loss = forward(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append((a, clock(), c, cpu()))
    return out


def _run_steps(w: Workload, n: int, run: Any) -> list[tuple[int, int, int, int]]:
    """The README's loop (run.steps and phases), timed the same way."""
    forward, opt, out = w.forward, w.opt, []
    clock, cpu = time.perf_counter_ns, time.thread_time_ns
    for step in run.steps(w.batches(n), loader="train"):
        a, c = clock(), cpu()
        x, y = step.batch
        with step.phase("forward"):
            loss = forward(x, y)
        with step.phase("backward"):
            loss.backward()
        with step.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        out.append((a, clock(), c, cpu()))
    return out


class _Samples:
    """The sampler's rows: otel-train's threads' CPU (ns so far) at each sample time."""

    def __init__(self, path: str, columns: int) -> None:
        rows = array.array("q")
        rows.frombytes(Path(path).read_bytes())
        width = columns + 1
        n = len(rows) // width
        self.t = rows[0:n * width:width]
        self.cpu = [sum(max(0, rows[i * width + 1 + j]) for j in range(columns))
                    for i in range(n)]

    def at(self, t_ns: int) -> float:
        """Their CPU so far at ``t_ns``, interpolated between samples."""
        i = bisect.bisect_left(self.t, t_ns)
        if i <= 0:
            return self.cpu[0]
        if i >= len(self.t):
            return self.cpu[-1]
        t0, t1 = self.t[i - 1], self.t[i]
        return self.cpu[i - 1] + (self.cpu[i] - self.cpu[i - 1]) * (t_ns - t0) / (t1 - t0)


def _excess(steps: list[tuple[int, int, int, int]], samples: _Samples) -> list[tuple[float, float]]:
    """Per step: (training-thread CPU over its neighbours' median, otel-train's CPU in it)."""
    cpu = [d - c for _, _, c, d in steps]
    out = []
    for i, (a, b, _, _) in enumerate(steps):
        near = cpu[max(0, i - NEIGHBOURS):i + NEIGHBOURS + 1]
        out.append((cpu[i] - statistics.median(near), samples.at(b) - samples.at(a)))
    return out


def _report(kind: str, rows: list[tuple[float, float]], cpu_us: float) -> float:
    """Print one block kind's line; return the extra CPU per step of all its steps (us).

    Steps with nothing beside them are the baseline: step times are skewed (a few long ones),
    so even quiet steps sit above their neighbours' median on average."""
    beside = [e for e, bg in rows if bg >= BUSY_NS]
    quiet = [e for e, bg in rows if bg < BUSY_NS]
    bg = statistics.fmean(b for _, b in rows) / 1e3
    head = f"{kind:<7}{cpu_us:9.0f}{bg:10.1f}{100 * len(beside) / len(rows):9.1f}%"
    if not beside or not quiet:
        print(f"{head}  (no {'step beside' if not beside else 'quiet step'})")
        return 0.0
    extra = statistics.fmean(beside) - statistics.fmean(quiet)
    per_step = extra * len(beside) / len(rows) / 1e3
    print(f"{head}{(statistics.median(beside) - statistics.median(quiet)) / 1e3:+12.1f}"
          f"{extra / 1e3:+12.1f}{per_step:+11.1f}")
    return per_step


def _threads(run: Any) -> list[str]:
    """schedstat files of the span worker and of the exporter process's threads."""
    worker = run._telemetry.worker._thread.native_id
    paths = [f"/proc/{os.getpid()}/task/{worker}/schedstat"]
    pid = exporter_pid(run)
    if pid is not None:
        paths += sorted(glob.glob(f"/proc/{pid}/task/*/schedstat"))
    return paths


def run_workload(name: str, rounds: int, steps: int, endpoint: str) -> None:
    """Rounds of (idle, active) blocks beside one run; prints the table for one workload."""
    w = Workload(name, eval_every=10**9)  # no evaluation: every step is a training step
    stderr = sys.stderr
    with live_run(endpoint, "bench-interference") as (run, tmp):
        _run_steps(w, min(steps, 200), run)  # warm-up: first-use paths, the exporter's start
        run.flush()
        paths = _threads(run)
        out = os.path.join(tmp, "samples.bin")
        sampler = subprocess.Popen([sys.executable, "-c", _SAMPLER, out, *paths])
        time.sleep(0.2)
        blocks: dict[str, list[list[tuple[int, int, int, int]]]] = {"idle": [], "active": []}
        for r in range(rounds):
            blocks["idle"].append(_bare_steps(w, steps))
            blocks["active"].append(_run_steps(w, steps, run))
            run.flush()  # what the block left, outside both blocks
            print(f"  round {r + 1}/{rounds} done", file=stderr, flush=True)
        Path(out + ".stop").touch()
        try:
            sampler.wait(30)
        except subprocess.TimeoutExpired:
            sampler.kill()
            raise
        run.shutdown()
        samples = _Samples(out, len(paths))
    print(f"\n== {name}: {rounds} rounds of {steps}-step blocks; training-thread CPU per step "
          f"against its {2 * NEIGHBOURS} neighbours' median")
    print(f"{'block':<7}{'CPU us':>9}{'bg us':>10}{'beside':>10}{'median +':>12}"
          f"{'mean +':>12}{'per step':>11}")
    extra = {}
    for kind, runs in blocks.items():
        rows = [row for steps_ in runs for row in _excess(steps_, samples)]
        cpu_us = statistics.median(d - c for s in runs for _, _, c, d in s) / 1e3
        extra[kind] = _report(kind, rows, cpu_us)
    print(f"active - idle: {extra['active'] - extra['idle']:+.1f} us of training-thread CPU per "
          f"step where otel-train's threads ran beside it (a lower bound)")


def main(argv: list[str] | None = None) -> int:
    return rounds_main(argv, __doc__, run_workload, workloads="mlp", rounds=3,
                       block_steps=BLOCK_STEPS, smoke=(1, 800), pair="(idle, active)")

if __name__ == "__main__":
    sys.exit(main())
