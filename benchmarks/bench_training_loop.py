"""What otel-train costs a real training loop, to 1%, beside the other ways to trace it.

Workloads (CPU): ``gpt``, the demo's tiny GPT (``otel_train.cli.demo.build_model``; ~10 ms per
step), and ``mlp``, a small MLP (~1 ms per step). Each step takes a batch from a
``DataLoader``, runs forward, backward and the optimizer; every 50 steps an eval (validation
loss over a few batches) runs as monitoring. Both with ``torch.set_num_threads(1)`` and with
torch's default thread count.

Variants, each compared with the bare loop:

- ``otel-otlp``: otel-train exporting OTLP/HTTP to a real local receiver (the receivers of
  ``tests/otlp_receivers.py``, in their own process as a collector would be), Prometheus
  metrics served and the console report on (it goes to stderr, sent to /dev/null); its
  ``step_ring`` is the default (``auto``: on this plan the exporter process reads the ring)
  unless ``OTEL_TRAIN_STEP_RING`` says otherwise (``off``: every step queued);
- ``otel-ring`` (only when named in ``--variants``): ``otel-otlp`` with ``step_ring="on"``
  (finished flat steps through the shared-memory step ring, read and built by the exporter
  process: the training process does nothing per flat step after the hot path);
- ``otel-queue`` (only when named in ``--variants``): ``otel-otlp`` with ``step_ring="off"``
  (every step through the recorder's queue, built by the span worker in this process): the
  ring's before and after in one run, ``--variants otel-queue,otel-otlp``;
- ``otel-none``: otel-train with ``exporter="none"`` (spans built, metrics derived, no export);
- ``otel-paused``: the ``otel-otlp`` run with its span worker paused during the block and
  drained after it: the training thread's own cost (hot path, step iterator) on a real loop,
  the floor that background work adds to (a diagnostic, not a way to run);
- ``otel-recorder``: the hot path alone: the same loop over a bare ``Recorder`` (the step
  and phase context managers with no run around them: no thread, no export, its queue
  dropped after each block). Beside ``otel-paused`` it tells what the context managers
  cost a real loop's training thread, where torch's work leaves the caches cold between
  them, from what the run's idle threads and settings add (a diagnostic);
- ``otel-sampled``: ``otel-otlp`` with ``sample_ratio=0.1``, the fleet setting: every step
  still feeds the metrics, the tail decision (10% of ordinary steps, and every slow,
  monitoring and first step) runs in the exporter process after them;
- ``otel-throughput``: ``otel-otlp`` with FLOPs per step and a peak given, so every step's
  root also gets ``train.flops`` and ``train.mfu`` and the throughput and MFU gauges are
  served (every run already counts tokens and samples from its batches' shapes);
- ``otel-any-cpu``: ``otel-otlp`` with ``background_cpus="off"``: the exporter process and
  the run's threads wherever the scheduler puts them, the training thread's CPU included
  (``otel-otlp`` keeps them off it, the default);
- ``instrument``: ``otel_train.instrument(model, opt, dataloader)`` (zero-code hooks) on the
  same OTLP run;
- ``otel-sdk``: the OpenTelemetry SDK by hand: ``start_as_current_span`` per step and per phase,
  ``BatchSpanProcessor``, the SDK's OTLP/HTTP exporter, same receiver;
- ``timestamps``: the floor of this API shape in a real loop: an empty context manager that
  takes two timestamps around the step and each phase (hand-made timers keeping nothing);
  its ``+thrCPU`` beside ``otel-recorder``'s is the hot path's cost against its floor as a
  real loop pays it (torch's work between them leaves the caches cold);
- ``record-function``: ``torch.profiler.record_function`` per step and phase (no profiler
  active: the annotations a codebase leaves in);
- peers (the ``bench`` extra): ``torchtel`` (its ``setup_opentelemetry`` + ``PyTorchInstrumentor``,
  OTLP/HTTP to the receiver) and ``traceml-ai`` (``traceml run`` + ``trace_step``, its default
  summary mode). Skipped with a line saying so when not installed.

Method. This machine's speed drifts by ~10% over seconds, so whole-run comparisons cannot
resolve 1%. Instead each comparison is a series of short blocks (50 GPT steps, 100 MLP
steps), bare and variant alternating (bare, variant, bare, variant, ..., bare), many times,
and every figure compares a variant block with the mean of the two bare blocks either side
of it: drift that is linear over the three cancels. We print the median of those paired
ratios with a bootstrap 95% interval (2000 moving-block resamples: neighbouring pairs share a
bare block, so they are resampled two at a time).

- Where a variant can be switched on and off, it is, in one process: the otel-train run,
  the SDK provider and the receiver stay up for the whole series; a bare block runs the bare
  loop while they idle, a variant block runs the instrumented loop. (``instrument`` hooks are
  installed before and removed after each of its blocks, outside the clock.)
- Work a block caused but has not finished when its last step ends (steps still queued for
  the span worker, which drains in batches of 256 steps or every 0.5 s; spans queued for
  export) would spill into the next, bare, block. So after each variant block the work this
  process still owes is done and timed as the block's ``drain``: ``ratio+drain`` charges it
  (conservative: the drain serializes work that would partly overlap training), ``ratio``
  does not; with ~100-step blocks most of otel-train's background work lands in the drain,
  so read ``ratio+drain`` and the stall/CPU columns for its cost. With the exporter process
  (``otel-otlp``, ``instrument``) the drain is the span worker's (records, derived metrics,
  the frame down the pipe); the exporter process then finishes sending outside the clock (its
  CPU is ``expCPU``). With export in this process (``otel-thread``, the SDK) the drain is
  the whole flush, delivery included.
- What settling outside the clock leaves out: the exporter process (and the receiver)
  working *while* training runs, competing for this 2-vCPU machine's cores and caches.
  Long blocks (``--block-steps 1500`` for the MLP) keep the drains and most of the exporter
  process's work inside the block, but what the block leaves at its end still settles
  outside. ``--frozen-background`` (the all-in A/B) settles nothing: through each bare block
  the span worker is paused and the exporter process and the receiver are stopped
  (SIGSTOP, ``bench_support.FrozenBackground``), so what a variant block leaves is done in
  the next variant block, inside its clock, and run after run all of the background's work
  lands in the variant blocks. Per block, the wall-clock-driven looks run about once more
  than in a run that never stops; with ~1 s blocks that is a small part, and the run's own
  figures for the same blocks count it too.
- Peers patch torch globally and set global providers: they run in alternating short
  subprocesses (bare, peer, peer, bare, ...), each a warm-up block then one timed block.

Per block we also read, for the training thread: its CPU (``time.thread_time_ns``) and its
``/proc/self/task/<tid>/schedstat`` (tid from ``threading.get_native_id()``): field 1 is time
on a CPU, field 2 time runnable but waiting for one (run-queue wait). The rest of the wall
time the thread was blocked: on CPython, mostly waiting for the GIL that otel-train's
background threads hold. ``stall`` = run-queue wait + blocked, per step; the headline is the
variant's stall minus bare's (paired), i.e. what the variant's other threads (and the drain)
take from training. Process CPU per step (all threads) minus bare's is the variant's total
CPU per step. Spans delivered are counted at the receiver. For otel-otlp (and the SDK), gc
collections per 1000 steps (all generations, all threads) are counted through
``gc.callbacks`` in the timed blocks, and a separate block under ``tracemalloc`` gives the
Python memory blocks allocated at peak and kept after the block (per step), bare beside it.

Beside each otel-train run's row, ``own cost``: the share of the block's time the run reports
it lost (``run.self_cost.lost_parts()`` over the block: hot path + the training thread's measured
wait on otel-train's threads, docs/monitoring-costs.md) beside the A/B's share of the same
blocks, 1 - bare / variant block wall, and their paired difference in percentage points: means
over the blocks (a cost is a total, so an average), each with its moving-block bootstrap
interval. Read it in the all-in mode (``--frozen-background`` with ~1 s blocks,
``--block-steps 1500`` for the MLP, 200 for the GPT), where the exporter process and the
receiver work inside the clock; ``--save PATH`` keeps every block's raw figures and
``--combine`` pools several saves. ``OTEL_TRAIN_EXPORT_PROCESS_NICE=0`` runs the exporter
process un-niced.

The machine is shared: absolute figures are noisy; read the paired ratios.

Usage::

    python benchmarks/bench_training_loop.py                 # full (~10-15 min)
    python benchmarks/bench_training_loop.py --smoke         # seconds; the test runs it
    python benchmarks/bench_training_loop.py --workloads mlp --threads 1 --pairs 20
    python benchmarks/bench_training_loop.py --workloads mlp --threads 1 --block-steps 1500 \
        --pairs 100 --variants otel-otlp --no-memory --frozen-background  # all-in, own cost
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loop_tables import (  # noqa: E402
    EXPORTING,
    FREEZABLE,
    HEADER,
    IN_PROCESS,
    OPT_IN,
    PEER_MODULES,
    PEERS,
    _report_variant,
    _row,
    combine,
)
from bench_loop_workloads import (  # noqa: E402
    Workload,
    _Timers,
    loop_bare,
    loop_otel,
    loop_spans,
    loop_traceml,
)
from bench_support import (  # noqa: E402
    ROOT,
    FrozenBackground,
    GcCounter,
    ProcessCpu,
    ReceiverProcess,
    ThreadClock,
    exporter_pid,
    timed_block,
)

SAMPLED_RATIO = 0.1  # otel-sampled
THROUGHPUT = {"flops_per_step": 1e9, "peak_flops_per_second": 1e12}  # otel-throughput
BLOCK_STEPS = {"gpt": 50, "mlp": 100}
SMOKE_BLOCK_STEPS = {"gpt": 5, "mlp": 10}
EVAL_EVERY = 50


# -- one worker process: a series of paired blocks --------------------------------------

def _set_threads(threads: int) -> None:
    import torch

    if threads > 0:
        torch.set_num_threads(threads)


def worker_in_process(cfg: dict[str, Any]) -> dict[str, Any]:
    """Each of ``cfg['variants']`` in turn: a series of paired blocks; figures by variant."""
    _set_threads(cfg["threads"])
    w = Workload(cfg["workload"], cfg["eval_every"])
    clock = ThreadClock()
    gcc = GcCounter()
    return {v: _series(v, w, clock, gcc, cfg) for v in cfg["variants"]}


def _series(variant: str, w: Workload, clock: ThreadClock, gcc: GcCounter,
            cfg: dict[str, Any]) -> dict[str, Any]:
    """Bare and ``variant`` blocks alternating (ABBA) in this process."""
    import torch

    n = cfg["block_steps"]
    tmp = tempfile.mkdtemp(prefix="bench-loop-")
    run = provider = None
    spans_built = 0
    devnull = open(os.devnull, "w")
    stderr = sys.stderr
    import otel_train

    if variant in EXPORTING:
        sys.stderr = devnull  # the console report (stderr) is on: its cost counts, not its text
        run = otel_train.start_run(
            exporter="otlp", otlp_endpoint=cfg["endpoint"], otlp_protocol="http/protobuf",
            prometheus_port=0, console=True, status_dir=tmp, service_name="bench",
            export_process=variant != "otel-thread",
            sample_ratio=SAMPLED_RATIO if variant == "otel-sampled" else None,
            background_cpus="off" if variant == "otel-any-cpu" else "auto",
            # otel-otlp: the default step ring (auto), or OTEL_TRAIN_STEP_RING's choice.
            **({"step_ring": "on"} if variant == "otel-ring"
               else {"step_ring": "off"} if variant == "otel-queue" else {}),
            **(THROUGHPUT if variant == "otel-throughput" else {}))
    elif variant == "otel-none":
        run = otel_train.start_run(exporter="none", prometheus_port=None, console=False,
                                   status_dir=tmp, service_name="bench")
    if variant == "otel-sdk":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=Resource.create({"service.name": "bench-sdk"}))
        provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=cfg["endpoint"] + "/v1/traces")))
        tracer = provider.get_tracer("bench")
        body = lambda: loop_spans(w, n, tracer.start_as_current_span)  # noqa: E731
        drain = lambda: provider.force_flush()  # noqa: E731
    elif variant == "timestamps":
        timers = _Timers().__getitem__
        body = lambda: loop_spans(w, n, timers)  # noqa: E731
        drain = None
    elif variant == "record-function":
        body = lambda: loop_spans(w, n, torch.profiler.record_function)  # noqa: E731
        drain = None
    elif variant == "instrument":
        holder: list[Any] = []

        def body() -> None:
            loop_bare(w, n)

        def drain() -> None:
            holder.pop().uninstrument()
            flush_in_process(run)
    elif variant == "otel-recorder":
        from otel_train.common.drop_counter import DropCounter
        from otel_train.recording.recorder import Recorder

        recorder = Recorder(10 * n, DropCounter(), None)  # host clock, as the CPU runs
        body = lambda: loop_otel(w, n, recorder)  # noqa: E731
        drain = recorder.queue.clear
    elif variant == "otel-paused":
        worker = run._telemetry.worker

        def body() -> None:
            worker.paused = True
            loop_otel(w, n, run)

        def drain() -> None:
            worker.paused = False
            flush_in_process(run)
    else:
        body = lambda: loop_otel(w, n, run)  # noqa: E731
        drain = lambda: flush_in_process(run)  # noqa: E731
    bare = lambda: loop_bare(w, n)  # noqa: E731
    child = ProcessCpu(exporter_pid(run)) if run is not None else None
    settle = run.flush if run is not None else None
    frozen = None
    if cfg.get("frozen_background"):  # the background works in the variant blocks only
        frozen = FrozenBackground(run._telemetry.worker,
                                  [exporter_pid(run), cfg.get("receiver_pid")])
        drain = settle = None

    meter = run.self_cost if run is not None else None

    def run_variant() -> dict[str, int]:
        if variant == "instrument":  # hooks go on outside the clock (off in the drain)
            holder.append(otel_train.instrument(w.model, w.opt, dataloader=w.loader, run=run))
        parts0 = meter.lost_parts() if meter is not None else (0.0, 0.0)
        if frozen is not None:
            frozen.thaw()
        # The exporter process finishes sending outside the clock: its work is another
        # process's (expCPU), and must not spill into the next (bare) block either. Frozen,
        # what the block leaves waits for the next variant block instead.
        got = timed_block(clock, body, drain, child, settle=settle)
        if frozen is not None:
            frozen.freeze()
        if meter is not None:  # what the run reports it cost the block's steps: the
            # interference's busy steps are charged at the slope the whole run ends with
            parts = meter.lost_parts()
            got["reported_accounted"] = int(parts[0] - parts0[0])
            got["reported_busy_steps"] = int(round(parts[1] - parts0[1]))
        return got

    try:
        pairs, gc_bare, gc_var = _pairs(run_variant, lambda: timed_block(clock, bare), gcc,
                                        cfg["pairs"])
    finally:
        if frozen is not None:
            frozen.thaw()
    slope = None
    if meter is not None:  # the blocks' busy steps at the slope the whole run ends with
        slope = meter.interference.slope_ns()
        for got in pairs:
            v = got["var"]
            v["reported_lost"] = int(v.pop("reported_accounted")
                                     + (slope or 0.0) * v.pop("reported_busy_steps"))

    memory = None
    if (cfg.get("memory") and frozen is None
            and variant in ("otel-otlp", "otel-thread", "otel-sdk")):
        memory = {"bare": _traced_block(bare, None), "var": _traced_block(body, drain)}
        memory["steps"] = n
    if run is not None:
        run.flush()
        spans_built = run._telemetry.worker.spans_built
        client = run._telemetry.client
        if client is not None and client.reads_ring:  # the ring's steps, built over there
            ring = client._reports.ring_counts
            spans_built += ring.get("warm_spans", 0) + ring.get("cold_spans", 0)
        run.shutdown()
    if provider is not None:
        provider.shutdown()
    sys.stderr = stderr
    devnull.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return {"pairs": pairs, "steps": n, "gc_bare": gc_bare, "gc_var": gc_var,
            "gc_steps": n * cfg["pairs"], "gc_bare_steps": n * (cfg["pairs"] + 1),
            "spans_built": spans_built, "memory": memory,
            "interference_slope_ns": slope, "frozen_background": frozen is not None,
            "leftover_ns": frozen.leftover_ns if frozen is not None else 0}


def _pairs(run_variant: Any, run_bare: Any, gcc: GcCounter,
           count: int) -> tuple[list[dict[str, Any]], list[int], list[int]]:
    """A warm-up pair, then ``count`` variant blocks each between two bare ones; (pairs,
    gc collections in bare blocks, in variant blocks)."""
    # Warm-up: caches, allocator, first-use paths of both loops.
    run_variant(), run_bare()
    gc.collect()
    pairs = []
    gc_bare, gc_var = [0, 0, 0], [0, 0, 0]

    def counted(which: str) -> dict[str, int]:
        gcc.counts = [0, 0, 0]
        gcc.active = True
        got = run_variant() if which == "var" else run_bare()
        gcc.active = False
        acc = gc_var if which == "var" else gc_bare
        for g in range(3):
            acc[g] += gcc.counts[g]
        return got

    # bare, var, bare, var, ..., bare: each variant block between two bare ones, so the
    # machine's drift over the three cancels to first order (see the module docstring).
    before = counted("bare")
    for _ in range(count):
        var = counted("var")
        after = counted("bare")
        pairs.append({"bare": before, "var": var, "bare_after": after})
        before = after
    return pairs, gc_bare, gc_var


def flush_in_process(run: Any) -> None:
    """What a block left for this process: the span worker's drain (records, derived
    metrics, the frame to the exporter process), or with export in-process, the whole
    flush (the export thread's sending included)."""
    if exporter_pid(run) is not None:
        run._telemetry.worker.drain()
    else:
        run.flush()


def _traced_block(body: Any, drain: Any) -> dict[str, int]:
    """Python memory blocks allocated at peak and kept after one block, under tracemalloc."""
    gc.collect()
    tracemalloc.start()
    base_size, _ = tracemalloc.get_traced_memory()
    body()
    if drain is not None:
        drain()
    gc.collect()
    snap = tracemalloc.take_snapshot()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    stats = snap.statistics("filename")
    return {"kept_blocks": sum(s.count for s in stats), "kept_bytes": sum(s.size for s in stats),
            "peak_bytes": peak - base_size}


def worker_subprocess_block(cfg: dict[str, Any]) -> dict[str, Any]:
    """One warm-up and one timed block of ``cfg['variant']`` (bare or a peer) in this process."""
    _set_threads(cfg["threads"])
    variant, n = cfg["variant"], cfg["block_steps"]
    w = Workload(cfg["workload"], cfg["eval_every"])
    clock = ThreadClock()
    drain = None
    if variant == "bare":
        body = lambda: loop_bare(w, n)  # noqa: E731
    elif variant == "torchtel":
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = cfg["endpoint"]  # read at import
        from opentelemetry import trace
        from torchtel import PyTorchInstrumentor, setup_opentelemetry

        tracer_provider, _ = setup_opentelemetry(service_name="bench-torchtel")
        PyTorchInstrumentor().instrument(model=w.model)
        body = lambda: loop_bare(w, n)  # noqa: E731
        drain = lambda: trace.get_tracer_provider().force_flush()  # noqa: E731
    elif variant == "traceml":
        import traceml_ai as traceml

        traceml.init(mode="auto")
        body = lambda: loop_traceml(w, n, traceml)  # noqa: E731
    else:
        raise ValueError(f"variant must be bare, torchtel or traceml, not {variant!r}")
    timed_block(clock, body, drain)  # warm-up
    gc.collect()
    return {"block": timed_block(clock, body, drain), "steps": n}


# -- the driver ---------------------------------------------------------------------------

def _spawn(cfg: dict[str, Any], launcher: list[str] | None = None,
           timeout_seconds: float = 600) -> dict[str, Any]:
    """Run a worker (this file, ``--worker``) and return its JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cfg = dict(cfg, result_path=str(out))
        args = [str(Path(__file__).resolve()), "--worker", json.dumps(cfg)]
        cmd = (launcher + [args[0], "--args", *args[1:]]) if launcher else [sys.executable, *args]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp,
                              timeout=timeout_seconds)
        if not out.exists():
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-6:]
            raise RuntimeError(f"worker {cfg['variant']} failed (rc {proc.returncode}): "
                               + " | ".join(tail))
        return json.loads(out.read_text())


def _peer_installed(peer: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(PEER_MODULES[peer]) is not None


def run_config(workload: str, threads: int, args: argparse.Namespace,
               receiver: ReceiverProcess) -> None:
    """All variants for one workload and thread setting; prints a table."""
    n = args.block_steps or (SMOKE_BLOCK_STEPS if args.smoke else BLOCK_STEPS)[workload]
    label = "torch default" if threads == 0 else str(threads)
    frozen = "; the background frozen between them" if args.frozen_background else ""
    print(f"\n== {workload}, threads={label}: {args.pairs} pairs of {n}-step blocks{frozen} "
          f"(eval every {args.eval_every}); per-step figures in us, '+' = variant - bare "
          "(paired median)", flush=True)
    print(HEADER)
    base = {"workload": workload, "threads": threads, "block_steps": n,
            "eval_every": args.eval_every, "endpoint": receiver.endpoint, "pairs": args.pairs,
            "frozen_background": args.frozen_background, "receiver_pid": receiver.pid}
    first_bare = True
    ours = [v for v in args.variants if v not in PEERS]
    # One process per variant (isolation); --smoke runs them all in one (fewer startups).
    groups = [ours] if args.smoke else [[v] for v in ours]
    for group in groups:
        before = receiver.count()
        try:
            # Long blocks on a loaded machine take long: 0.1 s per step is ten GPT steps.
            results = _spawn(dict(base, variants=group, mode="pairs", memory=args.memory),
                             timeout_seconds=600 + 0.1 * 2 * (args.pairs + 1) * n * len(group))
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"{','.join(group):<16}  failed: {exc}")
            continue
        finally:  # a worker that died with the receiver stopped must not leave it so
            receiver.resume()
        got = receiver.count() - before
        for variant in group:
            args.saved[f"{workload}/threads={threads}/{variant}"] = dict(
                results[variant], delivered=got if len(group) == 1 else None)
            first_bare = _report_variant(variant, results[variant],
                                         got if len(group) == 1 else None, n, first_bare)
        if len(group) > 1:
            print(f"{'':<16}  spans delivered to the receiver by this process: {got}")
    for peer in PEERS:
        if peer not in args.variants or threads not in args.peer_threads:
            continue
        if not _peer_installed(peer):
            print(f"{peer:<16}  skipped: not installed (pip install -e '.[bench]')")
            continue
        run_peer(peer, base, args, receiver)


def run_peer(peer: str, base: dict[str, Any], args: argparse.Namespace,
             receiver: ReceiverProcess) -> None:
    """Alternating short subprocesses: bare, peer, peer, bare, ..."""
    launcher = None
    if peer == "traceml":
        exe = shutil.which("traceml") or str(Path(sys.executable).parent / "traceml")
        launcher = [exe, "run", "--mode", "summary", "--logs-dir",
                    tempfile.mkdtemp(prefix="bench-traceml-"), "--finalize-timeout-sec", "20"]
    pairs = []
    before = receiver.count()
    try:
        for i in range(args.subprocess_pairs):
            order = ("bare", peer) if i % 2 == 0 else (peer, "bare")
            got = {}
            for v in order:
                res = _spawn(dict(base, variant=v, mode="block"),
                             launcher=launcher if v == peer else None)
                got["bare" if v == "bare" else "var"] = res["block"]
            pairs.append((got["bare"], got["var"]))
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"{peer:<16}  failed: {exc}")
        return
    delivered = f"{receiver.count() - before} (OTLP/HTTP)" if peer == "torchtel" else \
        "- (own aggregator, no OTLP)"
    print(_row(peer + " (subproc)", pairs, base["block_steps"], delivered, block=1)
          + f"  [{args.subprocess_pairs} subprocess pairs]", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="few, short blocks; no peers")
    ap.add_argument("--workloads", default="gpt,mlp")
    ap.add_argument("--threads", default="1,0", help="comma list; 0 = torch's default")
    ap.add_argument("--variants", default=",".join(IN_PROCESS + PEERS))
    ap.add_argument("--pairs", type=int, default=10, help="paired blocks per variant")
    ap.add_argument("--subprocess-pairs", type=int, default=3, help="pairs of peer processes")
    ap.add_argument("--peer-threads", default="1", help="thread settings the peers run in "
                    "(their subprocesses are slow to start)")
    ap.add_argument("--block-steps", type=int, default=0, help="steps per block (default: "
                    f"{BLOCK_STEPS})")
    ap.add_argument("--eval-every", type=int, default=EVAL_EVERY)
    ap.add_argument("--no-memory", dest="memory", action="store_false",
                    help="skip the tracemalloc blocks")
    ap.add_argument("--frozen-background", action="store_true",
                    help="all-in with short blocks: the run's span worker paused and its "
                    "exporter process and the receiver stopped (SIGSTOP) through the bare "
                    f"blocks, so all of the background's work lands in the variant blocks "
                    f"(variants {', '.join(FREEZABLE)}; no tracemalloc blocks)")
    ap.add_argument("--save", metavar="PATH", help="write every block's raw figures (JSON) there")
    ap.add_argument("--combine", nargs="+", metavar="PATH",
                    help="print the tables of these --save files with their blocks pooled "
                    "(runs nothing)")
    args = ap.parse_args(argv)
    if args.worker:
        cfg = json.loads(args.worker)
        res = worker_in_process(cfg) if cfg["mode"] == "pairs" else worker_subprocess_block(cfg)
        Path(cfg["result_path"]).write_text(json.dumps(res))
        return 0
    if args.combine:
        return combine(args.combine)
    args.workloads = [x for x in args.workloads.split(",") if x]
    args.variants = [x for x in args.variants.split(",") if x]
    threads = [int(x) for x in args.threads.split(",") if x]
    args.peer_threads = [int(x) for x in args.peer_threads.split(",") if x]
    if args.smoke:
        args.pairs, args.eval_every = 2, 5
        threads = [1]
        args.variants = [v for v in args.variants if v not in PEERS]
    for bad in set(args.variants) - set(IN_PROCESS + PEERS + OPT_IN):
        raise SystemExit(f"--variants: unknown variant {bad!r}; known: "
                         f"{IN_PROCESS + PEERS + OPT_IN}")
    if args.frozen_background:
        for bad in set(args.variants) - set(FREEZABLE):
            raise SystemExit(f"--frozen-background: variant {bad!r} has no background to "
                             f"freeze between blocks; use {', '.join(FREEZABLE)}")
    print(f"bench_training_loop: {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.2f}; python {sys.version.split()[0]}")
    receiver = ReceiverProcess()
    args.saved = {}
    t0 = time.monotonic()
    try:
        for workload in args.workloads:
            for th in threads:
                run_config(workload, th, args, receiver)
    finally:
        receiver.close()
        if args.save:
            Path(args.save).write_text(json.dumps(args.saved))
    print(f"\n(total {time.monotonic() - t0:.0f} s) columns: ratio = variant block wall / "
          "bare block wall (steps only); ratio+drain adds the work the block left this process "
          "(the span worker's drain; the whole flush when exporting in-process); stall = "
          "training thread's run-queue wait + blocked time (GIL) per step, "
          "+stall its paired increase over bare, +runq its run-queue part, +GIL its blocked part "
          "(waiting for the GIL, mostly); +thrCPU / +procCPU "
          "= training-thread / whole-process CPU added per step (procCPU includes the drain); "
          "+bgCPU = this process's threads but the training thread, drain included; expCPU = "
          "the exporter process's CPU per step (another process: no GIL of ours); own cost: "
          "the share of the block's time the run reports it lost (SelfCostMeter: hot path + "
          "measured wait on its threads) beside the A/B's, 1 - bare/variant block wall, in %, "
          "and their paired difference in percentage points (read it in the all-in mode, "
          "--frozen-background --block-steps 1500, where the background works inside the "
          "clock).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
