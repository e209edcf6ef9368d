"""Training speed with the collector down or hanging vs no exporter at all, one run.

Each variant runs the same CPU training loop (a small MLP, forward/backward/optimizer plus a
monitoring phase every 10 steps); variants are interleaved and repeated, and the median
trimmed mean step time is compared. Target: collector down / no exporter <= 1.02.

``--flapping``: a real OTLP receiver (tests/otlp_receivers.py) goes down and comes back on
the same port (``--down`` / ``--up`` seconds, 3/3 by default) while the loop trains for
``--seconds`` (60); no-exporter runs before and after give the step-time ratio. Prints the
share of the spans that ended while the collector was up which arrived (target >= 90%),
whether delivered + counted drops == emitted exactly, duplicates (target 0), and the largest
export queue seen (bounded by ``max_queued_spans``).

Usage::

    python benchmarks/bench_collector_down.py [--steps 400] [--repeats 5]
    python benchmarks/bench_collector_down.py --flapping [--seconds 60] [--protocol grpc]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _sick_collector import HangingCollector, closed_port  # noqa: E402


def _loop(steps: int, seconds: float | None = None, on_run: Any = None,
          stop_flapping: Any = None, **options: object) -> float:
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
        end = None if seconds is None else time.monotonic() + seconds
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
            if on_run is not None and step.index % 50 == 0:
                on_run(run)
            if end is not None and time.monotonic() > end:
                break
        if stop_flapping is not None:
            stop_flapping()  # the collector stays up from now: what is queued can drain
        if on_run is not None:
            run.flush(30)
            on_run(run)
    # The mean of the middle 80% of steps: robust to a machine hiccup, yet it still charges
    # any steady slowdown (a median alone could hide a slow step every N).
    times.sort()
    cut = len(times) // 10
    mid = times[cut:len(times) - cut]
    return sum(mid) / len(mid)


_SEGMENTS = 6


def _collector_process(protocol: str, down: float, up: float, conn: Any) -> None:
    """A real OTLP receiver flapping on one port, in its own process (its CPU is not ours)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from otlp_receivers import Flapping, GrpcOtlpReceiver, HttpOtlpReceiver

    receiver = GrpcOtlpReceiver() if protocol == "grpc" else HttpOtlpReceiver()
    with receiver:
        conn.send(receiver.endpoint)
        conn.recv()  # start flapping
        with Flapping(receiver, down, up) as flapping:
            offset = time.time() - time.monotonic()
            conn.recv()  # stop: the receiver stays up
        conn.recv()  # the run has flushed
        spans = [(s.span_id, s.end_time_unix_nano) for s in receiver.spans()]
        windows = [(a + offset, b + offset) for a, b in flapping.up_intervals()]
        conn.send((spans, windows, flapping.outages))


def _flapping(protocol: str, seconds: float, down: float, up: float) -> None:
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    collector = ctx.Process(target=_collector_process, args=(protocol, down, up, child),
                            daemon=True)
    collector.start()
    endpoint = parent.recv()
    seen: dict[str, Any] = {"max_queue": 0, "runs": []}

    def watch(run: Any) -> None:
        export = run._telemetry.export
        seen["max_queue"] = max(seen["max_queue"], len(export._queue))
        if not seen["runs"] or seen["runs"][-1] is not run:
            seen["runs"].append(run)

    # Interleaved segments (no exporter, then exporting to the flapping collector) so the
    # machine's drift hits both alike; each exporting segment is its own run and ends with a
    # flush that waits for the collector to be up (not counted in the step time).
    steps_cap = 10**9
    segment = seconds / _SEGMENTS
    parent.send("flap")
    plain: list[float] = []
    flapped: list[float] = []
    for i in range(_SEGMENTS):
        plain.append(_loop(steps_cap, seconds=segment, exporter="none"))
        last = i == _SEGMENTS - 1
        flapped.append(_loop(steps_cap, seconds=segment, exporter="otlp",
                             otlp_endpoint=endpoint, otlp_protocol=protocol, on_run=watch,
                             stop_flapping=(lambda: parent.send("stop")) if last else None))
    parent.send("flushed")
    received, windows, outages = parent.recv()
    collector.join(10)
    drops: dict[str, int] = {}
    emitted = 0
    for run in seen["runs"]:
        emitted += run._telemetry.worker.spans_built
        for reason, n in run.dropped_spans().items():
            drops[reason] = drops.get(reason, 0) + n
    unique = {span_id for span_id, _ in received}
    # The spans that ended while the collector was up: those that arrived we can place; a
    # dropped span cannot be placed, so each drop counts as one that ended while up (the
    # share printed is a lower bound).
    ended_up = sum(1 for _, end in received
                   if any(a <= end / 1e9 < b for a, b in windows))
    lost = sum(drops.values())
    base = statistics.median(plain)
    exporting = statistics.median(flapped)
    print(f"flapping collector, {protocol}: {down:g} s down / {up:g} s up; {seconds:g} s of "
          f"training exporting to it in {_SEGMENTS} segments interleaved with as many without "
          f"an exporter ({outages} outages; the collector runs in its own process)")
    print(f"  spans emitted {emitted}, delivered {len(unique)}, counted drops {lost} {drops}")
    print(f"  delivered + drops == emitted: {len(unique) + lost == emitted}   duplicates: "
          f"{len(received) - len(unique)}")
    print(f"  delivery share of the spans that ended while the collector was up: "
          f">= {ended_up / max(1, ended_up + lost):.1%} (target >= 90%); of all spans: "
          f"{len(unique) / max(1, emitted):.1%}")
    print(f"  largest export queue seen: {seen['max_queue']} spans (bound: max_queued_spans)")
    print(f"  step time (median of segments) {exporting * 1e3:.3f} ms vs no exporter "
          f"{base * 1e3:.3f} ms: ratio {exporting / base:.3f}   [exporting: "
          f"{' '.join(f'{v * 1e3:.2f}' for v in flapped)}; none: "
          f"{' '.join(f'{v * 1e3:.2f}' for v in plain)}]", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--flapping", action="store_true")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--down", type=float, default=3.0)
    ap.add_argument("--up", type=float, default=3.0)
    ap.add_argument("--protocol", choices=("grpc", "http/protobuf", "both"), default="both")
    args = ap.parse_args(argv)
    if args.flapping:
        import torch

        torch.set_num_threads(1)
        _loop(50, exporter="none")  # warm-up
        for protocol in (("grpc", "http/protobuf") if args.protocol == "both"
                         else (args.protocol,)):
            _flapping(protocol, args.seconds, args.down, args.up)
        return 0
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
