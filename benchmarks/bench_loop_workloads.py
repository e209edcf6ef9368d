"""The workloads and loops of bench_training_loop.py, shared by the benches built on them.

``mlp``: a small MLP (~1 ms per step); ``gpt``: the demo's tiny GPT
(``otel_train.cli.demo.build_model``; ~5-15 ms per step). Each step takes a batch from a
``DataLoader``, runs forward, backward and the optimizer; every ``eval_every`` steps an eval
(validation loss over a few batches) runs as monitoring. The loops run ``n`` steps bare, in
an otel-train run (``run.steps`` + phases), under any span-per-phase API, or under traceml.

Usage::

    w = Workload("mlp", eval_every=50)
    loop_bare(w, 100); loop_otel(w, 100, run)
"""

from __future__ import annotations

import time
from typing import Any


class Workload:
    """Model, optimizer, DataLoader, validation batches and one global step counter."""

    def __init__(self, name: str, eval_every: int) -> None:
        import torch
        from torch import nn

        torch.manual_seed(0)
        self.name = name
        self.eval_every = eval_every
        self.k = 0
        if name == "gpt":
            from otel_train.cli.demo import _corpus, build_model

            text = _corpus()
            chars = sorted(set(text))
            data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
            block = 32
            starts = torch.arange(0, len(data) - block - 1, 3)
            xs = torch.stack([data[i:i + block] for i in starts])
            ys = torch.stack([data[i + 1:i + 1 + block] for i in starts])
            self.model = build_model(len(chars), block_size=block)
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-3)
            batch = 8

            def forward(x: Any, y: Any) -> Any:
                return self.model(x, y)[1]
        else:
            xs = torch.randn(8192, 128)
            ys = torch.randint(10, (8192,))
            self.model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256),
                                       nn.ReLU(), nn.Linear(256, 10))
            self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
            batch = 32
            loss_fn = nn.functional.cross_entropy

            def forward(x: Any, y: Any) -> Any:
                return loss_fn(self.model(x), y)
        self.forward = forward
        dataset = torch.utils.data.TensorDataset(xs, ys)
        self.loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True,
                                                  drop_last=True)
        self.val = [(xs[i * batch:(i + 1) * batch], ys[i * batch:(i + 1) * batch])
                    for i in range(4)]

    def batches(self, n: int) -> Any:
        """A fresh DataLoader iterator (one per block, in every variant), cycling."""
        it = iter(self.loader)
        for _ in range(n):
            try:
                yield next(it)
            except StopIteration:
                it = iter(self.loader)
                yield next(it)

    def evaluate(self) -> None:
        """Validation loss over the held batches (the monitoring work)."""
        import torch

        self.model.eval()
        with torch.no_grad():
            for vx, vy in self.val:
                self.forward(vx, vy).item()
        self.model.train()


def loop_bare(w: Workload, n: int) -> None:
    """The user's loop, nothing added."""
    forward, opt = w.forward, w.opt
    for x, y in w.batches(n):
        loss = forward(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        w.k += 1
        if w.k % w.eval_every == 0:
            w.evaluate()


def loop_otel(w: Workload, n: int, run: Any) -> None:
    """The README's loop: run.steps (data phase) + forward/backward/optimizer + monitor."""
    forward, opt = w.forward, w.opt
    for step in run.steps(w.batches(n), loader="train"):
        x, y = step.batch
        with step.phase("forward"):
            loss = forward(x, y)
        with step.phase("backward"):
            loss.backward()
        with step.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        w.k += 1
        if w.k % w.eval_every == 0:
            with step.monitor("val_loss"):
                w.evaluate()


def loop_spans(w: Workload, n: int, span: Any) -> None:
    """Same loop, ``span(name)`` around the step and each phase (SDK or record_function)."""
    forward, opt = w.forward, w.opt
    it = w.batches(n)
    for _ in range(n):
        with span("train.step"):
            with span("data"):
                x, y = next(it)
            with span("forward"):
                loss = forward(x, y)
            with span("backward"):
                loss.backward()
            with span("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            w.k += 1
            if w.k % w.eval_every == 0:
                with span("val_loss"):
                    w.evaluate()


class _TimestampTimer:
    """The floor: an empty context manager that takes two timestamps (keeps nothing)."""

    __slots__ = ("t",)

    def __enter__(self, _clock: Any = time.perf_counter_ns) -> _TimestampTimer:
        self.t = _clock()
        return self

    def __exit__(self, *exc: object, _clock: Any = time.perf_counter_ns) -> None:
        _clock()


class _Timers(dict):  # type: ignore[type-arg]
    """name -> a reusable timer, found by a C-level lookup (as otel-train's phases are)."""

    def __missing__(self, name: str) -> _TimestampTimer:
        timer = self[name] = _TimestampTimer()
        return timer


def loop_traceml(w: Workload, n: int, traceml: Any) -> None:
    """traceml's documented plain-PyTorch loop: trace_step around each step."""
    forward, opt = w.forward, w.opt
    for x, y in w.batches(n):
        with traceml.trace_step(w.model):
            loss = forward(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        w.k += 1
        if w.k % w.eval_every == 0:
            w.evaluate()
