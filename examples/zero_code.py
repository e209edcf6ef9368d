"""An unmodified training loop: it imports nothing from otel-train.

Run it under OpenTelemetry's auto-instrumentation and every step becomes a ``train.step``
trace (data, forward, backward, optimizer), the evaluation block an ``eval`` monitoring
span, via ``TorchTrainingInstrumentor`` (entry point ``opentelemetry_instrumentor``:
``otel_train``). Options come from ``OTEL_TRAIN_*`` and the standard ``OTEL_*`` variables.
``--device`` (auto: the accelerator when present) chooses where it trains.

Usage::

    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 \\
        opentelemetry-instrument python examples/zero_code.py --steps 20
    OTEL_TRAIN_EXPORTER=jsonl opentelemetry-instrument python examples/zero_code.py
    opentelemetry-instrument python examples/zero_code.py --device cpu
"""

from __future__ import annotations

import argparse

import torch
from torch import nn


def pick_device(parser: argparse.ArgumentParser, choice: str) -> torch.device:
    """auto: the accelerator when present, else the CPU; cuda where none is: refused."""
    if choice == "cpu":
        return torch.device("cpu")
    if choice == "cuda":
        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA device is available here "
                         "(torch.cuda.is_available() is False); use --device auto or --device cpu")
        return torch.device("cuda")
    if torch.accelerator.is_available():
        return torch.device(torch.accelerator.current_accelerator())
    return torch.device("cpu")


def main(argv: list[str] | None = None) -> None:
    """Train ``--steps`` steps of a small classifier, evaluating every ``--eval-every``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto (the accelerator when present, else the CPU), cpu or cuda")
    args = parser.parse_args(argv)
    device = pick_device(parser, args.device)
    print(f"zero_code: training on {device.type} (--device {args.device})", flush=True)
    torch.manual_seed(0)
    x = torch.randn(512, 20)
    y = (x[:, :5].sum(1) > 0).long()
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:448], y[:448]),
                                        batch_size=16, shuffle=True)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[448:], y[448:]),
                                      batch_size=32)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    step = 0
    while step < args.steps:
        for xb, yb in train:
            xb, yb = xb.to(device), yb.to(device)
            loss = loss_fn(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step % args.eval_every == 0:
                model.eval()
                with torch.no_grad():
                    correct = sum((model(vx.to(device)).argmax(1) == vy.to(device)).sum().item()
                                  for vx, vy in val)
                model.train()
                print(f"step {step}: loss {loss.item():.3f} val acc {correct / 64:.2f}")
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
