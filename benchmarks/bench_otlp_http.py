"""CPU per OTLP/HTTP request: the SDK's requests and urllib3 transports against otel-train's
lean HTTP/1.1 POST (http_post.py), and a thread started per request against reused sender
threads (http_sender.py).

Each request carries one 512-span batch (the export batch size) of otel-train step spans to
a real OTLP/HTTP receiver in its own process. The configurations alternate in rounds (this
machine's speed drifts), and each figure is the median over rounds of this process's CPU
per request (``time.process_time_ns``: the sender threads' work, whichever thread ran it).

Usage::

    python benchmarks/bench_otlp_http.py [--rounds 12] [--requests 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_support import ReceiverProcess  # noqa: E402

from otel_train.common import sdk_private  # noqa: E402
from otel_train.export.otlp.http_sender import LEAN_TRANSPORT_ENV, lean_transport_reason  # noqa: E402
from otel_train.export.otlp.transport import ExportOutcome, SingleAttemptHttpSpanExporter  # noqa: E402


def _batch(n: int, exporter: SingleAttemptHttpSpanExporter) -> list:
    """``n`` spans shaped like a step's phase spans (the attributes otel-train sets), as the
    export stage queues them for ``exporter``."""
    from otel_train.records.span_rows import RowSpanFactory, row_from_span

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("otel_train")
    for i in range(n):
        with tracer.start_as_current_span("forward", attributes={
                "train.step": i, "train.phase": "forward", "train.phase.kind": "train",
                "run.id": "20261123-120000-abcdef", "rank": 0, "world_size": 1}):
            pass
    spans = list(memory.get_finished_spans())
    items = exporter.span_items(RowSpanFactory(spans[0].resource,
                                               spans[0].instrumentation_scope, {}))
    return [items.from_row(row_from_span(span)) for span in spans]


def _exporter(endpoint: str, transport: str, reuse: bool) -> SingleAttemptHttpSpanExporter:
    """An exporter sending through ``transport``: "requests", "urllib3" (the SDK's) or
    "lean" (what otel-train takes where requests adds nothing)."""
    if transport == "requests":
        os.environ[LEAN_TRANSPORT_ENV] = "0"
    else:
        os.environ.pop(LEAN_TRANSPORT_ENV, None)
    exporter = SingleAttemptHttpSpanExporter(endpoint=endpoint + "/v1/traces", timeout=10)
    os.environ.pop(LEAN_TRANSPORT_ENV, None)
    if transport != "requests" and not exporter.lean_transport:
        reason = lean_transport_reason(endpoint + "/v1/traces", {})
        print(f"note: the lean transport is not taken here ({reason}): the {transport} "
              f"rows measure requests")
    elif transport == "urllib3":
        urllib3_transport = sdk_private.urllib3_transport_class()
        if urllib3_transport is None:
            raise SystemExit("the SDK's urllib3 transport needs urllib3 installed")
        sdk_private.set_http_transport(exporter._client,
                                       urllib3_transport(verify=True, cert=None))
    if not reuse:
        exporter._senders.idle_seconds = 0.0  # each request on a thread of its own
    return exporter


def main(argv: list[str] | None = None) -> int:
    """Print the CPU per request of each configuration."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--requests", type=int, default=20, help="requests per round")
    parser.add_argument("--spans", type=int, default=512, help="spans per request")
    args = parser.parse_args(argv)
    receiver = ReceiverProcess()
    try:
        configs = {
            "requests, thread per request (before)": _exporter(receiver.endpoint, "requests",
                                                               False),
            "requests, reused threads": _exporter(receiver.endpoint, "requests", True),
            "urllib3, reused threads": _exporter(receiver.endpoint, "urllib3", True),
            "lean POST, thread per request": _exporter(receiver.endpoint, "lean", False),
            "lean POST, reused threads (now)": _exporter(receiver.endpoint, "lean", True),
        }
        first = next(iter(configs.values()))
        spans = _batch(args.spans, first)
        body = first.encode(spans)
        cpu: dict[str, list[float]] = {name: [] for name in configs}
        sent = 0
        for r in range(args.rounds):
            order = list(configs.items())
            for name, exporter in (order if r % 2 == 0 else order[::-1]):
                t0 = time.process_time_ns()
                for _ in range(args.requests):
                    outcome = exporter.start_send(spans, body, 10.0).wait(12.0)
                    if outcome is not ExportOutcome.SENT:
                        raise SystemExit(f"{name}: request not delivered ({outcome})")
                    sent += 1
                cpu[name].append((time.process_time_ns() - t0) / args.requests / 1e3)
        print(f"bench_otlp_http: {args.rounds} rounds x {args.requests} requests of "
              f"{args.spans} spans ({len(body)} bytes) per configuration; CPU per request "
              f"(median over rounds, this process, all threads)")
        base = statistics.median(cpu[next(iter(configs))])
        for name, values in cpu.items():
            med = statistics.median(values)
            print(f"  {name:40s} {med:7.0f} us  ({med / base:.2f}x)")
        delivered = receiver.count()
        print(f"  spans delivered: {delivered}/{sent * args.spans}")
        for exporter in configs.values():
            exporter.shutdown()
        return 0 if delivered == sent * args.spans else 1
    finally:
        receiver.close()


if __name__ == "__main__":
    raise SystemExit(main())
