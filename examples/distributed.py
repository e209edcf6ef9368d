"""A 2-rank data-parallel run (torch.distributed): one trace per step, all ranks.

Every rank exports its spans with its own ``train.rank``; the trace id of step N is derived
from the shared run id (torchrun's ``TORCHELASTIC_RUN_ID``), so one trace shows step N of
every rank side by side. Each rank serves its own Prometheus endpoint (``--metrics-port``
+ local rank, or a free port with 0). ``--slow-rank R`` sleeps in rank R's forward, and the
straggler shows in ``otel_train_phase_duration_seconds{phase="forward",rank="R"}``; the
other ranks wait for it in backward's gradient all-reduce (``otel_train.instrument_ddp``
times it: ``train.comm.*`` on each step, ``otel_train_own_work_seconds_total`` per rank).

``--device auto`` (the default) puts each rank on its own GPU (``cuda:<local rank>``, NCCL)
when there is one GPU per local rank, else on the CPU (gloo); ``--device cpu`` / ``cuda``
choose (``cuda`` without a GPU per local rank is refused). Each rank says which at start.

Usage::

    torchrun --nproc_per_node 2 examples/distributed.py --steps 20 --slow-rank 1
    torchrun --nproc_per_node 2 examples/distributed.py --device cpu
    # each rank writes its final /metrics scrape with --metrics-dir DIR (rank<N>.prom)
"""

from __future__ import annotations

import argparse
import os
import time
import urllib.request
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import otel_train
from otel_train.common.training_device import add_device_argument, device_from_arguments


def main(argv: list[str] | None = None) -> None:
    """Train ``--steps`` DDP steps on every rank of the torchrun job."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-seconds", type=float, default=0.05)
    parser.add_argument("--metrics-port", type=int, default=0)
    parser.add_argument("--metrics-dir", default=None)
    add_device_argument(parser)
    args = parser.parse_args(argv)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = _rank_device(parser, args, local_rank)
    os.environ.setdefault("OTEL_TRAIN_SERVICE_NAME", "ddp-tiny")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank()
    print(f"rank {rank}: training on {device} (--device {args.device})", flush=True)
    torch.manual_seed(rank)
    net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    model = nn.parallel.DistributedDataParallel(
        net, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ds = torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
    sampler = torch.utils.data.distributed.DistributedSampler(ds, shuffle=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=8, sampler=sampler)
    port = args.metrics_port + local_rank if args.metrics_port else 0
    run = otel_train.start_run(prometheus_port=port)
    otel_train.instrument_ddp(model, run)  # times the gradient all-reduce per step
    try:
        batches = (b for _, b in zip(range(args.steps), _forever(loader)))
        for step in run.steps(batches, loader="train"):
            x, y = (t.to(device) for t in step.batch)
            with step.phase("forward"):
                if rank == args.slow_rank:
                    time.sleep(args.slow_seconds)  # the straggler
                loss = nn.functional.mse_loss(model(x), y)
            with step.phase("backward"):
                loss.backward()  # DDP all-reduces gradients here: fast ranks wait
            with step.phase("optimizer"):
                opt.step()
                opt.zero_grad()
        run.flush()
        if args.metrics_dir and run.prometheus_url:
            with urllib.request.urlopen(run.prometheus_url + "/metrics", timeout=5) as resp:
                Path(args.metrics_dir, f"rank{rank}.prom").write_bytes(resp.read())
        print(f"rank {rank}: run {run.run_id}, metrics {run.prometheus_url}")
    finally:
        run.shutdown()
        dist.destroy_process_group()


def _rank_device(parser: argparse.ArgumentParser, args: argparse.Namespace,
                 local_rank: int) -> torch.device:
    """This rank's device: its own GPU (``cuda:<local rank>``) when every local rank has one,
    else the CPU; every rank decides alike, so they all pick the same backend."""
    device = device_from_arguments(parser, args)
    if device.type != "cuda":
        return torch.device("cpu")  # other accelerators: this example's backends are gloo/NCCL
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if local_ranks <= torch.cuda.device_count():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    if args.device == "cuda":
        parser.error(f"--device cuda: {local_ranks} local ranks, {torch.cuda.device_count()} "
                     "GPUs visible (one per rank needed); use --device cpu")
    return torch.device("cpu")  # auto: fewer GPUs than local ranks


def _forever(loader: torch.utils.data.DataLoader):
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


if __name__ == "__main__":
    main()
