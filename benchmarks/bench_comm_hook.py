"""What timing DDP's gradient all-reduce costs: ``otel_train.instrument_ddp`` against no hook.

Two figures, in one invocation:

1. **the hook's own work**, in one process, no process group: the timed hook (a timestamp
   and an append at hand-over, a done-callback registered on the future) around an inner
   hook that returns a pending future, against that inner hook alone: CPU ns per bucket
   (``time.thread_time``); and the span worker's CPU to sum a step's bucket.
2. **paired DDP steps**: two gloo ranks on CPU (this script starts them), each holding two
   copies of the same MLP under DDP (small buckets: several all-reduces per step), one left
   as DDP makes it (the built-in C++ all-reduce, no Python hook), one through
   ``instrument_ddp``. Rounds alternate the two (order flipped every round) inside one run,
   so drift hits both alike; rank 0 prints each one's median step time and the paired ratio.
   Registering any Python comm hook moves the all-reduce from C++ to a Python call per
   bucket; that is part of what is measured.

No assertions: figures to read. Paired timings need a quiet machine.

Usage::

    python benchmarks/bench_comm_hook.py --rounds 10 --steps 200
    python benchmarks/bench_comm_hook.py --rounds 2 --steps 10     # smoke
    python benchmarks/bench_comm_hook.py --calls 2000 --skip-ddp   # the hook's own work only
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
import timeit

import torch


def hook_cpu_ns(calls: int) -> dict[str, float]:
    """CPU ns (``time.thread_time``, best of 5) of: the inner hook alone, the timed hook
    around it (the inner hook returns a pending future, as a real all-reduce's is), and
    summing one step's bucket in the span worker."""
    from otel_train.integrations.comm import timed_comm_hook
    from otel_train.recording.collectives import KIND_OVERLAPPED, CollectiveLog
    from otel_train.records.comm_summary import comm_summary

    buffer = torch.zeros(1024)
    pending: torch.futures.Future = torch.futures.Future()

    class Bucket:
        def buffer(self) -> torch.Tensor:
            return buffer

    def inner(state: object, bucket: Bucket) -> torch.futures.Future:
        bucket.buffer()
        return pending

    def cpu_ns(fn: object, number: int) -> float:
        timer = timeit.Timer(fn, timer=time.thread_time)  # type: ignore[arg-type]
        return min(timer.repeat(number=number, repeat=5)) / number * 1e9

    timed = timed_comm_hook(inner, CollectiveLog(max_entries=calls * 6), "all_reduce")
    bucket = Bucket()
    entries = [["all_reduce", 4096, 100, 200, KIND_OVERLAPPED]]
    bounds = [0, 50, 50, 210, 210, 300]
    figures = {"inner": cpu_ns(lambda: inner(None, bucket), calls),
               "timed": cpu_ns(lambda: timed(None, bucket), calls),
               "summary": cpu_ns(lambda: comm_summary(entries, 400, 0, bounds), calls)}
    return figures


def rank_main(args: argparse.Namespace) -> None:
    """One rank: alternate the plain and the timed DDP model, rank 0 prints."""
    import torch.distributed as dist
    from torch import nn

    import otel_train

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def mlp() -> nn.Module:
        torch.manual_seed(0)
        layers: list[nn.Module] = []
        for _ in range(6):
            layers += [nn.Linear(128, 128), nn.ReLU()]
        # 0.05 MB buckets: ~6 all-reduces per step, as a large model has many
        return nn.parallel.DistributedDataParallel(nn.Sequential(*layers), bucket_cap_mb=0.05)

    plain, timed = mlp(), mlp()
    x = torch.randn(32, 128)
    times: dict[str, list[float]] = {"no hook": [], "instrument_ddp": []}
    with otel_train.start_run(exporter="none", prometheus_port=None, console=False,
                              run_id="bench-comm") as run:
        otel_train.instrument_ddp(timed, run)
        for r in range(args.rounds):
            order = [("no hook", plain), ("instrument_ddp", timed)]
            for name, model in order if r % 2 == 0 else order[::-1]:
                start = time.perf_counter()
                for step in run.steps(range(args.steps)):
                    with step.phase("forward"):
                        loss = model(x).square().mean()
                    with step.phase("backward"):
                        loss.backward()
                    model.zero_grad(set_to_none=True)
                times[name].append((time.perf_counter() - start) / args.steps)
    dist.destroy_process_group()
    if rank != 0:
        return
    med = {name: statistics.median(v) for name, v in times.items()}
    pairs = [t / p for t, p in zip(times["instrument_ddp"], times["no hook"])]
    print(f"DDP, 2 gloo ranks, {args.rounds} rounds x {args.steps} steps (rank 0):")
    for name, value in med.items():
        print(f"  {name:<15} {value * 1e6:9.1f} us/step")
    print(f"  paired instrument_ddp / no hook: {statistics.median(pairs):.3f} "
          f"[{min(pairs):.3f} .. {max(pairs):.3f}]")


def main() -> None:
    """The micro figure here, then the paired DDP figure from two rank processes."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--skip-ddp", action="store_true", help="the hook's own work only")
    args = parser.parse_args()
    if "RANK" in os.environ:
        rank_main(args)
        return
    cpu = hook_cpu_ns(args.calls)
    print(f"hook per bucket, CPU: inner alone {cpu['inner']:.0f} ns, timed "
          f"{cpu['timed']:.0f} ns, added {cpu['timed'] - cpu['inner']:.0f} ns; "
          f"a step's summary in the span worker {cpu['summary']:.0f} ns")
    if args.skip_ddp:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [subprocess.Popen(
        [sys.executable, __file__, "--rounds", str(args.rounds), "--steps", str(args.steps)],
        env=dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank),
                 WORLD_SIZE="2", LOCAL_RANK=str(rank), OMP_NUM_THREADS="1"))
        for rank in range(2)]
    sys.exit(max(p.wait() for p in procs))


if __name__ == "__main__":
    main()
