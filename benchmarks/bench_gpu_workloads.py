"""The workloads and loops of bench_gpu_default.py: a 168M-parameter GPT and a 4-layer
2048-wide MLP on the accelerator found, bf16 autocast and fused AdamW, with ``val_loss`` and
``inference`` monitoring every 10 steps; the bare loop, the hand-synced truth, and the
otel-train loop.

Usage::

    device = Device(); w = Workload("gpt", device, smoke=False)
    loop_bare(w, 30); device.synchronize()
    loop_otel(w, 30, run, loss_attribute=True)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

EVAL_EVERY = 10
DECODE_STEPS = 8


# -- the device ---------------------------------------------------------------------------

class Device:
    """The device found, and its synchronize (a no-op on the CPU, where nothing is queued)."""

    def __init__(self) -> None:
        import torch

        from otel_train.common.training_device import accelerator_device

        self.torch_device = accelerator_device(torch) or torch.device("cpu")
        self.type = self.torch_device.type
        if self.type == "cuda":
            self._synchronize = torch.cuda.synchronize
            self.name = torch.cuda.get_device_name()
        elif self.type != "cpu":
            self._synchronize = torch.accelerator.synchronize
            self.name = self.type
        else:
            self._synchronize = None
            self.name = "cpu"

    def synchronize(self) -> None:
        """Wait for the device's queue to drain (the CPU has none)."""
        if self._synchronize is not None:
            self._synchronize()


# -- the workloads --------------------------------------------------------------------------

def _gpt_model(vocab: int, width: int, layers: int, heads: int, seq: int) -> Any:
    """A decoder-only transformer: pre-norm blocks, causal SDPA attention, GELU MLP."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x: Any) -> Any:
            b, t, d = x.shape
            qkv = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            att = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)

        def forward(self, idx: Any) -> Any:
            pos = torch.arange(idx.shape[1], device=idx.device)
            return self.head(self.norm(self.blocks(self.tok(idx) + self.pos(pos))))

    return GPT()


class Workload:
    """Model, fused AdamW, device-resident batches, the held batch, one global step count."""

    def __init__(self, name: str, device: Device, smoke: bool) -> None:
        import torch
        from torch import nn

        torch.manual_seed(0)
        dev = device.torch_device
        self.name = name
        self.k = 0  # global step count: every block holds the same monitoring calls
        self.eval_every = 5 if smoke else EVAL_EVERY
        if name == "gpt":
            vocab, width, layers, heads, seq, batch = (
                (128, 64, 2, 2, 32, 2) if smoke else (32768, 1024, 8, 16, 1024, 8))
            self.model = _gpt_model(vocab, width, layers, heads, seq).to(dev)
            self.size = f"d {width}, {layers} layers, seq {seq}, batch {batch}, vocab {vocab}"
            tokens = torch.randint(vocab, (5, batch, seq + 1), device=dev)
            self.train_batches = [(t[:, :-1], t[:, 1:]) for t in tokens[:4]]
            self.held = (tokens[4][:, :-1], tokens[4][:, 1:])
            self.context = seq
        else:
            width, batch = (64, 16) if smoke else (2048, 256)
            layers: list[Any] = []
            for _ in range(3):
                layers += [nn.Linear(width, width), nn.ReLU()]
            self.model = nn.Sequential(*layers, nn.Linear(width, width)).to(dev)
            self.size = f"4 layers, {width} wide, batch {batch}"
            xs = torch.randn(5, batch, width, device=dev)
            ys = torch.randint(width, (5, batch), device=dev)
            self.train_batches = [(xs[i], ys[i]) for i in range(4)]
            self.held = (xs[4], ys[4])
            self.context = 0
        self.params = sum(p.numel() for p in self.model.parameters())
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)
        self._autocast = lambda: torch.autocast(dev.type, dtype=torch.bfloat16)
        self._no_grad = torch.no_grad
        self._cross_entropy = nn.functional.cross_entropy

    def batches(self, n: int) -> Any:
        """``n`` batches, cycling over the device-resident ones."""
        for i in range(n):
            yield self.train_batches[i % len(self.train_batches)]

    def loss(self, x: Any, y: Any) -> Any:
        """The training loss (bf16 autocast; cross-entropy in float32, as autocast does)."""
        with self._autocast():
            out = self.model(x)
            return self._cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    def val_loss(self) -> float:
        """Monitoring: one forward on the held batch, read with ``.item()``."""
        with self._no_grad():
            return self.loss(*self.held).item()

    def inference(self) -> list[Any]:
        """Monitoring: 8 greedy decode steps over the held batch, read with ``.tolist()``."""
        import torch

        x = self.held[0]
        with self._no_grad(), self._autocast():
            for _ in range(DECODE_STEPS):
                if self.context:  # the GPT: the next token from the last position
                    nxt = self.model(x[:, -self.context:])[:, -1].argmax(-1, keepdim=True)
                    x = torch.cat([x, nxt], dim=1)
                else:  # the MLP: its output is the next input
                    x = self.model(x).float()
        return (x[:, -DECODE_STEPS:] if self.context else x.argmax(-1)).tolist()

    def train_step(self, x: Any, y: Any) -> Any:
        loss = self.loss(x, y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss


# -- the loops ------------------------------------------------------------------------------

def loop_bare(w: Workload, n: int) -> None:
    """The user's loop, nothing added."""
    for x, y in w.batches(n):
        w.train_step(x, y)
        w.k += 1
        if w.k % w.eval_every == 0:
            w.val_loss()
            w.inference()


def loop_truth(w: Workload, n: int, device: Device, monitoring_ns: list[int]) -> None:
    """The bare loop, each monitoring call between two synchronizes and timed: the device
    time of the monitoring itself, nothing queued before it (``monitoring_ns[0]`` adds up)."""
    clock = time.perf_counter_ns
    for x, y in w.batches(n):
        w.train_step(x, y)
        w.k += 1
        if w.k % w.eval_every == 0:
            device.synchronize()  # the training work queued so far is training's
            t0 = clock()
            w.val_loss()
            device.synchronize()
            t1 = clock()
            w.inference()
            device.synchronize()
            monitoring_ns[0] += t1 - t0 + clock() - t1


def loop_otel(w: Workload, n: int, run: Any, loss_attribute: bool) -> None:
    """The README's loop: run.steps (data) + forward/backward/optimizer + the monitoring."""
    model_loss, opt = w.loss, w.opt
    for step in run.steps(w.batches(n), loader="train"):
        x, y = step.batch
        with step.phase("forward"):
            loss = model_loss(x, y)
        with step.phase("backward"):
            loss.backward()
        with step.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        if loss_attribute:
            step.set_attribute("train.loss", loss)  # the tensor: the run reads it
        w.k += 1
        if w.k % w.eval_every == 0:
            with step.monitor("val_loss"):
                w.val_loss()
            with step.monitor("inference"):
                w.inference()
