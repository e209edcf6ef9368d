"""What the hot path costs inside a real training loop, beside the figures the run charges.

``bench_hot_path.py`` times the context managers back to back: their code and objects stay
in the core's caches. In a training loop each call comes after a step's torch work, which
has evicted them. This bench runs the README's loop (``run.steps`` + forward / backward /
optimizer phases, ``step.monitor("val_loss")`` every 50 steps) around the MLP and GPT
steps of ``bench_training_loop.py`` and times every otel-train call in it with
``perf_counter_ns``: ``next()`` of the step loop less the loader's own time (the ``data``
phase the recorder timed), each ``step.phase(name)`` lookup with its ``__enter__``, each
``__exit__``. The span worker is paused during a block (nothing runs beside it) and the
block's records are read back, then dropped.

It prints, per workload, the hot path in situ (per step and per span, the median of the
blocks) beside the run's calibration (``recording/hot_path_cost.py``): warm, cold, and
what the run charges per step (the spans x cold, these steps being long). The timer pairs
(~0.1 us each, about 10 a step) are left in: the in-situ figure is an upper bound by that.

Usage::

    python benchmarks/bench_hot_path_in_situ.py                 # mlp and gpt, 5 blocks each
    python benchmarks/bench_hot_path_in_situ.py --workloads mlp --rounds 10
    python benchmarks/bench_hot_path_in_situ.py --smoke         # seconds; the test runs it
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path
from time import perf_counter_ns
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loop_workloads import Workload  # noqa: E402
from bench_support import ROOT, live_run, rounds_main  # noqa: E402

sys.path.insert(0, str(ROOT))
from otel_train.recording.recorder import Step, decode_events  # noqa: E402

BLOCK_STEPS = {"gpt": 150, "mlp": 1500}


def _timed_loop(w: Workload, n: int, run: Any) -> int:
    """The README's loop, every otel-train call timed; the ns they took, loader included."""
    forward, opt, clock = w.forward, w.opt, perf_counter_ns
    spent = 0
    loop = iter(run.steps(w.batches(n), loader="train"))
    while True:
        t0 = clock()
        try:
            step = next(loop)
        except StopIteration:
            spent += clock() - t0
            return spent
        spent += clock() - t0
        x, y = step.batch
        for name in ("forward", "backward", "optimizer"):
            t0 = clock()
            phase = step.phase(name)
            phase.__enter__()
            spent += clock() - t0
            if name == "forward":
                loss = forward(x, y)
            elif name == "backward":
                loss.backward()
            else:
                opt.step()
                opt.zero_grad(set_to_none=True)
            t0 = clock()
            phase.__exit__(None, None, None)
            spent += clock() - t0
        w.k += 1
        if w.k % w.eval_every == 0:
            t0 = clock()
            monitor = step.monitor("val_loss")
            monitor.__enter__()
            spent += clock() - t0
            w.evaluate()
            t0 = clock()
            monitor.__exit__(None, None, None)
            spent += clock() - t0


def _block(w: Workload, n: int, run: Any) -> tuple[float, float]:
    """One block with the span worker paused: (hot path ns per step, spans per step)."""
    recorder = run._recorder
    worker = run._telemetry.worker
    worker.paused = True
    try:
        spent = _timed_loop(w, n, run)
        records = [r for r in list(recorder.queue) if isinstance(r, Step)]
    finally:
        recorder.queue.clear()  # not exported: the block's records are only read back
        worker.paused = False
    loader_ns = spans = 0
    for record in records:
        phases = decode_events(record.ev)
        spans += 1 + len(phases)
        loader_ns += sum(p.end_ns - p.start_ns for p in phases if p.phase.name == "data")
    steps = max(1, len(records))
    return (spent - loader_ns) / steps, spans / steps


def run_workload(name: str, rounds: int, steps: int, endpoint: str) -> None:
    """Blocks of the timed loop beside one run (no exporter); prints one workload's row."""
    del endpoint  # nothing is exported: the records are read back and dropped
    w = Workload(name, eval_every=50)
    with live_run(None, "bench-hot-path-in-situ", exporter="none", otlp_protocol=None,
                  prometheus_port=None, console=False,
                  max_queued_steps=steps + 16) as (run, _):
        _block(w, min(steps, 50), run)  # warm-up
        got = [_block(w, steps, run) for _ in range(rounds)]
        cost = run.costs()["own_cost"]["hot_path_ns_per_span"]
    per_step = statistics.median(g[0] for g in got) / 1e3
    spans = statistics.median(g[1] for g in got)
    charged = spans * cost["cold"] / 1e3
    print(f"\n== {name}: {rounds} blocks of {steps} steps, the README's loop, every "
          f"otel-train call timed")
    print(f"in situ: {per_step:.2f} us per step, {spans:.2f} spans -> "
          f"{per_step / spans:.2f} us per span (blocks: "
          + ", ".join(f"{g[0] / 1e3:.1f}" for g in got) + " us per step)")
    print(f"calibrated at start_run: warm {cost['warm'] / 1e3:.2f} us per span, cold "
          f"{cost['cold'] / 1e3:.2f} us per span; charged per step: {charged:.2f} us "
          f"(in situ / charged: {per_step / charged:.2f}x)")


def main(argv: list[str] | None = None) -> int:
    return rounds_main(argv, __doc__, run_workload, workloads="mlp,gpt", rounds=5,
                       block_steps=BLOCK_STEPS, smoke=(2, 60), pair="timed")


if __name__ == "__main__":
    sys.exit(os.EX_OK if main() == 0 else 1)
