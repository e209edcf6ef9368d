"""Hot-path cost of a 7-span step (root + 6 phases) vs the OTel SDK's own spans, one run.

Prints, all measured in this one run with ``time.thread_time_ns`` (CPU of the thread that
does the work, so background work is neither hidden in nor charged to the hot path):

- floor: six empty context managers that only take two timestamps each;
- otel-train hot path: ``run.steps`` + 5 phases (data is the 6th), the background worker
  paused so the figure is the training thread's own cost;
- OTel SDK: ``tracer.start_as_current_span`` for the same 7-span tree (no exporter);
- background: span building + derived-metrics processors per step, and the OTLP protobuf
  encoding per step (otel-train's encoder, the SDK's beside it); total CPU per exported step
  (hot path + build + processors + encode);
- otel-train hot path with the background worker running concurrently (GIL contention in).

The variants are interleaved in small chunks (floor, otel-train, SDK, floor, ...), so a change
in the machine's speed during the run (shared CPUs drift by tens of percent here) moves all
of them alike and the ratios stay true. Between chunks, outside the timing, the paused
worker's queue is drained: at most CHUNK records wait, as in a real run where the worker
drains every 50 ms and a step takes milliseconds.

Usage::

    python benchmarks/bench_hot_path.py [--rounds 400]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from time import perf_counter_ns, thread_time_ns
from typing import Any

CHUNK = 50  # steps per timed chunk
SDK_CHUNK = 5  # the SDK path is ~30x slower: fewer steps keep the rounds balanced


class _EmptyTimer:
    __slots__ = ("t",)

    def __enter__(self) -> _EmptyTimer:
        self.t = perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        perf_counter_ns()


def _floor_chunk() -> int:
    t0 = thread_time_ns()
    for _ in range(CHUNK):
        for _ in range(6):
            with _EmptyTimer():
                pass
    return thread_time_ns() - t0


def _ours_chunk(gen: Any) -> int:
    t0 = thread_time_ns()
    for _, step in zip(range(CHUNK), gen):
        with step.phase("forward"):
            pass
        with step.phase("backward"):
            pass
        with step.phase("optimizer"):
            pass
        with step.monitor("inference"):
            pass
        with step.monitor("val_loss"):
            pass
    return thread_time_ns() - t0


def _sdk_chunk(tracer: Any) -> int:
    t0 = thread_time_ns()
    for _ in range(SDK_CHUNK):
        with tracer.start_as_current_span("train.step"):
            for name in ("data", "forward", "backward", "optimizer", "inference", "val_loss"):
                with tracer.start_as_current_span(name):
                    pass
    return thread_time_ns() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=400)
    args = ap.parse_args(argv)

    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider

    import otel_train
    from otel_train.otlp_encoding import _Encoder

    tracer = TracerProvider().get_tracer("bench")
    floor = ours = sdk = build = encode = sdk_encode = 0
    encoder = _Encoder()  # as the exporter holds one: its attribute cache stays warm
    encoded_steps = 0
    rounds = args.rounds
    with tempfile.TemporaryDirectory() as tmp, otel_train.start_run(
        exporter="none", prometheus_port=None, console=False, status_dir=tmp,
        max_queued_steps=10 * CHUNK,
    ) as run:
        run._telemetry.worker.paused = True
        gen = run.steps(range(rounds * CHUNK + 1))
        for r in range(10):  # warm-up: caches, dict growth, first-use paths
            _floor_chunk(), _ours_chunk(gen), _sdk_chunk(tracer)
            run._telemetry.worker.drain()
        gc.collect()
        for r in range(rounds - 10):
            floor += _floor_chunk()
            ours += _ours_chunk(gen)
            sdk += _sdk_chunk(tracer)
            sample = list(run._recorder.queue)[:5]
            t1 = thread_time_ns()
            run._telemetry.worker.drain()  # build spans + run the derived-metrics processors
            build += thread_time_ns() - t1
            spans = [s for rec in sample for s in run._telemetry.builder.build(rec)]
            t2 = thread_time_ns()
            encoder.request(spans)  # what otel-train's OTLP exporters do per batch
            t3 = thread_time_ns()
            encode_spans(spans).SerializeToString()  # the SDK's encoder, for comparison
            encode += t3 - t2
            sdk_encode += thread_time_ns() - t3
            encoded_steps += len(sample)
    steps = (rounds - 10) * CHUNK
    floor, ours, build = floor / steps, ours / steps, build / steps
    sdk /= (rounds - 10) * SDK_CHUNK
    encode /= max(1, encoded_steps)
    sdk_encode /= max(1, encoded_steps)

    # The same hot path with the worker building spans concurrently (the GIL is shared).
    with tempfile.TemporaryDirectory() as tmp, otel_train.start_run(
        exporter="none", prometheus_port=None, console=False, status_dir=tmp,
    ) as run:
        gen = run.steps(range(rounds * CHUNK))
        gc.collect()
        concurrent = sum(_ours_chunk(gen) for _ in range(rounds)) / (rounds * CHUNK)

    us = 1000.0
    print(f"per step, 7 spans (root + data + 5 phases); {steps} steps, interleaved chunks")
    print(f"{'floor: 6 empty timestamp context managers':<54}{floor / us:8.2f} us")
    print(f"{'otel-train hot path (training thread CPU)':<54}{ours / us:8.2f} us   "
          f"= {ours / floor:.2f} x floor (target <= 7 us where the floor is ~4.7 us)")
    print(f"{'OTel SDK start_as_current_span, same tree':<54}{sdk / us:8.2f} us")
    print(f"{'ratio SDK / otel-train hot path':<54}{sdk / ours:8.1f} x    (target >= 30x)")
    print(f"{'background: build spans + derived-metrics processors':<54}{build / us:8.2f} us")
    print(f"{'background: OTLP protobuf encoding (otel-train)':<54}{encode / us:8.2f} us   "
          f"(the SDK's encoder: {sdk_encode / us:.2f} us, {sdk_encode / encode:.1f}x)")
    total = ours + build + encode
    print(f"{'total CPU per exported step (all threads)':<54}{total / us:8.2f} us")
    print(f"{'hot path with the background worker running':<54}{concurrent / us:8.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
