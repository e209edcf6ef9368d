"""Several named dataloaders interleaved in one loop.

Two training sources, ``main`` and ``aux`` (aux with slow preprocessing and longer
sequences), are drawn by a weighted schedule; every step's spans carry its source as
``train.dataloader``, so per-loader data/forward/backward/optimizer times sit side by side
(``otel_train_phase_duration_seconds{loader="aux"}``). Validation runs each loader's own
validation set inside one ``val_loss`` monitoring phase, fetches tagged ``val_main`` /
``val_aux``. ``--device`` (auto: the accelerator when present) chooses where it trains.

Usage::

    python examples/multi_dataloader.py --steps 40 --aux-weight 0.3
    python examples/multi_dataloader.py --device cpu
"""

from __future__ import annotations

import argparse
import os
import random
import time

import torch
from torch import nn

import otel_train
from otel_train.common.training_device import add_device_argument, device_from_arguments


class SlowDataset(torch.utils.data.Dataset):
    """Sequences of ``length`` features; ``delay`` seconds of 'preprocessing' per item."""

    def __init__(self, n: int, length: int, delay: float, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, length, 16, generator=g)
        self.y = self.x.mean(dim=(1, 2)).unsqueeze(1)
        self.delay = delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay:
            time.sleep(self.delay)
        return self.x[i], self.y[i]


class Pooled(nn.Module):
    """Mean-pooled MLP over a sequence: cost grows with sequence length."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
        self.out = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.mlp(x).mean(dim=1))


def cycle(loader: torch.utils.data.DataLoader):
    """Iterate a loader forever (new epochs as needed)."""
    while True:
        yield from loader


def main(argv: list[str] | None = None) -> None:
    """Train ``--steps`` steps drawing from ``main`` and ``aux`` by weight."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--aux-weight", type=float, default=0.3)
    parser.add_argument("--eval-every", type=int, default=20)
    add_device_argument(parser)
    args = parser.parse_args(argv)
    device = device_from_arguments(parser, args)
    print(f"multi_dataloader: training on {device.type} (--device {args.device})", flush=True)
    os.environ.setdefault("OTEL_TRAIN_SERVICE_NAME", "multi-dataloader")
    torch.manual_seed(0)
    rng = random.Random(0)
    train = {"main": torch.utils.data.DataLoader(SlowDataset(256, 8, 0.0, 0), batch_size=16),
             "aux": torch.utils.data.DataLoader(SlowDataset(256, 32, 0.0005, 1), batch_size=16)}
    val = {"val_main": torch.utils.data.DataLoader(SlowDataset(32, 8, 0.0, 2), batch_size=16),
           "val_aux": torch.utils.data.DataLoader(SlowDataset(32, 32, 0.0, 3), batch_size=16)}
    sources = {name: cycle(dl) for name, dl in train.items()}
    model = Pooled().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    seen = {name: 0 for name in train}
    with otel_train.start_run() as run:
        for i in range(args.steps):
            name = "aux" if rng.random() < args.aux_weight else "main"
            seen[name] += 1
            with run.step(loader=name) as step:
                with step.phase("data"):
                    x, y = next(sources[name])
                    x, y = x.to(device), y.to(device)
                with step.phase("forward"):
                    loss = nn.functional.mse_loss(model(x), y)
                with step.phase("backward"):
                    loss.backward()
                with step.phase("optimizer"):
                    opt.step()
                    opt.zero_grad()
                step.set_attribute("train.loss", loss)
                if i % args.eval_every == args.eval_every - 1:
                    with step.monitor("val_loss"), torch.no_grad():
                        for vname, vl in val.items():
                            for vx, vy in step.iter_data(vl, loader=vname):
                                nn.functional.mse_loss(model(vx.to(device)), vy.to(device))
        print(f"steps per loader: {seen} (realized aux share "
              f"{seen['aux'] / max(1, args.steps):.2f} for weight {args.aux_weight})")


if __name__ == "__main__":
    main()
