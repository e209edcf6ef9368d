"""Hot-path cost of a 7-span step (root + 6 phases) vs the OTel SDK's own spans, one run.

Prints, all measured in this one run with ``time.thread_time_ns`` (CPU of the thread that
does the work, so background work is neither hidden in nor charged to the hot path):

- floor: six empty context managers that only take two timestamps each;
- otel-train hot path: ``run.steps`` + 5 phases (data is the 6th), background worker paused
  so the figure is the training thread's own cost;
- otel-train hot path with the background worker running concurrently (GIL contention in);
- OTel SDK: ``tracer.start_as_current_span`` for the same 7-span tree (no exporter);
- background: span building + processors per step, and OTLP protobuf encoding per step;
- total CPU per exported step (hot path + build + processors + encode).

Usage::

    python benchmarks/bench_hot_path.py [--steps 20000]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
from time import perf_counter_ns, thread_time_ns

PHASES = ("forward", "backward", "optimizer")
MONITORS = ("inference", "val_loss")


class _EmptyTimer:
    __slots__ = ("t",)

    def __enter__(self) -> _EmptyTimer:
        self.t = perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        perf_counter_ns()


def floor_ns(n: int) -> float:
    t0 = thread_time_ns()
    for _ in range(n):
        for _ in range(6):
            with _EmptyTimer():
                pass
    return (thread_time_ns() - t0) / n


def otel_train_ns(n: int, paused: bool, chunk: int = 500) -> tuple[float, float, float]:
    """Hot path per step; with ``paused``, also build+processors and OTLP encoding per step.

    Paused: the worker's draining is done on this thread between chunks of ``chunk`` steps
    and timed apart, so the queue stays as short as in a real run (a long queue would make
    the garbage collector, not the hot path, dominate) and each cost is measured alone.
    """
    import otel_train
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    with tempfile.TemporaryDirectory() as tmp, otel_train.start_run(
        exporter="none", prometheus_port=None, console=False, status_dir=tmp,
        max_queued_steps=n + 10,
    ) as run:
        run._worker.paused = paused
        gen = run.steps(range(n))
        hot = build = encode = 0
        encoded_steps = 0
        for _ in range(n // chunk):
            t0 = thread_time_ns()
            for _, step in zip(range(chunk), gen):
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
            hot += thread_time_ns() - t0
            if not paused:
                continue
            sample = list(run._recorder.queue)[:50]
            t1 = thread_time_ns()
            run._worker.drain()
            build += thread_time_ns() - t1
            # Export encoding: the OTLP protobuf encoding of (a sample of) the same steps.
            spans = [s for rec in sample for s in run._builder.build(rec)]
            t2 = thread_time_ns()
            encode_spans(spans).SerializeToString()
            encode += thread_time_ns() - t2
            encoded_steps += len(sample)
        steps = (n // chunk) * chunk
        return hot / steps, build / steps, encode / max(1, encoded_steps)


def sdk_ns(n: int) -> float:
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("bench")
    t0 = thread_time_ns()
    for _ in range(n):
        with tracer.start_as_current_span("train.step"):
            for name in ("data", *PHASES, *MONITORS):
                with tracer.start_as_current_span(name):
                    pass
    return (thread_time_ns() - t0) / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    n = args.steps
    gc.collect()
    floors, hots, hots_bg, builds, encodes, sdks = [], [], [], [], [], []
    for _ in range(args.repeats):  # interleaved, medians: one noisy moment moves nothing
        floors.append(floor_ns(n))
        hot, build, encode = otel_train_ns(n, paused=True)
        hots.append(hot)
        builds.append(build)
        encodes.append(encode)
        hots_bg.append(otel_train_ns(n, paused=False)[0])
        sdks.append(sdk_ns(max(1000, n // 5)))
    med = statistics.median
    floor, hot, hot_bg = med(floors), med(hots), med(hots_bg)
    build, encode, sdk = med(builds), med(encodes), med(sdks)
    us = 1000.0
    print(f"per step, 7 spans (root + data + 5 phases); median of {args.repeats} x {n} steps")
    print(f"{'floor: 6 empty timestamp context managers':<58}{floor / us:8.2f} us")
    print(f"{'otel-train hot path (training thread CPU)':<58}{hot / us:8.2f} us"
          f"   ({hot / floor:.2f}x floor; target <= 7 us)")
    print(f"{'otel-train hot path, background worker running':<58}{hot_bg / us:8.2f} us")
    print(f"{'OTel SDK start_as_current_span, same tree':<58}{sdk / us:8.2f} us")
    print(f"{'ratio SDK / otel-train hot path':<58}{sdk / hot:8.1f} x   (target >= 30x)")
    print(f"{'background: build spans + processors':<58}{build / us:8.2f} us")
    print(f"{'background: OTLP protobuf encoding':<58}{encode / us:8.2f} us")
    total = hot + build + encode
    print(f"{'total CPU per exported step (all threads)':<58}{total / us:8.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
