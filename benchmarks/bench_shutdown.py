"""How long shutdown takes with the collector down: otel-train's bound vs the OTel SDK's.

Records 200 steps with an OTLP/gRPC exporter pointed at a closed port, then times
``run.shutdown()`` (bounded by ``shutdown_timeout_seconds``, default 2 s) and, for the same
spans, the SDK's own ``TracerProvider.shutdown()`` with a ``BatchSpanProcessor`` (what the
SDK runs at interpreter exit). ``--skip-sdk`` skips the slow SDK half.

Usage::

    python benchmarks/bench_shutdown.py [--skip-sdk]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _sick_collector import closed_port  # noqa: E402


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-sdk", action="store_true")
    args = ap.parse_args(argv)
    endpoint = f"http://127.0.0.1:{closed_port()}"
    ours = otel_train_shutdown_seconds(endpoint)
    print(f"otel-train run.shutdown(), collector down : {ours:6.2f} s  (bound: 2 s)")
    if not args.skip_sdk:
        sdk = sdk_shutdown_seconds(endpoint)
        print(f"OTel SDK provider.shutdown(), same        : {sdk:6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
