"""Training speed with the collector down or hanging vs no exporter at all, one run.

Each variant runs the same CPU training loop (a small MLP, forward/backward/optimizer plus a
monitoring phase every 10 steps); variants are interleaved and repeated, and the median
trimmed mean step time is compared. Target: collector down / no exporter <= 1.02.

Usage::

    python benchmarks/bench_collector_down.py [--steps 400] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _sick_collector import HangingCollector, closed_port  # noqa: E402


def _loop(steps: int, **options: object) -> float:
    import torch

    import otel_train

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)
    with tempfile.TemporaryDirectory() as tmp, otel_train.start_run(
        prometheus_port=None, console=False, status_dir=tmp, shutdown_timeout_seconds=0.5,
        export_interval_seconds=0.2, **options,
    ) as run:
        times: list[float] = []
        t0 = time.perf_counter()
        for step in run.steps(range(steps)):
            with step.phase("forward"):
                loss = model(x).pow(2).mean()
            with step.phase("backward"):
                loss.backward()
            with step.phase("optimizer"):
                opt.step()
                opt.zero_grad()
            if step.index % 10 == 0:
                with step.monitor("val_loss"):
                    with torch.no_grad():
                        model(x).sum()
            t1 = time.perf_counter()
            times.append(t1 - t0)
            t0 = t1
    # The mean of the middle 80% of steps: robust to a machine hiccup, yet it still charges
    # any steady slowdown (a median alone could hide a slow step every N).
    times.sort()
    cut = len(times) // 10
    mid = times[cut:len(times) - cut]
    return sum(mid) / len(mid)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # keep the step time stable on a small machine
    down = f"http://127.0.0.1:{closed_port()}"
    results: dict[str, list[float]] = {"none": [], "down-grpc": [], "down-http": [],
                                       "hanging-grpc": []}
    with HangingCollector() as hanging:
        hang = f"http://127.0.0.1:{hanging.port}"
        _loop(50, exporter="none")  # warm-up
        for _ in range(args.repeats):
            results["none"].append(_loop(args.steps, exporter="none"))
            results["down-grpc"].append(_loop(args.steps, exporter="otlp", otlp_endpoint=down,
                                              otlp_protocol="grpc"))
            results["down-http"].append(_loop(args.steps, exporter="otlp", otlp_endpoint=down,
                                              otlp_protocol="http/protobuf"))
            results["hanging-grpc"].append(_loop(args.steps, exporter="otlp",
                                                 otlp_endpoint=hang, otlp_protocol="grpc"))
    base = statistics.median(results["none"])
    print(f"median step time over {args.repeats} interleaved runs of {args.steps} steps")
    for name, vals in results.items():
        med = statistics.median(vals)
        spread = " ".join(f"{v * 1e3:.2f}" for v in vals)
        print(f"  {name:<14}{med * 1e3:8.3f} ms/step   ratio vs none {med / base:6.3f}"
              f"{'   (target <= 1.02)' if name != 'none' else ''}   [{spread}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
