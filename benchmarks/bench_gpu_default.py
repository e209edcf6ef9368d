"""What each ``device_sync`` mode costs a training loop on an accelerator, and whether the
monitoring share and the own cost it reports are true: one command, one table.

Workloads, on the accelerator found (``torch.accelerator``, else CUDA):

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
own cost the run reports (``run.self_cost.lost_ns`` over its blocks' wall) against the A/B
(1 - bare / variant, from the mean log ratio); and, in the training process, background
CPU (process CPU minus the training thread's) and the training thread's blocked time (the
GIL wait, mostly: wall - on-CPU - run-queue, ``/proc/self/task/<tid>/schedstat``) per step,
each minus bare's of the same pair. ``--save PATH`` keeps every block's figures as JSON.
Progress goes to stderr, one line per block.

Sized for ~4 minutes on one H100/H200-class GPU. Without an accelerator it runs only with
``--smoke`` (tiny sizes, one pair of short blocks, seconds: the same code path on the CPU,
which the test runs).

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
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_support import (  # noqa: E402  (adds the repository root to sys.path)
    ReceiverProcess,
    ThreadClock,
    _median_ci,
    live_run,
)

MODES = ("auto", "sync", "events", "monitor_sync")
EVAL_EVERY = 10
DECODE_STEPS = 8


def _progress(line: str) -> None:
    """One progress line on the real stderr (``live_run`` sends sys.stderr to /dev/null)."""
    print(line, file=sys.__stderr__, flush=True)


# -- the device ---------------------------------------------------------------------------

class Device:
    """The device found, and its synchronize (a no-op on the CPU, where nothing is queued)."""

    def __init__(self) -> None:
        import torch

        from otel_train.common.training_device import accelerator_device

        self.torch_device = accelerator_device(torch) or torch.device("cpu")
        self.type = self.torch_device.type
        if self.type == "cuda":
            self._synchronize = torch.cuda.synchronize
            self.name = torch.cuda.get_device_name()
        elif self.type != "cpu":
            self._synchronize = torch.accelerator.synchronize
            self.name = self.type
        else:
            self._synchronize = None
            self.name = "cpu"

    def synchronize(self) -> None:
        """Wait for the device's queue to drain (the CPU has none)."""
        if self._synchronize is not None:
            self._synchronize()


# -- the workloads --------------------------------------------------------------------------

def _gpt_model(vocab: int, width: int, layers: int, heads: int, seq: int) -> Any:
    """A decoder-only transformer: pre-norm blocks, causal SDPA attention, GELU MLP."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x: Any) -> Any:
            b, t, d = x.shape
            qkv = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            att = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab, bias=False)

        def forward(self, idx: Any) -> Any:
            pos = torch.arange(idx.shape[1], device=idx.device)
            return self.head(self.norm(self.blocks(self.tok(idx) + self.pos(pos))))

    return GPT()


class Workload:
    """Model, fused AdamW, device-resident batches, the held batch, one global step count."""

    def __init__(self, name: str, device: Device, smoke: bool) -> None:
        import torch
        from torch import nn

        torch.manual_seed(0)
        dev = device.torch_device
        self.name = name
        self.k = 0  # global step count: every block holds the same monitoring calls
        self.eval_every = 5 if smoke else EVAL_EVERY
        if name == "gpt":
            vocab, width, layers, heads, seq, batch = (
                (128, 64, 2, 2, 32, 2) if smoke else (32768, 1024, 8, 16, 1024, 8))
            self.model = _gpt_model(vocab, width, layers, heads, seq).to(dev)
            self.size = f"d {width}, {layers} layers, seq {seq}, batch {batch}, vocab {vocab}"
            tokens = torch.randint(vocab, (5, batch, seq + 1), device=dev)
            self.train_batches = [(t[:, :-1], t[:, 1:]) for t in tokens[:4]]
            self.held = (tokens[4][:, :-1], tokens[4][:, 1:])
            self.context = seq
        else:
            width, batch = (64, 16) if smoke else (2048, 256)
            layers: list[Any] = []
            for _ in range(3):
                layers += [nn.Linear(width, width), nn.ReLU()]
            self.model = nn.Sequential(*layers, nn.Linear(width, width)).to(dev)
            self.size = f"4 layers, {width} wide, batch {batch}"
            xs = torch.randn(5, batch, width, device=dev)
            ys = torch.randint(width, (5, batch), device=dev)
            self.train_batches = [(xs[i], ys[i]) for i in range(4)]
            self.held = (xs[4], ys[4])
            self.context = 0
        self.params = sum(p.numel() for p in self.model.parameters())
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)
        self._autocast = lambda: torch.autocast(dev.type, dtype=torch.bfloat16)
        self._no_grad = torch.no_grad
        self._cross_entropy = nn.functional.cross_entropy

    def batches(self, n: int) -> Any:
        """``n`` batches, cycling over the device-resident ones."""
        for i in range(n):
            yield self.train_batches[i % len(self.train_batches)]

    def loss(self, x: Any, y: Any) -> Any:
        """The training loss (bf16 autocast; cross-entropy in float32, as autocast does)."""
        with self._autocast():
            out = self.model(x)
            return self._cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    def val_loss(self) -> float:
        """Monitoring: one forward on the held batch, read with ``.item()``."""
        with self._no_grad():
            return self.loss(*self.held).item()

    def inference(self) -> list[Any]:
        """Monitoring: 8 greedy decode steps over the held batch, read with ``.tolist()``."""
        import torch

        x = self.held[0]
        with self._no_grad(), self._autocast():
            for _ in range(DECODE_STEPS):
                if self.context:  # the GPT: the next token from the last position
                    nxt = self.model(x[:, -self.context:])[:, -1].argmax(-1, keepdim=True)
                    x = torch.cat([x, nxt], dim=1)
                else:  # the MLP: its output is the next input
                    x = self.model(x).float()
        return (x[:, -DECODE_STEPS:] if self.context else x.argmax(-1)).tolist()

    def train_step(self, x: Any, y: Any) -> Any:
        loss = self.loss(x, y)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss


# -- the loops ------------------------------------------------------------------------------

def loop_bare(w: Workload, n: int) -> None:
    """The user's loop, nothing added."""
    for x, y in w.batches(n):
        w.train_step(x, y)
        w.k += 1
        if w.k % w.eval_every == 0:
            w.val_loss()
            w.inference()


