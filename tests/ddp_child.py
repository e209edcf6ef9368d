"""One rank of a tiny DDP job (gloo, CPU) with its collectives timed; started by ddp_support.

Each step's forward runs ``--work`` 128x128 matmuls (``--extra-work`` times more on rank
``--slow-rank``: a rank with more compute, as a straggler has), then the model; backward
all-reduces the gradients through DDP (timed by ``otel_train.instrument_ddp``). With
``--explicit`` each step also averages the loss with a blocking ``dist.all_reduce`` under
``otel_train.instrument_collectives``; ``--fsdp`` shards the model with FSDP2's
``fully_shard`` instead of DDP, its collectives timed by ``instrument_collectives``.
``--steps 0`` steps until the process is ended.
Options of the run come from ``OTEL_TRAIN_*``; ``--metrics-file`` gets the final scrape.
"""

from __future__ import annotations

import argparse
import json
import urllib.request
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import otel_train


def main() -> None:
    """Train the steps of this rank."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--work", type=int, default=40)
    parser.add_argument("--extra-work", type=float, default=0.0)
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--explicit", action="store_true")
    parser.add_argument("--metrics-file", default=None)
    parser.add_argument("--fsdp", action="store_true", help="fully_shard, not DDP")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    if args.fsdp:  # FSDP2: its all-gathers and reduce-scatters go through torch.distributed
        from torch.distributed.fsdp import fully_shard

        for layer in (net[0], net[2]):
            fully_shard(layer)
        model: nn.Module = fully_shard(net)
    else:
        model = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    work = round(args.work * (1 + args.extra_work)) if rank == args.slow_rank else args.work
    a = torch.randn(128, 128)
    x, y = torch.randn(16, 32), torch.randn(16, 1)
    with otel_train.start_run(prometheus_port=0) as run:
        if not args.fsdp:
            otel_train.instrument_ddp(model, run)
        explicit = (otel_train.instrument_collectives(run) if args.explicit or args.fsdp
                    else None)
        print(json.dumps({"rank": rank, "prometheus_url": run.prometheus_url}), flush=True)
        batches = range(args.steps) if args.steps else iter(int, 1)  # 0: until ended
        for step in run.steps(batches):
            with step.phase("forward"):
                b = a
                for _ in range(work):
                    b = torch.tanh(a @ b)
                loss = nn.functional.mse_loss(model(x), y) + 0 * b.mean()
            with step.phase("backward"):
                loss.backward()
            with step.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            if args.explicit:
                with step.phase("loss_sync"):
                    dist.all_reduce(loss.detach().clone())
        if explicit is not None:
            explicit.remove()
        run.flush()
        if args.metrics_file:
            with urllib.request.urlopen(run.prometheus_url + "/metrics", timeout=10) as resp:
                Path(args.metrics_file.format(rank=rank)).write_bytes(resp.read())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
