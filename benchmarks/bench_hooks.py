"""Cost per step of hook-based instrumentation beside the explicit API, in one run.

Four variants of the same CPU training loop (a 12-module MLP, batch 32), interleaved round
by round so machine drift hits them alike: the bare loop, the explicit API
(``run.steps`` + ``step.phase``), ``otel_train.instrument(model, opt, dataloader)`` (per-model
hooks), and ``TorchTrainingInstrumentor`` (global hooks: every module call pays one early
return). Prints the median step time of each and its cost over the bare loop, in wall time
and in the training thread's CPU time. No assertions: figures to read.

Usage::

    python benchmarks/bench_hooks.py --steps 500 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from torch import nn

import otel_train
from otel_train.integrations import instrument
from otel_train.integrations.instrumentor import TorchTrainingInstrumentor

OPTIONS = dict(exporter="none", prometheus_port=None, console=False)


def make() -> tuple[nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader]:
    """Model, optimizer, loader (fresh per variant, same seed)."""
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(6):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ds = torch.utils.data.TensorDataset(torch.randn(4096, 64), torch.randn(4096, 64))
    return model, opt, torch.utils.data.DataLoader(ds, batch_size=32)


def bare_steps(model: nn.Module, opt: torch.optim.Optimizer, loader, steps: int) -> None:
    """The user's loop, no otel-train."""
    done = 0
    while done < steps:
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
            if done == steps:
                return


def explicit_steps(run: otel_train.Run, model: nn.Module, opt: torch.optim.Optimizer, loader,
                   steps: int) -> None:
    """The same loop written with the explicit API."""
    def batches():
        while True:
            yield from loader
    for step in run.steps((b for _, b in zip(range(steps), batches())), loader="train"):
        x, y = step.batch
        with step.phase("forward"):
            loss = nn.functional.mse_loss(model(x), y)
        with step.phase("backward"):
            opt.zero_grad()
            loss.backward()
        with step.phase("optimizer"):
            opt.step()


def timed(fn: Callable[[], None], steps: int) -> tuple[float, float]:
    """(wall seconds per step, training-thread CPU seconds per step)."""
    w0, c0 = time.perf_counter(), time.thread_time()
    fn()
    return (time.perf_counter() - w0) / steps, (time.thread_time() - c0) / steps


def main(argv: list[str] | None = None) -> None:
    """Run the variants round-robin and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    n = args.steps
    results: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        run = otel_train.start_run(status_dir=tmp, **OPTIONS)

        def bare() -> None:
            bare_steps(*make(), n)

        def explicit() -> None:
            explicit_steps(run, *make(), n)

        def hooks() -> None:
            model, opt, loader = make()
            with instrument(model, opt, dataloader=loader, run=run):
                bare_steps(model, opt, loader, n)

        def instrumentor() -> None:
            model, opt, loader = make()
            inst = TorchTrainingInstrumentor()
            inst.instrument(run_options=dict(status_dir=tmp, **OPTIONS))
            try:
                bare_steps(model, opt, loader, n)
            finally:
                inst.uninstrument()

        variants = {"bare loop": bare, "explicit API": explicit,
                    "instrument() hooks": hooks, "instrumentor (global)": instrumentor}
        for fn in variants.values():  # warm-up
            fn()
        for _ in range(args.rounds):
            for name, fn in variants.items():
                results.setdefault(name, []).append(timed(fn, n))
                run.flush()
        run.shutdown()
    base_w = statistics.median(w for w, _ in results["bare loop"])
    base_c = statistics.median(c for _, c in results["bare loop"])
    print(f"{args.rounds} rounds x {n} steps, 12-module MLP, batch 32, 1 torch thread, CPU")
    print(f"{'variant':<24}{'step (us)':>11}{'+wall (us)':>12}{'+wall %':>9}"
          f"{'+cpu (us)':>11}")
    for name, rows in results.items():
        w = statistics.median(r[0] for r in rows)
        c = statistics.median(r[1] for r in rows)
        print(f"{name:<24}{w * 1e6:>11.1f}{(w - base_w) * 1e6:>12.1f}"
              f"{(w - base_w) / base_w * 100:>8.1f}%{(c - base_c) * 1e6:>11.1f}")


if __name__ == "__main__":
    main()
