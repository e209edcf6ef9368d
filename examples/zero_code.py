"""An unmodified training loop: it imports nothing from otel-train.

Run it under OpenTelemetry's auto-instrumentation and every step becomes a ``train.step``
trace (data, forward, backward, optimizer), the evaluation block an ``eval`` monitoring
span, via ``TorchTrainingInstrumentor`` (entry point ``opentelemetry_instrumentor``:
``otel_train``). Options come from ``OTEL_TRAIN_*`` and the standard ``OTEL_*`` variables.

Usage::

    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 \\
        opentelemetry-instrument python examples/zero_code.py --steps 20
    OTEL_TRAIN_EXPORTER=jsonl opentelemetry-instrument python examples/zero_code.py
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


def main(argv: list[str] | None = None) -> None:
    """Train ``--steps`` steps of a small classifier, evaluating every ``--eval-every``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=10)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    x = torch.randn(512, 20)
    y = (x[:, :5].sum(1) > 0).long()
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:448], y[:448]),
                                        batch_size=16, shuffle=True)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[448:], y[448:]),
                                      batch_size=32)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    step = 0
    while step < args.steps:
        for xb, yb in train:
            loss = loss_fn(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % args.eval_every == 0:
                model.eval()
                with torch.no_grad():
                    correct = sum((model(vx).argmax(1) == vy).sum().item() for vx, vy in val)
                model.train()
                print(f"step {step}: loss {loss.item():.3f} val acc {correct / 64:.2f}")
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
