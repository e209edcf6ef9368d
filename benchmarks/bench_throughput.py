"""What counting tokens, samples and FLOPs costs the training thread.

Prints, measured in this one process with ``time.thread_time_ns`` (the training thread's
CPU):

- per step, ``run.steps``' loop (the recorder's, no export) over a list of batches, bare and
  with the batch counted from its shape (``recording/step_counts.py``): token ids, an
  ``(x, y)`` tuple, a dict with ``input_ids``, and an ambiguous batch (counted once, then
  passed straight through). An int ``tokens_per_step`` costs nothing per step (the
  background fills it in), so it has no row. Blocks alternate bare / counted and the best
  block of each is kept: the difference is the counting's cost per step;
- ``step.count(tokens=..., samples=...)`` per call;
- the one-off FLOP-counted step (``count_flops``): an MLP step and the demo's tiny GPT step,
  wall time bare and under ``FlopCounterMode``; the first count in a process also imports
  ``torch._dynamo`` and is printed apart.

The whole-loop A/B (no measurable step-time cost) is ``bench_training_loop.py``'s
``otel-throughput`` variant beside ``otel-otlp`` (docs/benchmarks.md).

Usage::

    python benchmarks/bench_throughput.py            # ~1 min
    python benchmarks/bench_throughput.py --smoke    # seconds; the test runs it
"""

from __future__ import annotations

import argparse
import sys
import time
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _loop_ns(batches: list[Any], counted: bool) -> float:
    """CPU ns per step of the recorder's loop over ``batches``."""
    from otel_train.common.drop_counter import DropCounter
    from otel_train.recording.recorder import Recorder
    from otel_train.recording.step_counts import BatchCounter

    rec = Recorder(len(batches) + 1, DropCounter(), None)
    counter = BatchCounter() if counted else None
    t0 = time.thread_time_ns()
    for _step in rec.steps(batches, None, None, counter):
        pass
    return (time.thread_time_ns() - t0) / len(batches)


def per_step(steps: int, blocks: int) -> None:
    """Counting's cost per step, by kind of batch."""
    import logging

    import torch

    logging.getLogger("otel_train").setLevel(logging.WARNING)  # the ambiguity hint
    ids = torch.zeros((8, 512), dtype=torch.long)
    kinds = {"token ids (8, 512)": ids, "(x, y) tuple": (ids, ids),
             "dict input_ids": {"input_ids": ids, "attention_mask": ids},
             "ambiguous (an int)": 3}
    print(f"per step, {steps} steps x {blocks} blocks each, best block (CPU ns):")
    for name, batch in kinds.items():
        batches = [batch] * steps
        bare, counted = [], []
        for _ in range(blocks):
            bare.append(_loop_ns(batches, False))
            counted.append(_loop_ns(batches, True))
        print(f"  {name:<20} bare {min(bare):6.0f}  counted {min(counted):6.0f}"
              f"  counting {min(counted) - min(bare):+6.0f} ns/step")


def step_count_call(number: int) -> None:
    """``step.count(tokens=..., samples=...)`` per call."""
    from otel_train.common.drop_counter import DropCounter
    from otel_train.recording.recorder import Recorder

    step = Recorder(2, DropCounter(), None).begin_step(None, 0)
    call = min(timeit.repeat(lambda: step.count(tokens=4096, samples=8), number=number,
                             repeat=5))
    empty = min(timeit.repeat(lambda: None, number=number, repeat=5))
    print(f"step.count(tokens=, samples=): {(call - empty) / number * 1e9:.0f} ns per call")


def _mlp_step() -> Any:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 10))
    x = torch.randn(64, 512)

    def step() -> None:
        model(x).square().mean().backward()
    return step


def _gpt_step() -> Any:
    import torch

    from otel_train.cli.demo import build_model

    model = build_model(64, block_size=32)
    x = torch.randint(64, (8, 32))

    def step() -> None:
        model(x, x)[1].backward()
    return step


def _wall(fn: Any, counted: bool) -> tuple[float, int]:
    """(seconds, FLOPs) of one call of ``fn``, under FlopCounterMode when ``counted``."""
    from torch.utils.flop_counter import FlopCounterMode

    t0 = time.perf_counter()
    if not counted:
        fn()
        return time.perf_counter() - t0, 0
    mode = FlopCounterMode(display=False)
    with mode:
        fn()
    return time.perf_counter() - t0, mode.get_total_flops()


def flop_count_step(smoke: bool) -> None:
    """The one-off counted step's time, bare beside it (smoke: the MLP only)."""
    workloads = [("MLP 512-wide, batch 64", _mlp_step)]
    if not smoke:
        workloads.append(("tiny GPT, 8 x 32 tokens", _gpt_step))
    for name, make in workloads:
        fn = make()
        for _ in range(3):
            fn()  # warm: the bare figure is a steady step
        bare = min(_wall(fn, False)[0] for _ in range(5))
        first, flops = _wall(fn, True)
        again = min(_wall(fn, True)[0] for _ in range(3))
        print(f"  {name:<24} bare {bare * 1e3:7.1f} ms  counted {again * 1e3:7.1f} ms"
              f"  (first in this process {first * 1e3:7.0f} ms)  {flops / 1e6:.1f} MFLOP")


def main(argv: list[str] | None = None) -> None:
    """Run every measurement and print it."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: seconds")
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--blocks", type=int, default=7)
    args = ap.parse_args(argv)
    steps, blocks = (500, 2) if args.smoke else (args.steps, args.blocks)
    per_step(steps, blocks)
    step_count_call(2000 if args.smoke else 200000)
    print("the FLOP-counted step (count_flops, once per run):")
    flop_count_step(args.smoke)


if __name__ == "__main__":
    main()
