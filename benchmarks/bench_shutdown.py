"""How long shutdown and exit take with the collector down or hanging.

Default mode: records 200 steps with an OTLP/gRPC exporter pointed at a closed port, then
times ``run.shutdown()`` (bounded by ``shutdown_timeout_seconds``, default 2 s) and, for the
same spans, the SDK's own ``TracerProvider.shutdown()`` with a ``BatchSpanProcessor`` (what
the SDK runs at interpreter exit). ``--skip-sdk`` skips the slow SDK half.

``--exit``: the whole interpreter exit, teardown included, in subprocesses that train 200
steps and then simply end (the atexit hook shuts the run down) with a collector that accepts
connections and never answers (gRPC and HTTP), interleaved with the same script exporting
nothing (the teardown every torch script pays). Prints, per variant, the median of the time
from the last step to the process being gone, the run's shutdown within it, and the rest
(interpreter teardown), against the bound.

Usage::

    python benchmarks/bench_shutdown.py [--skip-sdk]
    python benchmarks/bench_shutdown.py --exit [--bound 2.0] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _sick_collector import HangingCollector, closed_port  # noqa: E402

_EXIT_SCRIPT = textwrap.dedent("""
    import sys, time
    import torch  # a training script has it loaded: its teardown is part of every exit
    import otel_train
    from otel_train import run as run_module

    shutdown = run_module.Run.shutdown
    def timed(self, timeout=None):
        t0 = time.monotonic()
        shutdown(self, timeout)
        print("SHUTDOWN", time.monotonic() - t0, flush=True)
    run_module.Run.shutdown = timed
    exporter, protocol, endpoint, status_dir = sys.argv[1:5]
    run = otel_train.start_run(exporter=exporter, otlp_protocol=protocol or None,
                               otlp_endpoint=endpoint or None, prometheus_port=None,
                               console=False, status_dir=status_dir,
                               export_interval_seconds=0.05)
    for step in run.steps(range(200)):
        with step.phase("forward"):
            pass
    time.sleep(0.3)  # the exporter is now stuck on the collector
    print("STEPS-DONE", time.time(), flush=True)
""")


def otel_train_shutdown_seconds(endpoint: str) -> float:
    import otel_train

    with tempfile.TemporaryDirectory() as tmp:
        run = otel_train.start_run(exporter="otlp", otlp_endpoint=endpoint, otlp_protocol="grpc",
                                   prometheus_port=None, console=False, status_dir=tmp)
        for step in run.steps(range(200)):
            with step.phase("forward"):
                pass
        t0 = time.perf_counter()
        run.shutdown()
        return time.perf_counter() - t0


def sdk_shutdown_seconds(endpoint: str) -> float:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint,
                                                                    insecure=True)))
    tracer = provider.get_tracer("bench")
    for _ in range(200):
        with tracer.start_as_current_span("train.step"):
            with tracer.start_as_current_span("forward"):
                pass
    t0 = time.perf_counter()
    provider.shutdown()
    return time.perf_counter() - t0


def _exit_once(exporter: str, protocol: str, endpoint: str, bound: float) -> tuple[float, float]:
    """(seconds from the last step to the process being gone, of which the run's shutdown)."""
    env = {**os.environ, "OTEL_TRAIN_SHUTDOWN_TIMEOUT_SECONDS": str(bound)}
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen(
            [sys.executable, "-c", _EXIT_SCRIPT, exporter, protocol, endpoint, tmp],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        out, _ = proc.communicate(timeout=120)
        gone = time.time()
    lines = dict(line.split(None, 1) for line in out.splitlines() if " " in line)
    return gone - float(lines["STEPS-DONE"]), float(lines.get("SHUTDOWN", "nan"))


def exit_main(bound: float, repeats: int) -> int:
    results: dict[str, list[tuple[float, float]]] = {
        "no exporter": [], "hanging grpc": [], "hanging http": []}
    with HangingCollector() as hanging:
        endpoint = f"http://127.0.0.1:{hanging.port}"
        for _ in range(repeats):
            results["no exporter"].append(_exit_once("none", "", "", bound))
            results["hanging grpc"].append(_exit_once("otlp", "grpc", endpoint, bound))
            results["hanging http"].append(
                _exit_once("otlp", "http/protobuf", endpoint, bound))
    print(f"interpreter exit after the last step, shutdown_timeout_seconds={bound}, "
          f"median of {repeats} interleaved runs")
    base = statistics.median(e - s for e, s in results["no exporter"])
    for name, runs in results.items():
        total = statistics.median(e for e, _ in runs)
        shut = statistics.median(s for _, s in runs)
        teardown = statistics.median(e - s for e, s in runs)
        print(f"  {name:<13} exit {total:6.2f} s = shutdown {shut:5.2f} s + teardown "
              f"{teardown:5.2f} s   exit/bound {total / bound:5.2f}   teardown beyond the "
              f"no-exporter one {teardown - base:+5.2f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-sdk", action="store_true")
    ap.add_argument("--exit", action="store_true", help="measure the whole interpreter exit")
    ap.add_argument("--bound", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    if args.exit:
        return exit_main(args.bound, args.repeats)
    endpoint = f"http://127.0.0.1:{closed_port()}"
    ours = otel_train_shutdown_seconds(endpoint)
    print(f"otel-train run.shutdown(), collector down : {ours:6.2f} s  (bound: 2 s)")
    if not args.skip_sdk:
        sdk = sdk_shutdown_seconds(endpoint)
        print(f"OTel SDK provider.shutdown(), same        : {sdk:6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