def loop_truth(w: Workload, n: int, device: Device, monitoring_ns: list[int]) -> None:
    """The bare loop, each monitoring call between two synchronizes and timed: the device
    time of the monitoring itself, nothing queued before it (``monitoring_ns[0]`` adds up)."""
    clock = time.perf_counter_ns
    for x, y in w.batches(n):
        w.train_step(x, y)
        w.k += 1
        if w.k % w.eval_every == 0:
            device.synchronize()  # the training work queued so far is training's
            t0 = clock()
            w.val_loss()
            device.synchronize()
            t1 = clock()
            w.inference()
            device.synchronize()
            monitoring_ns[0] += t1 - t0 + clock() - t1


def loop_otel(w: Workload, n: int, run: Any, loss_attribute: bool) -> None:
    """The README's loop: run.steps (data) + forward/backward/optimizer + the monitoring."""
    model_loss, opt = w.loss, w.opt
    for step in run.steps(w.batches(n), loader="train"):
        x, y = step.batch
        with step.phase("forward"):
            loss = model_loss(x, y)
        with step.phase("backward"):
            loss.backward()
        with step.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        if loss_attribute:
            step.set_attribute("train.loss", loss)  # the tensor: the run reads it
        w.k += 1
        if w.k % w.eval_every == 0:
            with step.monitor("val_loss"):
                w.val_loss()
            with step.monitor("inference"):
                w.inference()


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
            device: Device, after_warmup: Any = None, around: Any = None) -> list[list[Any]]:
    """A warm-up pair, then ``pairs`` pairs (bare, variant), the order alternating; returns
    [bare figures, variant figures] per pair. ``around(figures_fn)`` wraps a variant block
    (the run's own-cost reading)."""
    def var_block() -> dict[str, Any]:
        return around(lambda: _block(clock, variant, device)) if around else _block(
            clock, variant, device)

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
            run.flush()  # the warm-up pair's steps are in the costs read next
            start["costs"] = run.costs()

        def around(block: Any) -> dict[str, Any]:
            lost0 = meter.lost_ns
            got = block()
            got["reported_lost"] = meter.lost_ns - lost0
            return got

        got = _series(label, lambda: loop_bare(w, steps),
                      lambda: loop_otel(w, steps, run, loss_attribute), pairs, clock, device,
                      after_warmup, around)
        run.flush()
        end = run.costs()
    first = start["costs"]
    monitoring = end["monitoring_time_seconds"] - first["monitoring_time_seconds"]
    training = end["training_time_seconds"] - first["training_time_seconds"]
    return {"pairs": got, "steps": steps, "reported_monitoring_seconds": monitoring,
            "reported_training_seconds": training}


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
        out["reported_share"] = (sum(v["reported_lost"] for _, v in pairs)
                                 / max(1, sum(v["wall"] for _, v in pairs)))
    if "truth_share" in res:
        out["truth_share"] = res["truth_share"]
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100.0 * x:.1f}%"


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
                own.append(f"{w} {_pct(s['reported_share'])} / {_pct(s['ab_share'])}")
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
          "between synchronizes); own cost: run.self_cost.lost_ns over the variant blocks' "
          "wall / the A/B's 1 - bare/variant; background CPU: process CPU minus the training "
          "thread's, blocked: the training thread's wall - on-CPU - run-queue, per step, each "
          "minus bare's in the same pair")
    if args.save:
        Path(args.save).write_text(json.dumps({**raw, "summaries": summaries}, indent=1))
        print(f"saved: {args.save}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
