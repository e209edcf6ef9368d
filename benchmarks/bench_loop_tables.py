"""The tables of bench_training_loop.py: its variants, each variant's row from its paired
blocks, the run's own-cost line beside it, and ``--combine`` (the blocks of several ``--save``
files pooled).

Usage::

    _report_variant("otel-otlp", result, delivered, steps, first_bare=True)
    combine(["mlp1.json", "mlp2.json"])   # prints the pooled tables
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from bench_support import _fmt_ci

IN_PROCESS = ("otel-otlp", "otel-thread", "otel-paused", "otel-sampled", "otel-throughput",
              "otel-any-cpu", "otel-none", "otel-recorder", "instrument", "otel-sdk",
              "record-function", "timestamps")
# otel-train runs exporting OTLP
EXPORTING = ("otel-otlp", "otel-ring", "otel-queue", "otel-thread", "otel-paused",
             "otel-sampled", "otel-throughput", "otel-any-cpu", "instrument")
# Runs whose background can be frozen between blocks (an exporter process, no hooks to swap)
FREEZABLE = ("otel-otlp", "otel-ring", "otel-queue", "otel-sampled", "otel-throughput",
             "otel-any-cpu")
PEERS = ("torchtel", "traceml")
# Run only when named in --variants (not in the default list)
OPT_IN = ("otel-ring", "otel-queue")
PEER_MODULES = {"torchtel": "torchtel", "traceml": "traceml_ai"}


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
    """The share of the loop's time the run reports it lost (``SelfCostMeter.lost_parts()`` over
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
    if res.get("frozen_background"):
        print(f"{'':<16}  background frozen between blocks: drains in progress at a block's "
              f"end took {res['leftover_ns'] / 1e3 / len(pairs) / n:.2f} us per step off "
              "both clocks", flush=True)
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
            if res.get("frozen_background") != into.get("frozen_background"):
                raise SystemExit(f"--combine: {key} in {path} was run with and before without "
                                 "--frozen-background (or the reverse): they do not pool")
            if res["steps"] != into["steps"]:
                raise SystemExit(f"--combine: {key} has {res['steps']}-step blocks in {path}, "
                                 f"{into['steps']} before: only blocks of one length pool")
            into["pairs"] = into["pairs"] + res["pairs"]
            into["runs"] += 1
            into["slopes"].append(res.get("interference_slope_ns") or 0.0)
            for k in ("gc_steps", "gc_bare_steps", "spans_built", "leftover_ns"):
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
