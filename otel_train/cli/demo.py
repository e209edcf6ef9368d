"""``otel-train demo``: a tiny GPT-like model trained, fully instrumented.

A character-level transformer (two blocks, 64-wide) learns a small built-in text. Every step is
a ``train.step`` trace (data, forward, backward, optimizer); every ``eval_every`` steps the
run generates a sample (``inference``) and computes a validation loss over a named validation
loader (``val_loss``): the monitoring whose cost the run reports against its budget, as a
hand-timed training loop runs it (inference + validation loss every N steps).

``--device auto`` (the default) trains on the accelerator when one is present, else on the
CPU; ``--device cpu`` / ``--device cuda`` choose (``cuda`` where none is present is refused
before training). The model, the batches and the monitoring all run there; the run's
default ``device_sync`` times that device.

It ends with the costs table and the next steps (the report, the metrics, a Perfetto trace,
a collector); ``--serve`` keeps the metrics endpoint up after training until Ctrl-C.

Usage::

    otel-train demo --steps 300 --eval-every 50
    otel-train demo --serve            # then, from another shell: curl <its URL>/metrics
    otel-train demo --plant-slowdown forward:20   # forward 20% slower: try otel-train compare
    otel-train demo --device cpu       # on the CPU even where a GPU is present
    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 otel-train demo   # spans to a collector
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_TEXT = (
    "the step is the unit of training. every step fetches a batch, runs the forward pass, "
    "computes gradients in the backward pass and lets the optimizer update the weights. "
    "monitoring is what we do to watch it: we generate samples, we compute a validation "
    "loss, we save snapshots. monitoring is not free; a budget of five percent keeps it "
    "honest, and a slow step deserves a name and a breakdown. "
)


def _corpus(repeats: int = 40) -> str:
    return _TEXT * repeats


def build_model(vocab_size: int, block_size: int = 32, width: int = 64, layers: int = 2,
                heads: int = 4) -> Any:
    """A tiny decoder-only transformer (GPT-like), built from torch.nn parts."""
    import torch
    from torch import nn

    class TinyGPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block_size = block_size
            self.tok = nn.Embedding(vocab_size, width)
            self.pos = nn.Embedding(block_size, width)
            layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                               batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, vocab_size)
            mask = torch.triu(torch.full((block_size, block_size), float("-inf")), diagonal=1)
            self.register_buffer("mask", mask, persistent=False)

        def forward(self, idx: Any, targets: Any = None) -> tuple[Any, Any]:
            t = idx.shape[1]
            pos = torch.arange(t, device=idx.device)
            x = self.tok(idx) + self.pos(pos)
            x = self.blocks(x, mask=self.mask[:t, :t], is_causal=True)
            logits = self.head(self.norm(x))
            loss = None
            if targets is not None:
                loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                   targets.reshape(-1))
            return logits, loss

        @torch.no_grad()
        def generate(self, idx: Any, new_tokens: int) -> Any:
            for _ in range(new_tokens):
                logits, _ = self(idx[:, -self.block_size:])
                nxt = torch.multinomial(torch.softmax(logits[:, -1], dim=-1), 1)
                idx = torch.cat([idx, nxt], dim=1)
            return idx

    return TinyGPT()


def _batches(data: Any, block_size: int, batch_size: int, seed: int,
             device: Any = None) -> Iterator[Any]:
    """Random windows of ``data`` (on the CPU), moved to ``device``: the copy is part of the
    fetch, as a DataLoader's batch moved to the GPU is."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    while True:
        ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=gen)
        x = torch.stack([data[i:i + block_size] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
        if device is not None and device.type != "cpu":
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        yield x, y


class PlantedSlowdown:
    """Makes chosen phases of the demo slower by a share of their own time (a sleep at the
    end of the phase), so that ``otel-train compare`` has a known difference to find."""

    PHASES = ("forward", "backward", "optimizer")

    def __init__(self, spec: str | None = None) -> None:
        self.extra: dict[str, float] = {}  # phase -> added share of its time
        for part in (spec or "").split(","):
            if not part.strip():
                continue
            phase, _, pct = part.partition(":")
            phase = phase.strip()
            try:
                share = float(pct) / 100.0
            except ValueError:
                share = -1.0
            if phase not in self.PHASES or share <= 0:
                raise ValueError(f"--plant-slowdown {part!r}: PHASE:PCT with PHASE one of "
                                 f"{', '.join(self.PHASES)} and PCT > 0 (forward:20)")
            self.extra[phase] = share

    def __call__(self, phase: str) -> Any:
        """A context manager that sleeps the phase's share of its body's time at exit."""
        import contextlib

        share = self.extra.get(phase)
        if not share:
            return contextlib.nullcontext()

        @contextlib.contextmanager
        def slower() -> Iterator[None]:
            started = time.perf_counter()
            yield
            time.sleep((time.perf_counter() - started) * share)

        return slower()


def run_demo(steps: int = 300, eval_every: int = 50, val_batches: int = 4,
             sample_tokens: int = 48, seed: int = 0, serve: bool = False,
             plant_slowdown: str | None = None, device: str = "auto",
             **options: Any) -> dict[str, Any]:
    """Train the tiny GPT for ``steps`` steps under otel-train, print the costs table and the
    next steps; with ``serve``, keep the metrics endpoint up until SIGINT. ``plant_slowdown``
    ("forward:20") makes phases slower on purpose (:class:`PlantedSlowdown`); ``device``
    (auto, cpu, cuda) where it trains (:func:`training_device`). Return ``run.costs()``."""
    import sys

    import otel_train
    from otel_train.common.training_device import training_device

    slowdown = PlantedSlowdown(plant_slowdown)
    # Chosen before the run starts: a refused --device stops here, and the run's default
    # device_sync finds the device this process trains on.
    torch_device = training_device(device, "--device")
    print(f"otel-train demo: training on {torch_device.type} (--device {device})",
          file=sys.stderr, flush=True)

    options.setdefault("service_name", "otel-train-demo")
    # The demo writes its report itself, after training (printing where at start), so that
    # --quiet gets one too and it never depends on the console.
    want_report = options.pop("report", True)
    options["report"] = False
    with otel_train.start_run(**options) as run:
        if serve and run.prometheus_url is None:
            raise ValueError("--serve keeps the metrics endpoint up after training, but it "
                             "is off (--prometheus-port none or OTEL_TRAIN_PROMETHEUS_PORT)")
        _where_files_go(run, want_report)
        _train(run, steps, eval_every, val_batches, sample_tokens, seed, slowdown,
               torch_device)
        costs = run.costs()
        if serve:
            # The report reads the span files: what was recorded goes out to them first. The
            # costs file lags the run by its interval: the report takes the costs of now.
            run.flush()
            report = _write_report(run.status_dir, want_report, costs=[costs])
            _print_end(run, costs, report, serving=True)
            _serve_until_sigint(f"{run.prometheus_url}/metrics")
    if not serve:
        report = _write_report(run.status_dir, want_report)
        _print_end(run, costs, report, serving=False)
    return costs


def _train(run: Any, steps: int, eval_every: int, val_batches: int, sample_tokens: int,
           seed: int, slowdown: PlantedSlowdown, device: Any = None) -> None:
    """The training loop: a train.step per batch, the monitoring every ``eval_every``; the
    model, the batches and the monitoring on ``device`` (None: the CPU)."""
    import itertools

    import torch

    torch.manual_seed(seed)
    text = _corpus()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    split = int(0.9 * len(data))
    train_data, val_data = data[:split], data[split:]
    block, batch = 32, 8
    device = device if device is not None else torch.device("cpu")
    model = build_model(len(chars), block_size=block).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train_loader = itertools.islice(_batches(train_data, block, batch, seed, device), steps)
    for step in run.steps(train_loader, loader="train"):
        x, y = step.batch
        with step.phase("forward"), slowdown("forward"):
            _, loss = model(x, y)
        with step.phase("backward"), slowdown("backward"):
            loss.backward()
        with step.phase("optimizer"), slowdown("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        step.set_attribute("train.loss", loss)  # read in the background, no sync here
        if eval_every and step.index % eval_every == 0:
            val = itertools.islice(_batches(val_data, block, batch, seed + 1, device),
                                   val_batches)
            _evaluate(run, step, model, chars, val, sample_tokens)


def _evaluate(run: Any, step: Any, model: Any, chars: list[str], val: Any,
              sample_tokens: int) -> None:
    """The demo's monitoring: a generated sample and the validation loss, each timed."""
    import torch

    model.eval()
    with step.monitor("inference"):
        seed_ids = torch.zeros((1, 1), dtype=torch.long, device=model.mask.device)
        out = model.generate(seed_ids, sample_tokens)
        sample = "".join(chars[i] for i in out[0].tolist())
    with step.monitor("val_loss"), torch.no_grad():
        losses = [model(vx, vy)[1].item() for vx, vy in step.iter_data(val, loader="val")]
    model.train()
    val_loss = sum(losses) / len(losses)
    step.set_attribute("train.val_loss", val_loss)
    if run.options.console:
        print(f"[demo] step {step.index}: val loss {val_loss:.3f} "
              f"(ppl {math.exp(val_loss):.1f}) sample: {sample[:40]!r}")


def _write_report(status_dir: Path, wanted: bool,
                  costs: list[dict[str, Any]] | None = None) -> Path | None:
    """The demo's report (whole: no time limit), announced on stderr; None when not wanted
    or not written (the error logged)."""
    if not wanted:
        return None
    from otel_train.rundir.report import write_report_at_shutdown

    return write_report_at_shutdown(status_dir, time_limit_seconds=None, costs=costs)


def _print_end(run: Any, costs: dict[str, Any], report: Path | None, serving: bool) -> None:
    """The costs table, then what to do next with this run (the demo's last lines)."""
    run_dir = run.status_dir
    table = costs
    if run.options.console and costs.get("envelope"):
        # With the console on, the run says its goodput itself as it shuts down (one line):
        # the table leaves its copy out, so goodput is said once.
        table = type(costs)({k: v for k, v in costs.items() if k != "envelope"})
    lines = [str(table), "", "next steps:"]
    if report is not None:
        lines.append(f"  open the report        {report}")
    else:
        lines.append(f"  write the report       otel-train report {run_dir}")
    if serving:
        lines.append(f"  query the metrics      curl {run.prometheus_url}/metrics")
    else:  # the endpoint ended with the run
        lines.append("  query the metrics      otel-train demo --serve keeps them up after "
                     "training: curl the URL it prints")
    if run.export_plan.kind == "jsonl":
        lines.append(f"  a trace for Perfetto   otel-train export {run_dir}  (open its "
                     "trace.json at https://ui.perfetto.dev)")
        lines.append("  send to a collector    OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 "
                     "otel-train demo")
    else:
        lines.append(f"  find the traces        where they went: {run.export_plan.describe()}")
    print("\n".join(lines), flush=True)  # flushed: a pipe reader sees it while we serve


def _serve_until_sigint(metrics_url: str) -> None:
    """Wait, the run and its metrics endpoint up, until SIGINT (Ctrl-C); then return, so the
    run shuts down as any run does."""
    import signal
    import sys
    import threading

    stop = threading.Event()
    # Our own handler rather than KeyboardInterrupt: it works where SIGINT was inherited as
    # ignored (a background job), and ends the wait without a traceback.
    previous = signal.signal(signal.SIGINT, lambda _signum, _frame: stop.set())
    try:
        print(f"serving {metrics_url} until Ctrl-C", flush=True)
        while not stop.wait(1.0):
            pass
    finally:
        signal.signal(signal.SIGINT, previous)
    print("otel-train demo: stopping: the run shuts down", file=sys.stderr, flush=True)


def _where_files_go(run: Any, want_report: bool) -> None:
    """Where everything goes: the run's banner when the console is off (--quiet), and the
    report's line; on stderr, like the banner."""
    import sys

    from otel_train.rundir.report import shutdown_banner_line

    lines = []
    metrics = f"{run.prometheus_url}/metrics" if run.prometheus_url else "off"
    if not run.options.console:
        lines += [f"otel-train: run {run.run_id} rank {run.rank}/{run.world_size}",
                  f"  spans   -> {run.export_plan.describe()}",
                  f"  metrics -> {metrics}",
                  f"  costs   -> {run.status_dir}/"]
    if want_report:
        lines.append(shutdown_banner_line(run.status_dir).replace("at shutdown", "at the end"))
    if lines:
        print("\n".join(lines), file=sys.stderr, flush=True)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The demo's command-line arguments."""
    ap.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    ap.add_argument("--eval-every", type=int, default=50,
                    help="run inference + validation loss every N steps (default 50)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                    help="where the model, the batches and the monitoring run: auto (the "
                         "accelerator when present, else the CPU), cpu, or cuda (default auto)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the model's weights, the batches and the samples (default 0)")
    ap.add_argument("--prometheus-port", default=None,
                    help="metrics port: a number, 0 for a free port, 'none' for off "
                         "(default: OTEL_TRAIN_PROMETHEUS_PORT or 9464 + local rank)")
    ap.add_argument("--serve", action="store_true",
                    help="after training, keep the metrics endpoint up (curl its /metrics, "
                         "let Prometheus scrape it) until Ctrl-C")
    ap.add_argument("--status-dir", default=None, help="where the span files, "
                    "monitoring_costs.json and report.html go (default otel-train-runs/<run id>)")
    ap.add_argument("--quiet", action="store_true", help="no console timing report (the "
                    "banner and where the files went still print)")
    ap.add_argument("--plant-slowdown", default=None, metavar="PHASE:PCT",
                    help="make a phase PCT%% slower (a sleep at its end; forward, backward or "
                         "optimizer, comma-separated) to try otel-train compare on a known "
                         "difference")
    ap.add_argument("--no-report", action="store_true",
                    help="do not write the HTML report (RUN_DIR/report.html) at the end")
