"""Capacity model: N exporting training processes against one real OTLP receiver.

Each of N processes (N = 1, 2, 4, 8 by default) runs a loop at a fixed step rate (sleeping to
the next tick; a step is data + forward + backward + optimizer = 5 spans) for ``--seconds``,
exporting over OTLP/gRPC with otel-train's normal export stage. One receiver process serves
opentelemetry-proto's ``TraceService`` on 127.0.0.1 and does what a Collector's OTLP receiver
does first with each request: unmarshal it (protobuf, C upb) and count its spans and bytes.
Its CPU time (``time.process_time()`` inside it: user + system) divided by the spans it received is the
receiver's CPU per span. Every trainer's own CPU from start_run's return to the end of its
shutdown is measured too: the training loop (an empty step here) plus otel-train's hot path
and background (building, derived metrics, encoding, export), per span.

Printed per N and mode: steps/s offered, spans/s and bytes/s received, bytes per span,
receiver CPU per span (µs) and cores used, exporter CPU per span (µs), drops, and spans and
megabytes per rank per hour. Modes (``--modes``): ``steps`` (every rank exports every step),
``first-per-node`` (``export_ranks``, with ``--ranks-per-node`` processes per simulated node:
local rank = rank mod it), ``summary`` (``span_mode="summary"``, the default 100-step
interval); ``--sample-ratio 0.1`` adds runs with tail sampling (ordinary steps kept by trace
id) for comparison.

Usage::

    python benchmarks/bench_capacity.py [--rate 100] [--seconds 6] [--ns 1,2,4,8]
                                        [--modes steps,first-per-node,summary]
                                        [--ranks-per-node 4] [--sample-ratio 0.1]

Note: the receiver is Python+upb, not the Collector (Go): its per-span CPU is this machine's
cost of unmarshalling the same bytes, a proxy for the Collector's receiver stage; the scaling
note (docs/scaling.md) says how it is used.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

RECEIVER = textwrap.dedent("""
    import json, sys, threading, time
    from concurrent import futures
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb, trace_service_pb2_grpc as pbg
    lock = threading.Lock()
    counts = {"spans": 0, "bytes": 0, "requests": 0}

    class Svc(pbg.TraceServiceServicer):
        def Export(self, request, context):
            n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            size = request.ByteSize()
            with lock:
                counts["spans"] += n; counts["bytes"] += size; counts["requests"] += 1
            return pb.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pbg.add_TraceServiceServicer_to_server(Svc(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    for line in sys.stdin:          # "snap" -> counts and CPU seconds so far; "quit" -> exit
        if line.strip() == "quit":
            break
        with lock:
            print(json.dumps(dict(counts, cpu=time.process_time())), flush=True)
    server.stop(0.5)
""")

TRAINER = textwrap.dedent("""
    import json, sys, time
    import otel_train
    rank, world, endpoint, rate, seconds, status, mode, per_node = sys.argv[1:9]
    rank, world, rate, seconds = int(rank), int(world), float(rate), float(seconds)
    opts = dict(run_id="capacity", rank=rank, world_size=world, exporter="otlp",
                otlp_endpoint=endpoint, otlp_protocol="grpc", prometheus_port=None,
                console=False, status_dir=status, export_interval_seconds=0.5,
                local_rank=rank % int(per_node), export_ranks="all")
    if mode == "first-per-node":
        opts["export_ranks"] = mode
    elif mode == "summary":
        opts["span_mode"] = mode
    elif mode != "steps":
        opts["sample_ratio"] = float(mode)
    run = otel_train.start_run(**opts)
    cpu0 = time.process_time()  # start-up (imports) left out: the steady cost is measured
    period = 1.0 / rate
    t_end = time.monotonic() + seconds
    nxt = time.monotonic()
    steps = 0
    while time.monotonic() < t_end:
        with run.step() as step:
            with step.phase("data"):
                pass
            with step.phase("forward"):
                pass
            with step.phase("backward"):
                pass
            with step.phase("optimizer"):
                pass
        steps += 1
        nxt += period
        delay = nxt - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    run.shutdown(timeout=10)
    print(json.dumps({"steps": steps, "cpu": time.process_time() - cpu0,
                      "dropped": sum(run.dropped_spans().values())}))
""")

SPANS_PER_STEP = 5


def measure(n: int, rate: float, seconds: float, mode: str, per_node: int = 4
            ) -> dict[str, float]:
    """One configuration: N trainers against a fresh receiver."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    rx = subprocess.Popen([sys.executable, "-c", RECEIVER], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert rx.stdout is not None and rx.stdin is not None
        port = int(rx.stdout.readline())
        rx.stdin.write("snap\n")
        rx.stdin.flush()
        cpu0 = json.loads(rx.stdout.readline())["cpu"]
        with tempfile.TemporaryDirectory() as tmp:
            trainers = [subprocess.Popen(
                [sys.executable, "-c", TRAINER, str(r), str(n), f"http://127.0.0.1:{port}",
                 str(rate), str(seconds), tmp, mode, str(per_node)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                for r in range(n)]
            results = []
            for p in trainers:
                out, err = p.communicate(timeout=seconds + 120)
                if p.returncode != 0:
                    raise RuntimeError(err[-2000:])
                results.append(json.loads(out.strip().splitlines()[-1]))
        rx.stdin.write("snap\n")
        rx.stdin.flush()
        counts = json.loads(rx.stdout.readline())
        rx_cpu = counts["cpu"] - cpu0
    finally:
        try:
            if rx.stdin is not None:
                rx.stdin.write("quit\n")
                rx.stdin.flush()
            rx.wait(timeout=5)
        except Exception:
            rx.kill()
    steps = sum(r["steps"] for r in results)
    spans = counts["spans"]
    # The trainers' loops ran `seconds`; start-up and shutdown are outside the rate figures.
    return {
        "n": n, "steps_per_s": steps / seconds, "spans_per_s": spans / seconds,
        "bytes_per_s": counts["bytes"] / seconds,
        "bytes_per_span": counts["bytes"] / max(spans, 1),
        "rx_cpu_us_per_span": rx_cpu / max(spans, 1) * 1e6,
        "rx_cores": rx_cpu / seconds,  # its CPU while the loops ran (it idles otherwise)
        "exp_cpu_us_per_span": sum(r["cpu"] for r in results) / max(
            steps * SPANS_PER_STEP, 1) * 1e6,
        "kept_ratio": spans / max(steps * SPANS_PER_STEP, 1),
        "dropped": sum(r["dropped"] for r in results), "requests": counts["requests"],
        "spans_per_rank_hour": spans / seconds / n * 3600,
        "mb_per_rank_hour": counts["bytes"] / seconds / n * 3600 / 1e6,
    }


def main() -> None:
    """Run every configuration and print one table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=100.0, help="steps/s per process")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--ns", default="1,2,4,8")
    ap.add_argument("--sample-ratio", default=None,
                    help="also run each N with this sample_ratio")
    ap.add_argument("--modes", default="steps",
                    help="comma-separated: steps, first-per-node, summary")
    ap.add_argument("--ranks-per-node", type=int, default=4,
                    help="first-per-node: processes per simulated node")
    args = ap.parse_args()
    ns = [int(x) for x in args.ns.split(",")]
    configs = [(n, mode) for mode in args.modes.split(",") for n in ns]
    if args.sample_ratio:
        configs += [(n, args.sample_ratio) for n in ns]
    print(f"capacity: {args.rate:.0f} steps/s per process, {SPANS_PER_STEP} spans/step, "
          f"{args.seconds:.0f} s per run, OTLP/gRPC to one receiver; "
          f"{os.cpu_count()} CPU(s)")
    head = ("N", "mode", "steps/s", "spans/s", "KB/s", "B/span", "rx µs/span", "rx cores",
            "exp µs/span", "kept", "dropped", "spans/rank/h", "MB/rank/h")
    print(" ".join(f"{h:>11}" for h in head))
    for n, mode in configs:
        r = measure(n, args.rate, args.seconds, mode, args.ranks_per_node)
        row = (n, mode[:11], f"{r['steps_per_s']:.0f}", f"{r['spans_per_s']:.0f}",
               f"{r['bytes_per_s'] / 1e3:.1f}", f"{r['bytes_per_span']:.0f}",
               f"{r['rx_cpu_us_per_span']:.1f}", f"{r['rx_cores']:.3f}",
               f"{r['exp_cpu_us_per_span']:.1f}", f"{r['kept_ratio']:.3f}", r["dropped"],
               f"{r['spans_per_rank_hour']:.0f}", f"{r['mb_per_rank_hour']:.2f}")
        print(" ".join(f"{v!s:>11}" for v in row), flush=True)


if __name__ == "__main__":
    main()
