"""CPU cost per step of the derived-metrics processors and Prometheus metrics.

Builds realistic steps with the library's own recorder and span builder (data, forward,
backward, optimizer; every 10th step also inference and val_loss with 4 validation batches),
then feeds the spans to the pipeline's processors exactly as the span worker does, timing
the feeding thread's CPU (``time.thread_time_ns``). Scrapes are not per step and not counted
here; one scrape's cost is printed separately. The hot-path figure (the training thread's
cost of recording one such step) is printed beside it. One run, a table, no assertions.

The exporter process's per-step work is printed stage by stage, on the same records in
frames of 256 steps (the span worker's drain): the frame's ``marshal`` load (the pipe), the
derived chain, each record's OTLP spans (the Python encoder and the C one,
``export/otlp/_encode_c.c``, side by side, interleaved rounds, best of each) and the
request joined from 512 of them. The derived chain is split by processor group (each
processor takes the whole frame in turn; the overhead, budget, throughput and console take it
together, view by view), on the same frames.

``--live`` profiles a live exporter process instead: a run exporting OTLP/HTTP to a real
receiver in its own process, the bench_hot_path.py step (7 spans: root, data, forward,
backward, optimizer, inference, val_loss) paced by a GIL-holding spin, the child's stages
timed from inside it (benchmarks/_exporter_profile.py: the frame read, ``marshal``, the chain
group by group, the tail sampler, the records queued for export, the reports) and its threads
read from ``/proc``. The wrappers cost a few clock reads per 256-step frame; the child's CPU
per step is printed beside the same run's ``/proc`` total. ``--ring`` runs it with
``step_ring="on"``: the exporter process reads the steps from the shared-memory ring and
builds their records (rows ``ring: ...``), in C, or with ``--python-ring`` in Python (the
twins of ``_recorder_c.ring_read_items`` and ``flat_step_record``).

Usage::

    /work/venv/bin/python benchmarks/bench_processors.py [--steps 20000]
    /work/venv/bin/python benchmarks/bench_processors.py --live [--steps 5000 --step-us 1000]
    /work/venv/bin/python benchmarks/bench_processors.py --live --ring [--python-ring]
"""

from __future__ import annotations

import argparse
import io
import logging
import statistics
import sys
from collections import defaultdict
import tempfile
from pathlib import Path
from time import thread_time_ns
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_train.derived.chain import StepChain, feed_records
from otel_train.derived.stage import DerivedMetricsStage
from otel_train.common.drop_counter import DropCounter
from otel_train.common.identity import RunIdentity
from otel_train.common.options import RunOptions
from otel_train.pipeline.plan import PipelineEnvironment, plan_pipeline
from otel_train.pipeline.settings import chain_settings, derived_settings
from otel_train.recording.recorder import FLAT_PHASE_ROWS, Recorder, Step
from otel_train.common.self_cost import SelfCostMeter
from otel_train.records.step_records import StepRecordBuilder, epoch_offset_ns
from otel_train.records.span_rows import record_span_count, view_from_record
from otel_train.records.steps_view import SharedStepSpanProcessor


