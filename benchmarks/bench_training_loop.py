"""What otel-train costs a real training loop, to 1%, beside the other ways to trace it.

Workloads (CPU): ``gpt``, the demo's tiny GPT (``otel_train.cli.demo.build_model``; ~10 ms per
step), and ``mlp``, a small MLP (~1 ms per step). Each step takes a batch from a
``DataLoader``, runs forward, backward and the optimizer; every 50 steps an eval (validation
loss over a few batches) runs as monitoring. Both with ``torch.set_num_threads(1)`` and with
torch's default thread count.

Variants, each compared with the bare loop:

- ``otel-otlp``: otel-train exporting OTLP/HTTP to a real local receiver (the receivers of
  ``tests/otlp_receivers.py``, in their own process as a collector would be), Prometheus
  metrics served and the console report on (it goes to stderr, sent to /dev/null);
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
  process's work inside the block, at the price of far fewer pairs (wider intervals): read
  both.
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
it lost (``run.self_cost.lost_ns`` over the block: hot path + the training thread's measured
wait on otel-train's threads, docs/monitoring-costs.md) beside the A/B's share of the same
blocks, 1 - bare / variant block wall, and their paired difference in percentage points: means
over the blocks (a cost is a total, so an average), each with its moving-block bootstrap
interval. Read it in the all-in mode (``--block-steps 1500``), where the exporter process and
the receiver work inside the clock; ``--save PATH`` keeps every block's raw figures and
``--combine`` pools several saves. ``OTEL_TRAIN_EXPORT_PROCESS_NICE=0`` runs the exporter
process un-niced.

The machine is shared: absolute figures are noisy; read the paired ratios.

Usage::

    python benchmarks/bench_training_loop.py                 # full (~10-15 min)
    python benchmarks/bench_training_loop.py --smoke         # seconds; the test runs it
    python benchmarks/bench_training_loop.py --workloads mlp --threads 1 --pairs 20
    python benchmarks/bench_training_loop.py --workloads mlp --threads 1 --block-steps 1500 \
        --pairs 20 --variants otel-otlp --no-memory          # all-in, own cost beside it
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_support import (  # noqa: E402
    ROOT,
    GcCounter,
    ProcessCpu,
    ReceiverProcess,
    ThreadClock,
    _fmt_ci,
    exporter_pid,
    timed_block,
)

IN_PROCESS = ("otel-otlp", "otel-thread", "otel-paused", "otel-sampled", "otel-throughput",
              "otel-any-cpu", "otel-none", "otel-recorder", "instrument", "otel-sdk",
              "record-function", "timestamps")
# otel-train runs exporting OTLP
EXPORTING = ("otel-otlp", "otel-thread", "otel-paused", "otel-sampled", "otel-throughput",
             "otel-any-cpu", "instrument")
SAMPLED_RATIO = 0.1  # otel-sampled
THROUGHPUT = {"flops_per_step": 1e9, "peak_flops_per_second": 1e12}  # otel-throughput
PEERS = ("torchtel", "traceml")
PEER_MODULES = {"torchtel": "torchtel", "traceml": "traceml_ai"}
BLOCK_STEPS = {"gpt": 50, "mlp": 100}
SMOKE_BLOCK_STEPS = {"gpt": 5, "mlp": 10}
EVAL_EVERY = 50


# -- workloads ----------------------------------------------------------------------------

class Workload:
    """Model, optimizer, DataLoader, validation batches and one global step counter."""

    def __init__(self, name: str, eval_every: int) -> None:
        import torch
        from torch import nn

        torch.manual_seed(0)
        self.name = name
        self.eval_every = eval_every
        self.k = 0
        if name == "gpt":
            from otel_train.cli.demo import _corpus, build_model

            text = _corpus()
            chars = sorted(set(text))
            data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
            block = 32
            starts = torch.arange(0, len(data) - block - 1, 3)
            xs = torch.stack([data[i:i + block] for i in starts])
            ys = torch.stack([data[i + 1:i + 1 + block] for i in starts])
            self.model = build_model(len(chars), block_size=block)
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-3)
            batch = 8

            def forward(x: Any, y: Any) -> Any:
                return self.model(x, y)[1]
        else:
            xs = torch.randn(8192, 128)
            ys = torch.randint(10, (8192,))
            self.model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256),
                                       nn.ReLU(), nn.Linear(256, 10))
            self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
            batch = 32
            loss_fn = nn.functional.cross_entropy

            def forward(x: Any, y: Any) -> Any:
                return loss_fn(self.model(x), y)
        self.forward = forward
        dataset = torch.utils.data.TensorDataset(xs, ys)
        self.loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True,
                                                  drop_last=True)
        self.val = [(xs[i * batch:(i + 1) * batch], ys[i * batch:(i + 1) * batch])
                    for i in range(4)]

    def batches(self, n: int) -> Any:
        """A fresh DataLoader iterator (one per block, in every variant), cycling."""
        it = iter(self.loader)
        for _ in range(n):
            try:
                yield next(it)
            except StopIteration:
                it = iter(self.loader)
                yield next(it)

    def evaluate(self) -> None:
        """Validation loss over the held batches (the monitoring work)."""
        import torch

        self.model.eval()
        with torch.no_grad():
            for vx, vy in self.val:
                self.forward(vx, vy).item()
        self.model.train()


def loop_bare(w: Workload, n: int) -> None:
    """The user's loop, nothing added."""
    forward, opt = w.forward, w.opt
    for x, y in w.batches(n):
        loss = forward(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        w.k += 1
        if w.k % w.eval_every == 0:
            w.evaluate()


def loop_otel(w: Workload, n: int, run: Any) -> None:
    """The README's loop: run.steps (data phase) + forward/backward/optimizer + monitor."""
    forward, opt = w.forward, w.opt
    for step in run.steps(w.batches(n), loader="train"):
        x, y = step.batch
        with step.phase("forward"):
            loss = forward(x, y)
        with step.phase("backward"):
            loss.backward()
        with step.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        w.k += 1
        if w.k % w.eval_every == 0:
            with step.monitor("val_loss"):
                w.evaluate()


def loop_spans(w: Workload, n: int, span: Any) -> None:
    """Same loop, ``span(name)`` around the step and each phase (SDK or record_function)."""
    forward, opt = w.forward, w.opt
    it = w.batches(n)
    for _ in range(n):
        with span("train.step"):
            with span("data"):
                x, y = next(it)
            with span("forward"):
                loss = forward(x, y)
            with span("backward"):
                loss.backward()
            with span("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            w.k += 1
            if w.k % w.eval_every == 0:
                with span("val_loss"):
                    w.evaluate()


class _TimestampTimer:
    """The floor: an empty context manager that takes two timestamps (keeps nothing)."""

    __slots__ = ("t",)

    def __enter__(self, _clock: Any = time.perf_counter_ns) -> _TimestampTimer:
        self.t = _clock()
        return self

    def __exit__(self, *exc: object, _clock: Any = time.perf_counter_ns) -> None:
        _clock()


class _Timers(dict):  # type: ignore[type-arg]
    """name -> a reusable timer, found by a C-level lookup (as otel-train's phases are)."""

    def __missing__(self, name: str) -> _TimestampTimer:
        timer = self[name] = _TimestampTimer()
        return timer


def loop_traceml(w: Workload, n: int, traceml: Any) -> None:
    """traceml's documented plain-PyTorch loop: trace_step around each step."""
    forward, opt = w.forward, w.opt
    for x, y in w.batches(n):
        with traceml.trace_step(w.model):
            loss = forward(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        w.k += 1
        if w.k % w.eval_every == 0:
            w.evaluate()


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

    meter = run.self_cost if run is not None else None

    def run_variant() -> dict[str, int]:
        if variant == "instrument":  # hooks go on outside the clock (off in the drain)
            holder.append(otel_train.instrument(w.model, w.opt, dataloader=w.loader, run=run))
        parts0 = meter.lost_parts() if meter is not None else (0.0, 0.0)
        # The exporter process finishes sending outside the clock: its work is another
        # process's (expCPU), and must not spill into the next (bare) block either.
        got = timed_block(clock, body, drain, child, settle=run.flush if run else None)
        if meter is not None:  # what the run reports it cost the block's steps: the
            # interference's busy steps are charged at the slope the whole run ends with
            parts = meter.lost_parts()
            got["reported_accounted"] = int(parts[0] - parts0[0])
            got["reported_busy_steps"] = int(round(parts[1] - parts0[1]))
        return got

    # Warm-up: caches, allocator, first-use paths of both loops.
    run_variant(), timed_block(clock, bare)
    gc.collect()
    pairs = []
    gc_bare, gc_var = [0, 0, 0], [0, 0, 0]

    def counted(which: str) -> dict[str, int]:
        gcc.counts = [0, 0, 0]
        gcc.active = True
        got = run_variant() if which == "var" else timed_block(clock, bare)
        gcc.active = False
        acc = gc_var if which == "var" else gc_bare
        for g in range(3):
            acc[g] += gcc.counts[g]
        return got

    # bare, var, bare, var, ..., bare: each variant block between two bare ones, so the
    # machine's drift over the three cancels to first order (see the module docstring).
    before = counted("bare")
    for _ in range(cfg["pairs"]):
        var = counted("var")
        after = counted("bare")
        pairs.append({"bare": before, "var": var, "bare_after": after})
        before = after
    slope = None
    if meter is not None:  # the blocks' busy steps at the slope the whole run ends with
        slope = meter.interference.slope_ns()
        for got in pairs:
            v = got["var"]
            v["reported_lost"] = int(v.pop("reported_accounted")
                                     + (slope or 0.0) * v.pop("reported_busy_steps"))

    memory = None
    if cfg.get("memory") and variant in ("otel-otlp", "otel-thread", "otel-sdk"):
        memory = {"bare": _traced_block(bare, None), "var": _traced_block(body, drain)}
        memory["steps"] = n
    if run is not None:
        run.flush()
        spans_built = run._telemetry.worker.spans_built
        run.shutdown()
    if provider is not None:
        provider.shutdown()
    sys.stderr = stderr
    devnull.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return {"pairs": pairs, "steps": n, "gc_bare": gc_bare, "gc_var": gc_var,
            "gc_steps": n * cfg["pairs"], "gc_bare_steps": n * (cfg["pairs"] + 1),
            "spans_built": spans_built, "memory": memory,
            "interference_slope_ns": slope}


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


def _interpolated(p: dict[str, dict[str, int]]) -> tuple[dict[str, float], dict[str, int]]:
    """(the bare blocks either side of the variant block, averaged; the variant block)."""
    b0, b1 = p["bare"], p["bare_after"]
    return {k: (b0[k] + b1[k]) / 2 for k in b0}, p["var"]


def _row(name: str, pairs: list[tuple[dict[str, Any], dict[str, int]]], steps: int,
         delivered: str, block: int = 2) -> str:
    """One table row from (bare, variant) block pairs; ``block``: neighbouring pairs that
    share a bare block, resampled together in the bootstrap."""
    ratio = [v["wall"] / b["wall"] for b, v in pairs]  # per step: blocks have equal steps
    ratio_d = [(v["wall"] + v["drain_wall"]) / b["wall"] for b, v in pairs]
    us = 1000.0 * steps

    def med(f: Any) -> float:
        return statistics.median(f(b, v) for b, v in pairs) / us

    stall = med(lambda b, v: v["runq"] + v["blocked"])
    stall_d = med(lambda b, v: (v["runq"] + v["blocked"]) - (b["runq"] + b["blocked"]))
    runq_d = med(lambda b, v: v["runq"] - b["runq"])
    gil_d = med(lambda b, v: v["blocked"] - b["blocked"])
    tcpu_d = med(lambda b, v: v["thread_cpu"] - b["thread_cpu"])
    pcpu_d = med(lambda b, v: v["proc_cpu"] + v["drain_proc_cpu"] - b["proc_cpu"])
    # Background CPU in this process: all threads but the training thread, drain included.
    bg = med(lambda b, v: (v["proc_cpu"] + v["drain_proc_cpu"] - v["thread_cpu"]
                           - v["drain_thread_cpu"]) - (b["proc_cpu"] - b["thread_cpu"]))
    child = med(lambda b, v: v.get("child_cpu", 0))
    return (f"{name:<16}{_fmt_ci(ratio, block):>24}{_fmt_ci(ratio_d, block):>24}"
            f"{stall:9.0f}{stall_d:+8.0f}"
            f"{runq_d:+8.0f}{gil_d:+8.0f}{tcpu_d:+9.0f}{pcpu_d:+9.0f}{bg:+8.0f}"
            f"{child:8.0f}  {delivered}")


def _own_cost_line(pairs: list[tuple[dict[str, Any], dict[str, int]]]) -> str:
    """The share of the loop's time the run reports it lost (``SelfCostMeter.lost_ns`` over
    the block's wall) beside the A/B's share, 1 - bare / variant, and their difference, each
    with its moving-block bootstrap interval.

    Shares are taken from the mean of per-pair log ratios (1 - exp(-mean log(variant /
    bare)): a geometric mean). A block's speed moves by ~15% on a noisy machine, and that
    noise multiplies: the arithmetic mean of per-pair shares 1 - bare / variant is pulled
    low by it (a fast variant block gives a large negative share, a slow one at most +1),
    by ~1 percentage point over 600 MLP pairs here, where the log ratio is symmetric and
    agrees with the ratio column's median.
    """
    logs = [(math.log(v["wall"] / b["wall"]),
             -math.log(max(1e-9, 1.0 - v["reported_lost"] / v["wall"]))) for b, v in pairs]

    def share(column: int) -> Any:
        return lambda rows: 100.0 * (1.0 - math.exp(-statistics.fmean(r[column] for r in rows)))

    def gap(rows: list[tuple[float, float]]) -> float:  # reported - A/B, in points
        return share(1)(rows) - share(0)(rows)

    return (f"{'':<16}  own cost: A/B share {_fmt_ci(logs, 2, share(0))} %, reported "
            f"{_fmt_ci(logs, 2, share(1))} %, reported - A/B {_fmt_ci(logs, 2, gap)} pp")


HEADER = (f"{'variant':<16}{'ratio [95% CI]':>24}{'ratio+drain [95% CI]':>24}"
          f"{'stall':>9}{'+stall':>8}{'+runq':>8}{'+GIL':>8}{'+thrCPU':>9}{'+procCPU':>9}"
          f"{'+bgCPU':>8}{'expCPU':>8}  spans delivered")


def _bare_line(pairs: list[tuple[dict[str, int], dict[str, int]]], steps: int) -> str:
    us = 1000.0 * steps
    b = [p[0] for p in pairs]

    def med(key: str) -> float:
        return statistics.median(x[key] for x in b) / us

    return (f"{'bare':<16}  {med('wall') / 1000:.2f} ms/step; training thread CPU "
            f"{med('thread_cpu'):.0f} us, process CPU {med('proc_cpu'):.0f} us, "
            f"stall {med('runq') + med('blocked'):.0f} us (run-queue {med('runq'):.0f}) per step")


def _peer_installed(peer: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(PEER_MODULES[peer]) is not None


def run_config(workload: str, threads: int, args: argparse.Namespace,
               receiver: ReceiverProcess) -> None:
    """All variants for one workload and thread setting; prints a table."""
    n = args.block_steps or (SMOKE_BLOCK_STEPS if args.smoke else BLOCK_STEPS)[workload]
    label = "torch default" if threads == 0 else str(threads)
    print(f"\n== {workload}, threads={label}: {args.pairs} pairs of {n}-step blocks "
          f"(eval every {args.eval_every}); per-step figures in us, '+' = variant - bare "
          "(paired median)", flush=True)
    print(HEADER)
    base = {"workload": workload, "threads": threads, "block_steps": n,
            "eval_every": args.eval_every, "endpoint": receiver.endpoint, "pairs": args.pairs}
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


def _report_variant(variant: str, res: dict[str, Any], got: int | None, n: int,
                    first_bare: bool) -> bool:
    """Print one variant's row (and gc/tracemalloc lines); False once bare was printed."""
    pairs = [_interpolated(p) for p in res["pairs"]]
    if first_bare:
        print(_bare_line(pairs, n))
        first_bare = False
    if got is None and variant in (*EXPORTING, "otel-sdk"):
        delivered = "(one process for all: total below)"
    elif variant == "otel-sampled":
        delivered = f"{got}/{res['spans_built']} built (the rest sampled out)"
    elif variant in EXPORTING:
        delivered = f"{got}/{res['spans_built']} built"
    elif variant == "otel-none":
        delivered = f"0 (exporter none; {res['spans_built']} built)"
    elif variant == "otel-sdk":
        delivered = f"{got} (SDK BatchSpanProcessor)"
    else:
        delivered = "- (no export)"
    print(_row(variant, pairs, n, delivered), flush=True)
    if all("reported_lost" in v for _, v in pairs):
        slope = res.get("interference_slope_ns") or 0.0
        print(_own_cost_line(pairs) + f"; interference slope {slope / 1e3:.1f} us per busy "
              f"step", flush=True)
    gc_steps = res["gc_steps"]
    if variant in ("otel-otlp", "otel-thread", "otel-sdk"):
        def per_k(c: list[int], steps: int) -> str:
            return "/".join(f"{1000 * x / steps:.1f}" for x in c)

        print(f"{'':<16}  gc collections per 1000 steps (gen0/1/2): bare "
              f"{per_k(res['gc_bare'], res.get('gc_bare_steps', gc_steps))}, {variant} "
              f"{per_k(res['gc_var'], gc_steps)}")
    mem = res.get("memory")
    if mem:
        s = mem["steps"]

        def per_step(m: dict[str, int]) -> str:
            return (f"kept {m['kept_blocks'] / s:.1f} blocks ({m['kept_bytes'] / s:.0f} B), "
                    f"peak {m['peak_bytes'] / s:.0f} B")

        print(f"{'':<16}  tracemalloc per step: bare {per_step(mem['bare'])}; "
              f"{variant} {per_step(mem['var'])}")
    return first_bare


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


def combine(paths: list[str]) -> int:
    """The tables of several ``--save`` files, their blocks pooled (variant by variant): one
    long comparison run in pieces, each piece its own process."""
    pooled: dict[str, dict[str, Any]] = {}
    for path in paths:
        try:
            saved = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"--combine: cannot read {path}: {exc}") from None
        for key, res in saved.items():
            into = pooled.get(key)
            if into is None:
                pooled[key] = dict(res, runs=1, slopes=[res.get("interference_slope_ns") or 0.0])
                continue
            if res["steps"] != into["steps"]:
                raise SystemExit(f"--combine: {key} has {res['steps']}-step blocks in {path}, "
                                 f"{into['steps']} before: only blocks of one length pool")
            into["pairs"] = into["pairs"] + res["pairs"]
            into["runs"] += 1
            into["slopes"].append(res.get("interference_slope_ns") or 0.0)
            for k in ("gc_steps", "gc_bare_steps", "spans_built"):
                into[k] = into.get(k, 0) + res.get(k, 0)
            for k in ("gc_bare", "gc_var"):
                into[k] = [a + b for a, b in zip(into[k], res[k])]
            into["delivered"] = (None if into.get("delivered") is None
                                 or res.get("delivered") is None
                                 else into["delivered"] + res["delivered"])
            into["memory"] = None
    workload_threads = None
    first_bare = True
    for key, res in pooled.items():
        head, variant = key.rsplit("/", 1)
        if head != workload_threads:
            workload_threads, first_bare = head, True
            print(f"\n== {head}: {len(res['pairs'])} pairs of {res['steps']}-step blocks from "
                  f"{res['runs']} run(s), pooled")
            print(HEADER)
        res["interference_slope_ns"] = statistics.fmean(res["slopes"])
        first_bare = _report_variant(variant, res, res.get("delivered"), res["steps"],
                                     first_bare)
        if res["runs"] > 1:
            print(f"{'':<16}  interference slope by run (us per busy step): "
                  + ", ".join(f"{x / 1e3:.1f}" for x in res["slopes"]))
    return 0


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
    for bad in set(args.variants) - set(IN_PROCESS + PEERS):
        raise SystemExit(f"--variants: unknown variant {bad!r}; known: {IN_PROCESS + PEERS}")
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
          "--block-steps 1500, where the background works inside the clock).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
