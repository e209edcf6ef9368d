"""Lightning ``Trainer.fit`` on a tiny regression model, traced by a callback.

``LightningStepTraceCallback`` makes every optimizer step a ``train.step`` trace (data,
forward, backward, optimizer; ``micro_step`` children with ``--accumulation`` > 1) and the
validation loop a ``val_loss`` monitoring span per validation dataloader (``clean`` and
``noisy`` here). ``--device auto`` (the default) fits on the accelerator when one is
present; ``--device cpu`` keeps it on the CPU.

With ``--govern`` the run keeps monitoring within its 5% budget by itself
(``budget_action="govern"``): ``val_check_interval`` (batches over the whole fit,
``check_val_every_n_epoch=None``) becomes the asked interval, and a validation made
expensive with ``--val-ms`` (a sleep per validation batch) is stretched to fewer batches,
one console line per change (docs/governor.md).

Usage::

    python examples/lightning_trainer.py --steps 20 --val-every 10
    python examples/lightning_trainer.py --device cpu
    python examples/lightning_trainer.py --steps 600 --val-every 10 --val-ms 20 --govern
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch.nn import functional as F

try:
    import lightning as L
except ImportError as exc:  # the 'lightning' extra is not installed: say which one
    raise SystemExit(f"examples/lightning_trainer.py needs {exc.name or 'lightning'!r} (the "
                     "'lightning' extra): pip install -e '.[lightning]'") from None

from otel_train.common.training_device import add_device_argument, device_from_arguments
from otel_train.integrations.lightning import LightningStepTraceCallback


class Regressor(L.LightningModule):
    """y = w.x + noise, learned by a two-layer MLP."""

    def __init__(self, val_seconds: float = 0.0) -> None:
        super().__init__()
        self.val_seconds = val_seconds
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
                      ) -> torch.Tensor:
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int,
                        dataloader_idx: int = 0) -> None:
        x, y = batch
        if self.val_seconds:
            time.sleep(self.val_seconds)  # --val-ms: an expensive validation
        self.log("val_loss", F.mse_loss(self.net(x), y), add_dataloader_idx=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def loader(n: int, noise: float, seed: int, shuffle: bool = False
           ) -> torch.utils.data.DataLoader:
    """A DataLoader of ``n`` (x, y) pairs."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    y = x.sum(1, keepdim=True) + noise * torch.randn(n, 1, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8,
                                       shuffle=shuffle)


def main(argv: list[str] | None = None) -> None:
    """Fit for ``--steps`` optimizer steps, validating every ``--val-every`` batches."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--val-every", type=int, default=10)
    parser.add_argument("--accumulation", type=int, default=1)
    add_device_argument(parser)
    parser.add_argument("--val-ms", type=float, default=0.0,
                        help="extra milliseconds per validation batch")
    parser.add_argument("--govern", action="store_true",
                        help="budget_action=govern: stretch val_check_interval to stay in "
                        "budget")
    args = parser.parse_args(argv)
    device = device_from_arguments(parser, args)
    print(f"lightning_trainer: training on {device.type} (--device {args.device})", flush=True)
    os.environ.setdefault("OTEL_TRAIN_SERVICE_NAME", "lightning-regressor")
    torch.manual_seed(0)
    trace = LightningStepTraceCallback(val_loader_names=["clean", "noisy"],
                                       budget_action="govern" if args.govern else "report")
    trainer = L.Trainer(
        max_steps=args.steps, accumulate_grad_batches=args.accumulation,
        val_check_interval=args.val_every * args.accumulation, check_val_every_n_epoch=None,
        limit_val_batches=2, num_sanity_val_steps=0, logger=False,
        # Lightning's own names for the device chosen; one device (no strategy to pick)
        accelerator=device.type if device.type in ("cuda", "mps") else "cpu", devices=1,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[trace])
    trainer.fit(Regressor(args.val_ms / 1000), loader(512, 0.1, 0, shuffle=True),
                [loader(32, 0.0, 1), loader(32, 1.0, 2)])
    # The callback's teardown shut its run down when fit() returned (everything exported);
    # what monitoring cost stays readable.
    assert trace.run is not None
    costs = trace.run.costs()
    print(f"steps: {trainer.global_step}, monitoring: "
          f"{costs.get('total_percentage', 0.0):.1f}%")
    for name, op in (costs.get("governing") or {}).get("operations", {}).items():
        print(f"{name}: every {op['interval_steps']} batches (asked {op['asked_every']})")


if __name__ == "__main__":
    main()