def record_step(rec: Recorder, index: int, eval_step: bool) -> Step:
    """One step as a training loop records it (the hot path)."""
    step = Step(rec, index, "train")
    for name in ("data", "forward", "backward", "optimizer"):
        with step.phase(name):
            pass
    if eval_step:
        with step.monitor("inference"):
            pass
        with step.monitor("val_loss"):
            for _ in step.iter_data(range(4), loader="val"):
                pass
    step._finish(None)
    return step


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3, help="best of N (a shared machine)")
    parser.add_argument("--live", action="store_true",
                        help="profile a live exporter process, stage by stage")
    parser.add_argument("--step-us", type=float, default=1000.0,
                        help="--live: each step's GIL-holding spin, microseconds")
    parser.add_argument("--ring", action="store_true",
                        help="--live: step_ring='on': the exporter process reads the steps from "
                        "the shared-memory ring and builds their records (rows 'ring: ...')")
    parser.add_argument("--python-ring", action="store_true",
                        help="--live --ring: the exporter process reads the ring and builds "
                        "its records in Python, not in C (the twins, side by side)")
    parser.add_argument("--flush-every", type=int, default=0,
                        help="--live: flush the run every N steps (bench_hot_path.py's chunks: "
                        "500); 0: never, the run's own cadence")
    args = parser.parse_args(argv)
    logging.getLogger("otel_train").setLevel(logging.ERROR)  # slow-step warnings etc.
    if args.live:
        return _live(args.steps, args.step_us, args.flush_every, args.ring,
                     args.python_ring)
    n = args.steps
    drops = DropCounter()
    ident = RunIdentity("bench", 0, 1, 0, "option")

    # Hot path: recording the steps (training thread CPU).
    rec = Recorder(n + 1, drops, None)
    t0 = thread_time_ns()
    for i in range(n):
        record_step(rec, i, i % 10 == 0)
    hot_ns = (thread_time_ns() - t0) / n
    steps = list(rec.queue)

    builder = StepRecordBuilder(ident, Resource.create({}), InstrumentationScope("bench"),
                                False, "cpu", lambda t: True, epoch_offset_ns())
    records = [builder.record(s) for s in steps]
    spans_per_step = sum(map(record_span_count, records)) / n

    rows: list[tuple[str, float]] = [("hot path: record one step (training thread)", hot_ns)]
    build_c_ns, build_py_ns = _record_twins(builder, steps, args.rounds)
    with tempfile.TemporaryDirectory() as tmp:
        for label, console, prometheus in (
            ("processors + metrics (console off)", False, 0),
            ("processors + metrics + console report", True, 0),
        ):
            opts = RunOptions.resolve(environ={}, console=console, prometheus_port=prometheus,
                                      status_dir=tmp, costs_interval_seconds=3600.0)
            plan = plan_pipeline(opts, PipelineEnvironment(env={}))
            pipe = DerivedMetricsStage(derived_settings(opts, ident, plan), ident, Path(tmp),
                                       Recorder(1, drops, None), drops, SelfCostMeter())
            if pipe.console is not None:
                pipe.console._stream = io.StringIO()  # measure formatting, not the terminal
            # As the span worker does: the views of a chunk of span records, fed at once.
            # Only the feeding is timed, per chunk of steps (a thread-CPU clock read is a
            # syscall: too costly to bracket every step). On a shared machine the median
            # chunk is the figure; the mean is printed beside it.
            per_chunk = _feed_chunks(records, pipe.shared, chunk=50)
            per_chunk.sort()
            rows.append((label + " [median]", per_chunk[len(per_chunk) // 2]))
            rows.append((label + " [mean]", sum(per_chunk) / len(per_chunk)))
            t0 = thread_time_ns()
            body = b"".join(m.name.encode() for m in pipe.metrics.registry.collect())
            scrape_ns = thread_time_ns() - t0
            rows.append(("  one scrape (collect all families; not per step)", scrape_ns))
            assert body
            pipe.shutdown(0.5)
    if build_c_ns is not None:
        rows.append(("span records, flat phase rows in C (step_records.py)", build_c_ns / n))
    rows.append(("span records, flat phase rows in pure Python", build_py_ns / n))
    # The record path (the exporter process's): the views of a frame of span records, fed
    # view by view to every processor, or a frame at a time (each processor takes the whole
    # frame in turn: SharedStepSpanProcessor.on_views). Interleaved rounds, medians.
    settings = chain_settings(RunOptions.resolve(environ={}, console=False), ident)
    by_view, by_frame = [], []
    for _ in range(max(3, args.rounds * 3)):
        by_view.append(_feed_frames(settings, records, frame_at_a_time=False))
        by_frame.append(_feed_frames(settings, records, frame_at_a_time=True))
    rows.append(("span records' views (console off), view by view [median]",
                 statistics.median(by_view)))
    rows.append(("span records' views (console off), a frame at a time [median]",
                 statistics.median(by_frame)))

    rows += _exporter_stages(records, builder, settings, args.rounds)

    print(f"{n} steps, {spans_per_step:.1f} spans/step on average "
          "(every 10th step: inference + val_loss with 4 val batches)")
    print(f"{'what':<60} {'CPU per step':>14}")
    print("-" * 75)
    for label, ns in rows:
        print(f"{label:<60} {ns / 1000:>11.2f} µs")
    print("target: processors + metrics <= 15 µs per step")
    return 0


def _exporter_stages(records: list[Any], builder: StepRecordBuilder,
                     settings: dict[str, Any], rounds: int) -> list[tuple[str, float]]:
    """The exporter process's CPU per step, stage by stage (ns per step)."""
    import marshal

    from otel_train.export.otlp import encoding

    frames = [marshal.dumps(records[i:i + 256]) for i in range(0, len(records), 256)]
    load_ns = float("inf")
    for _ in range(max(1, rounds)):  # each frame loaded and let go, as the process does
        t0 = thread_time_ns()
        for f in frames:
            marshal.loads(f)
        load_ns = min(load_ns, (thread_time_ns() - t0) / len(records))
    loaded = [rec for f in frames for rec in marshal.loads(f)]
    chain_ns = min(_feed_frames(settings, loaded, frame_at_a_time=True)
                   for _ in range(max(1, rounds)))
    consts = builder.run_constants
    twins = [("Python", False)] + ([("C", True)] if encoding.ACCELERATED else [])
    best: dict[str, float] = {}
    in_c = 0
    for _ in range(max(3, rounds * 3)):
        for name, accelerated in twins:
            enc = encoding._Encoder(accelerated=accelerated)
            t0 = thread_time_ns()
            for rec in loaded:
                enc.record(rec, consts)
            ns = (thread_time_ns() - t0) / len(loaded)
            best[name] = min(best.get(name, ns), ns)
            in_c = max(in_c, enc.records_in_c)
    enc = encoding._Encoder()
    fields = [f for rec in loaded for f in enc.record(rec, consts)]
    batches = [fields[i:i + 512] for i in range(0, len(fields), 512)]
    resource, scope = builder.factory.resource, builder.factory.scope
    t0 = thread_time_ns()
    for batch in batches:
        enc.request(batch, resource, scope)
    request_ns = (thread_time_ns() - t0) / len(loaded)
    out = [("exporter process: a 256-step frame's marshal load", load_ns),
           ("exporter process: derived chain, a frame at a time", chain_ns)]
    out += [(f"  {label}", ns) for label, ns in _chain_by_group(settings, loaded, rounds)]
    for name in best:
        out.append((f"exporter process: OTLP spans of a record, {name} encoder", best[name]))
    if "C" in best:
        print(f"C span encoder: {in_c} of {len(loaded)} records in C, "
              f"{best['Python'] / best['C']:.1f}x less CPU than the Python")
    out.append(("exporter process: OTLP request joined from 512 spans", request_ns))
    fastest = min(best.values())
    out.append(("exporter process: the stages above, with the fastest encoder",
                load_ns + chain_ns + fastest + request_ns))
    return out


def _chain_by_group(settings: dict[str, Any], records: list[Any], rounds: int,
                    frame: int = 256) -> list[tuple[str, float]]:
    """The derived chain's CPU per step by processor group, a frame at a time (best of
    ``rounds`` fresh chains); the views' making apart."""
    from _exporter_profile import timed_on_views

    best: dict[str, float] = {}
    for _ in range(max(1, rounds)):
        chain = StepChain(settings, SelfCostMeter(), console_stream=io.StringIO())
        shared = SharedStepSpanProcessor(chain.processors)
        acc: dict[str, int] = defaultdict(int)
        for i in range(0, len(records), frame):
            t0 = thread_time_ns()
            views = [v for v in (view_from_record(r, 0) for r in records[i:i + frame])
                     if v is not None]
            acc["views from records"] += thread_time_ns() - t0
            timed_on_views(shared, views, acc)
        for label, ns in acc.items():
            per_step = ns / len(records)
            best[label] = min(best.get(label, per_step), per_step)
    return [(label.removeprefix("chain: "), ns) for label, ns in best.items()]


def _live(steps: int, step_us: float, flush_every: int = 0, ring: bool = False,
          python_ring: bool = False) -> int:
    """Profile a live exporter process stage by stage (``--live``; ``ring``: the steps go
    through the step ring, read and built in the exporter process)."""
    import json
    import os
    import time

    import otel_train
    from otel_train.export.process import launch
    from bench_support import ProcessCpu, ReceiverProcess, exporter_pid

    boot = launch._BOOT
    launch._BOOT = boot.replace(
        "from otel_train.export.process.child import child_main; ",
        "from _exporter_profile import install; install(); "
        "from otel_train.export.process.child import child_main; ")
    receiver = ReceiverProcess()
    step_ns = int(step_us * 1000)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out_path = os.path.join(tmp, "profile.json")
            os.environ["OTEL_TRAIN_EXPORTER_PROFILE"] = out_path
            if python_ring:
                os.environ["OTEL_TRAIN_PROFILE_PYTHON_RING"] = "1"
            run = otel_train.start_run(
                status_dir=tmp, exporter="otlp", otlp_endpoint=receiver.endpoint,
                otlp_protocol="http/protobuf", prometheus_port=None, console=False,
                step_ring="on" if ring else "off")
            child = ProcessCpu(exporter_pid(run))
            gen = run.steps(range(steps + 200))
            for i in range(steps + 200):
                if i == 200:  # start-up and first frames apart
                    run.flush()
                    c0 = child.read_ns()
                elif flush_every and i > 200 and (i - 200) % flush_every == 0:
                    run.flush()
                end = time.perf_counter_ns() + step_ns
                while time.perf_counter_ns() < end:  # the step's own work, holding the GIL
                    pass
                step = next(gen)
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
            run.flush()
            child_ns = child.read_ns() - c0
            run.shutdown()
            time.sleep(0.3)
            with open(out_path) as f:
                prof = json.load(f)
    finally:
        launch._BOOT = boot
        receiver.close()
    n = prof["steps"]
    print(f"live exporter process: {n} steps of 7 spans fed (the first 200 too), "
          f"steps paced by a {step_us:.0f} µs spin"
          + (f", a flush every {flush_every} steps" if flush_every else "")
          + (f", through the step ring (read and built in {prof.get('ring_reader', '?')}, "
             "a run of steps between markers at a time)" if ring else "")
          + "; thread CPU per exported step")
    print(f"{'what':<60} {'CPU per step':>14}")
    print("-" * 75)
    print(f"{'the exporter process, /proc, steps 200 on (all threads)':<60} "
          f"{child_ns / steps / 1000:>11.2f} µs")
    for name, ns in sorted(prof["threads"].items(), key=lambda kv: -kv[1]):
        print(f"{'  thread ' + name:<60} {ns / n / 1000:>11.2f} µs")
    for label, ns in sorted(prof["stages"].items()):
        calls = prof["calls"].get(label, 0)
        print(f"{label[:60]:<60} {ns / n / 1000:>11.2f} µs  ({calls} calls)")
    return 0


def _feed_chunks(records: list[Any], shared: SharedStepSpanProcessor,
                 chunk: int) -> list[float]:
    """Thread CPU ns per step of feeding the views of ``records`` to the processors, one
    figure per chunk of steps."""
    out: list[float] = []
    for i in range(0, len(records) - chunk + 1, chunk):
        t0 = thread_time_ns()
        shared.on_views([view_from_record(r, 0) for r in records[i:i + chunk]])
        out.append((thread_time_ns() - t0) / chunk)
    return out


def _feed_frames(settings: dict[str, Any], records: list[Any], frame_at_a_time: bool,
                 frame: int = 256) -> float:
    """Thread CPU ns per step of feeding a fresh chain the records, 256 a frame (the span
    worker's drain), their views built in the timing too."""
    chain = StepChain(settings, SelfCostMeter(), console_stream=io.StringIO())
    shared = SharedStepSpanProcessor(chain.processors)
    t0 = thread_time_ns()
    for i in range(0, len(records), frame):
        if frame_at_a_time:
            feed_records(shared, records[i:i + frame], 0)
        else:
            for rec in records[i:i + frame]:
                view = view_from_record(rec, 0)
                if view is not None:
                    shared.on_view(view)
    return (thread_time_ns() - t0) / len(records)


def _record_twins(builder: StepRecordBuilder, steps: list[Step], rounds: int
                  ) -> tuple[int | None, int]:
    """Best-of-``rounds`` thread CPU ns to make every step's span record, with the flat
    phase rows in C (None where the accelerator is not built) and in pure Python,
    interleaved."""
    from otel_train.records import step_records

    c_rows, py_rows = FLAT_PHASE_ROWS, step_records._flat_phases
    best_c: int | None = None
    best_py = 0
    try:
        for _ in range(rounds):
            if c_rows is not None:
                step_records._flat_rows = c_rows
                ns = _loop(builder, steps)
                best_c = ns if best_c is None else min(best_c, ns)
            step_records._flat_rows = py_rows
            ns = _loop(builder, steps)
            best_py = ns if not best_py else min(best_py, ns)
    finally:
        step_records._flat_rows = c_rows or py_rows
    return best_c, best_py


def _loop(builder: StepRecordBuilder, steps: list[Step]) -> int:
    """Thread CPU ns to make every step's span record."""
    t0 = thread_time_ns()
    for record in steps:
        builder.record(record)
    return thread_time_ns() - t0


if __name__ == "__main__":
    sys.exit(main())
