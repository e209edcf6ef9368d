"""What each ``device_sync`` mode costs a training loop on an accelerator, and whether the
monitoring share and the own cost it reports are true: one command, one table.

Workloads (``bench_gpu_workloads.py``), on the accelerator found (``torch.accelerator``, else
CUDA):

- ``gpt``: a 168M-parameter GPT (d 1024, 8 layers, 16 heads, seq 1024, batch 8, vocab 32768;
  ``scaled_dot_product_attention``), bf16 autocast, fused AdamW;
- ``mlp``: a 4-layer 2048-wide MLP (batch 256, 2048 classes), bf16 autocast, fused AdamW: a
  short, launch-bound step.

Every 10 steps the loop monitors: ``val_loss`` (one forward on a held batch and ``.item()``)
and ``inference`` (8 greedy decode steps over the held batch, read back with ``.tolist()``),
each in ``step.monitor(...)``. Training steps call ``step.set_attribute("train.loss", loss)``
(the loss tensor, read by the run) unless the variant says not to.

Method. Paired blocks (30 GPT steps, 1000 MLP steps), bare and variant, the order alternating
from pair to pair (bare first, then variant first), after one warm-up pair; each block ends
with a device synchronize inside its clock, so a block's wall time is its device work too.
Variants: one otel-train run per ``device_sync`` mode (``auto``, ``sync``, ``events``,
``monitor_sync``; a mode this otel-train does not accept is skipped with a line saying so),
``auto`` without the loss attribute, and the hand-synced truth: the bare loop with a
synchronize before and after each monitoring call, timing them (every monitoring shape was
warmed first). The runs export OTLP/HTTP to a real receiver in its own process, Prometheus
on, the console on (to /dev/null).

Printed (one markdown table): per variant, the step time against bare (median of the pairs'
ratios, bootstrap 95% interval); the monitoring share the run reports (``run.costs()``:
monitoring over training time, over the timed blocks) against the hand-synced truth; the
own cost the run reports (``run.self_cost``'s lost time from the warm-up's end to the
series' end, every timed step drained, over the variant blocks' wall; the interference
charged at the run's final slope) against the A/B (1 - bare / variant, from the mean log
ratio); and, in the training process, background CPU (process CPU minus the training
thread's) and the training thread's blocked time (the GIL wait, mostly: wall - on-CPU -
run-queue, ``/proc/self/task/<tid>/schedstat``) per step, each minus bare's of the same
pair. ``--save PATH`` keeps every block's figures as JSON. Progress goes to stderr, one
line per pair of blocks.

Sized for ~4 minutes on one H100/H200-class GPU. Without an accelerator it runs only with
``--smoke`` (tiny sizes, one pair of short blocks, seconds: the same code path on the CPU,
which the test runs; its figures are not measurements).

Usage::

    python benchmarks/bench_gpu_default.py                       # on the GPU (~4 min)
    python benchmarks/bench_gpu_default.py --save gpu_default.json
    python benchmarks/bench_gpu_default.py --smoke               # CPU, seconds
    python benchmarks/bench_gpu_default.py --workloads mlp --pairs 10 --modes auto,events
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_support import (  # noqa: E402  (adds the repository root to sys.path)
    ReceiverProcess,
    ThreadClock,
    _median_ci,
    live_run,
)
from bench_gpu_workloads import (  # noqa: E402
    EVAL_EVERY,
    Device,
    Workload,
    loop_bare,
    loop_otel,
    loop_truth,
)

MODES = ("auto", "sync", "events", "monitor_sync")


def _progress(line: str) -> None:
    """One progress line on the real stderr (``live_run`` sends sys.stderr to /dev/null)."""
    print(line, file=sys.__stderr__, flush=True)


# -- the blocks -----------------------------------------------------------------------------

def _block(clock: ThreadClock, body: Any, device: Device) -> dict[str, int]:
    """One block's figures (ns): wall, training-thread CPU, process CPU, run-queue wait and
    blocked time; the block ends with a synchronize, inside its clock."""
    a = clock.read()
    body()
    device.synchronize()
    b = clock.read()
    wall, on_cpu, runq = b[0] - a[0], b[3] - a[3], b[4] - a[4]
    return {"wall": wall, "thread_cpu": b[1] - a[1], "proc_cpu": b[2] - a[2], "runq": runq,
            "blocked": max(0, wall - on_cpu - runq)}


def _series(label: str, bare: Any, variant: Any, pairs: int, clock: ThreadClock,
            device: Device, after_warmup: Any = None) -> list[list[Any]]:
    """A warm-up pair, then ``after_warmup()``, then ``pairs`` pairs (bare, variant), the
    order alternating; returns [bare figures, variant figures] per pair."""
    def var_block() -> dict[str, Any]:
        return _block(clock, variant, device)

    _block(clock, bare, device)
    var_block()
    if after_warmup is not None:
        after_warmup()
    out: list[list[Any]] = []
    for i in range(pairs):
        if i % 2 == 0:
            b = _block(clock, bare, device)
            v = var_block()
        else:
            v = var_block()
            b = _block(clock, bare, device)
        out.append([b, v])
        _progress(f"  {label}: pair {i + 1}/{pairs} bare {b['wall'] / 1e6:.1f} ms, "
                  f"variant {v['wall'] / 1e6:.1f} ms ({v['wall'] / b['wall']:.3f}x)")
    return out


def _otel_variant(w: Workload, device: Device, mode: str, loss_attribute: bool, pairs: int,
                  steps: int, endpoint: str, clock: ThreadClock) -> dict[str, Any]:
    """One run with ``device_sync=mode``: its paired blocks and what it reported of them."""
    label = f"{w.name} {mode}{'' if loss_attribute else ' no-loss-attr'}"
    with live_run(endpoint, f"bench-gpu-{w.name}", device_sync=mode) as (run, _tmp):
        meter = run.self_cost
        start: dict[str, Any] = {}

        def after_warmup() -> None:
            run.flush()  # the warm-up pair's steps are in the figures read next
            start["costs"] = run.costs()
            start["lost_parts"] = meter.lost_parts()

        got = _series(label, lambda: loop_bare(w, steps),
                      lambda: loop_otel(w, steps, run, loss_attribute), pairs, clock, device,
                      after_warmup)
        run.flush()  # every timed step drained: its hot path and device work accounted
        end = run.costs()
        parts = meter.lost_parts()
        # What the run reports the timed steps lost, read over the whole series (the span
        # worker accounts steps when it drains them, often a block later): the hot path,
        # the waits and the device work it timed, and the background's interference, its
        # busy steps charged at the slope the run ends with (as bench_training_loop.py).
        slope = meter.interference.slope_ns() or 0.0
        reported_lost = (parts[0] - start["lost_parts"][0]
                         + slope * (parts[1] - start["lost_parts"][1]))
    first = start["costs"]
    monitoring = end["monitoring_time_seconds"] - first["monitoring_time_seconds"]
    training = end["training_time_seconds"] - first["training_time_seconds"]
    return {"pairs": got, "steps": steps, "reported_monitoring_seconds": monitoring,
            "reported_training_seconds": training, "reported_lost_ns": reported_lost}


def _truth_variant(w: Workload, device: Device, pairs: int, steps: int,
                   clock: ThreadClock) -> dict[str, Any]:
    """The bare loop with each monitoring call synced and timed by hand."""
    monitoring_ns = [0]

    def after_warmup() -> None:
        monitoring_ns[0] = 0  # only the timed pairs' monitoring

    got = _series(f"{w.name} truth", lambda: loop_bare(w, steps),
                  lambda: loop_truth(w, steps, device, monitoring_ns), pairs, clock, device,
                  after_warmup)
    variant_wall = sum(v["wall"] for _, v in got)
    return {"pairs": got, "steps": steps, "monitoring_ns": monitoring_ns[0],
            "truth_share": monitoring_ns[0] / max(1, variant_wall - monitoring_ns[0])}


# -- the figures ----------------------------------------------------------------------------

def accepted_modes(modes: list[str]) -> tuple[list[str], dict[str, str]]:
    """The modes ``device_sync`` accepts here, and why each other one is refused."""
    from otel_train.common.options import RunOptions

    ok, refused = [], {}
    for mode in modes:
        try:
            RunOptions.resolve(environ={}, device_sync=mode)
        except ValueError as exc:
            refused[mode] = str(exc)
        else:
            ok.append(mode)
    return ok, refused


def summarize(res: dict[str, Any]) -> dict[str, Any]:
    """A variant's figures: the step ratio [CI], background CPU and blocked time per step
    against bare (us), and for a run its reported monitoring share and own cost."""
    pairs, steps = res["pairs"], res["steps"]
    ratios = [v["wall"] / b["wall"] for b, v in pairs]

    def per_step_delta(fn: Any) -> float:
        return statistics.median(fn(v) - fn(b) for b, v in pairs) / steps / 1000.0

    out: dict[str, Any] = {
        "ratio": _median_ci(ratios),
        "bare_ms_per_step": statistics.median(b["wall"] for b, _ in pairs) / steps / 1e6,
        "background_cpu_us": per_step_delta(lambda x: x["proc_cpu"] - x["thread_cpu"]),
        "blocked_us": per_step_delta(lambda x: x["blocked"]),
    }
    if "reported_training_seconds" in res:
        out["monitoring_share"] = (res["reported_monitoring_seconds"]
                                   / max(1e-12, res["reported_training_seconds"]))
        mean_log = statistics.fmean(math.log(r) for r in ratios)
        out["ab_share"] = 1.0 - math.exp(-mean_log)
        out["reported_share"] = res["reported_lost_ns"] / max(1, sum(v["wall"]
                                                                     for _, v in pairs))
    if "truth_share" in res:
        out["truth_share"] = res["truth_share"]
    return out


def _pct(x: float | None, decimals: int = 1) -> str:
    return "-" if x is None else f"{100.0 * x:.{decimals}f}%"


def format_table(summaries: dict[str, dict[str, Any]], variants: list[str],
                 refused: dict[str, str], workloads: list[str]) -> str:
    """The one markdown table: a row per variant, the workloads side by side."""
    truth = {w: summaries.get(w, {}).get("truth", {}).get("truth_share") for w in workloads}
    truth_text = ", ".join(f"{w} {_pct(truth[w])}" for w in workloads)
    head = ["variant"] + [f"{w} step vs bare [95% CI]" for w in workloads] + [
        f"monitoring share reported (truth: {truth_text})",
        "own cost reported / A/B",
        "background CPU / blocked (GIL) per step vs bare"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for variant in variants + ["truth"]:
        if variant in refused:
            lines.append(f"| `{variant}` | skipped: device_sync does not accept it here |"
                         + " |" * (len(head) - 2))
            continue
        cells = [_variant_label(variant)]
        shares, own, bg = [], [], []
        for w in workloads:
            s = summaries.get(w, {}).get(variant)
            if s is None:
                cells.append("-")
                continue
            med, lo, hi = s["ratio"]
            cells.append(f"{med:.3f}x [{lo:.3f}, {hi:.3f}]")
            if "monitoring_share" in s:
                shares.append(f"{w} {_pct(s['monitoring_share'])}")
                own.append(f"{w} {_pct(s['reported_share'], 2)} / {_pct(s['ab_share'], 2)}")
            bg.append(f"{w} {s['background_cpu_us']:+.0f} / {s['blocked_us']:+.0f} us")
        cells += ["; ".join(shares) or "-", "; ".join(own) or "-", "; ".join(bg)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _variant_label(variant: str) -> str:
    if variant == "truth":
        return "bare, monitoring synced and timed by hand (the truth)"
    if variant.endswith(":no-loss-attr"):
        return f"`{variant.split(':')[0]}`, no `set_attribute(\"train.loss\", loss)`"
    return f"`{variant}`"


# -- the command ----------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="gpt,mlp", help="comma list of gpt, mlp")
    ap.add_argument("--modes", default=",".join(MODES),
                    help=f"comma list of device_sync modes (default {','.join(MODES)})")
    ap.add_argument("--pairs", type=int, default=None, help="timed pairs per variant "
                    "(default 6; 1 with --smoke)")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes, one pair of short blocks: the code path in seconds")
    ap.add_argument("--save", default=None, metavar="PATH", help="every block's figures as JSON")
    args = ap.parse_args(argv)
    import torch

    device = Device()
    if device.type == "cpu" and not args.smoke:
        print(f"{ap.prog}: no accelerator here; --smoke runs the same code path on the CPU")
        return 0
    if device.type == "cpu":
        torch.set_num_threads(1)
    pairs = args.pairs or (1 if args.smoke else 6)
    block_steps = {"gpt": 10, "mlp": 20} if args.smoke else {"gpt": 30, "mlp": 1000}
    workloads = [x for x in args.workloads.split(",") if x]
    requested = [x for x in args.modes.split(",") if x]
    modes, refused = accepted_modes(requested)
    for mode, why in refused.items():
        print(f"skipped device_sync={mode}: not accepted by this otel-train ({why})")
    loss_off = [f"{MODES[0]}:no-loss-attr"] if MODES[0] in modes else []
    variants = modes + loss_off
    print(f"device: {device.name} ({device.type}); torch {torch.__version__}; "
          f"{pairs} pairs per variant, order alternating; monitoring every "
          f"{'5' if args.smoke else EVAL_EVERY} steps")
    clock = ThreadClock()
    receiver = ReceiverProcess()
    raw: dict[str, Any] = {"device": device.name, "device_type": device.type,
                           "torch": torch.__version__, "pairs": pairs, "smoke": args.smoke,
                           "refused": refused, "workloads": {}}
    summaries: dict[str, dict[str, Any]] = {}
    try:
        for name in workloads:
            w = Workload(name, device, args.smoke)
            steps = block_steps[name]
            w.val_loss()  # every monitoring shape warmed before anything is timed
            w.inference()
            device.synchronize()
            print(f"== {name}: {w.size}, {w.params / 1e6:.1f}M parameters, "
                  f"{steps}-step blocks")
            _progress(f"{name}: {w.size}")
            results: dict[str, Any] = {"truth": _truth_variant(w, device, pairs, steps, clock)}
            for variant in variants:
                mode, _, flag = variant.partition(":")
                results[variant] = _otel_variant(w, device, mode, flag != "no-loss-attr",
                                                 pairs, steps, receiver.endpoint, clock)
            raw["workloads"][name] = results
            summaries[name] = {k: summarize(v) for k, v in results.items()}
            bare_ms = statistics.median(s["bare_ms_per_step"] for s in summaries[name].values())
            print(f"   bare: {bare_ms:.2f} ms per step (monitoring included)")
            del w
    finally:
        receiver.close()
    print()
    print(format_table(summaries, requested + loss_off, refused, workloads))
    print()
    print("step vs bare: median of the pairs' block-time ratios; monitoring share: monitoring "
          "over training time (run.costs() over the timed blocks; the truth: monitoring timed "
          "between synchronizes); own cost: the lost time run.self_cost reports over the "
          "variant blocks' wall / the A/B's 1 - bare/variant; background CPU: process CPU "
          "minus the training thread's, blocked: the training thread's wall - on-CPU - "
          "run-queue, per step, each minus bare's in the same pair")
    if args.save:
        Path(args.save).write_text(json.dumps({**raw, "summaries": summaries}, indent=1))
        print(f"saved: {args.save}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
