"""A plain training loop on a tiny GPT, traced with the explicit API.

Each step is a ``train.step`` trace with ``data``, ``forward``, ``backward`` and
``optimizer`` phases; every ``--eval-every`` steps the step also runs the monitoring that
most often eats a run's time: ``inference`` (sampling text) and ``val_loss`` (a validation
pass, its fetches as ``data`` spans of loader ``val``). Runs in seconds on a CPU; ``--device``
(auto: the accelerator when present) chooses where, and the start-up line says which.

Usage::

    python examples/tiny_gpt.py --steps 50 --eval-every 10
    python examples/tiny_gpt.py --device cpu
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 python examples/tiny_gpt.py   # OTLP/HTTP
    OTEL_EXPORTER_OTLP_PROTOCOL=grpc OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 \\
        python examples/tiny_gpt.py                                                 # OTLP/gRPC
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn
from torch.nn import functional as F

import otel_train
from otel_train.common.training_device import add_device_argument, device_from_arguments

TEXT = ("to be or not to be that is the question whether tis nobler in the mind to suffer "
        "the slings and arrows of outrageous fortune or to take arms against a sea of troubles ")


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and an MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A character-level GPT small enough to train on a CPU in seconds."""

    def __init__(self, vocab: int, dim: int = 32, heads: int = 2, layers: int = 2,
                 context: int = 32) -> None:
        super().__init__()
        self.context = context
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(layers)])
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None
                ) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        logits = self.head(self.blocks(self.tok(idx) + self.pos(pos)))
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """Sample ``new_tokens`` characters after ``idx``."""
        for _ in range(new_tokens):
            logits = self(idx[:, -self.context:])[:, -1]
            idx = torch.cat([idx, torch.multinomial(F.softmax(logits, -1), 1)], dim=1)
        return idx


def make_loaders(context: int, batch: int) -> tuple[list[str], torch.utils.data.DataLoader,
                                                    torch.utils.data.DataLoader]:
    """Character vocabulary, and train/val loaders of (input, target) windows."""
    chars = sorted(set(TEXT))
    data = torch.tensor([chars.index(c) for c in TEXT * 8])
    windows = data.unfold(0, context + 1, 3)
    split = int(len(windows) * 0.9)
    ds = torch.utils.data.TensorDataset(windows[:, :-1], windows[:, 1:])
    train = torch.utils.data.Subset(ds, range(split))
    val = torch.utils.data.Subset(ds, range(split, len(windows)))
    return (chars,
            torch.utils.data.DataLoader(train, batch_size=batch, shuffle=True, drop_last=True),
            torch.utils.data.DataLoader(val, batch_size=batch))


def main(argv: list[str] | None = None) -> None:
    """Train for ``--steps`` steps, monitoring every ``--eval-every``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=20)
    add_device_argument(parser)
    args = parser.parse_args(argv)
    device = device_from_arguments(parser, args)
    print(f"tiny_gpt: training on {device.type} (--device {args.device})", flush=True)
    os.environ.setdefault("OTEL_TRAIN_SERVICE_NAME", "tiny-gpt")
    torch.manual_seed(0)
    chars, train_loader, val_loader = make_loaders(context=32, batch=8)
    model = TinyGPT(len(chars)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def forever():  # epochs until --steps; the copy to the device is part of the fetch
        while True:
            for x, y in train_loader:
                yield x.to(device), y.to(device)

    with otel_train.start_run() as run:
        batches = (b for _, b in zip(range(args.steps), forever()))
        for step in run.steps(batches, loader="train"):
            x, y = step.batch
            with step.phase("forward"):
                loss = model(x, y)
            with step.phase("backward"):
                loss.backward()
            with step.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            step.set_attribute("train.loss", loss)
            if step.index % args.eval_every == 0:
                model.eval()
                with step.monitor("inference"):
                    sample = model.generate(x[:1, :8], new_tokens=16)
                with step.monitor("val_loss"), torch.no_grad():
                    val = [model(vx.to(device), vy.to(device))
                           for vx, vy in step.iter_data(val_loader, loader="val")]
                model.train()
                text = "".join(chars[i] for i in sample[0].tolist())
                print(f"step {step.index}: loss {loss.item():.3f} "
                      f"val {torch.stack(val).mean().item():.3f} sample {text!r}")
        costs = run.costs()
        print(f"monitoring: {costs.get('total_percentage', 0.0):.1f}% of training time "
              f"({costs.get('budget_status')})")


if __name__ == "__main__":
    main()
