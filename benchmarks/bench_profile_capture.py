"""What profiling costs: the armed check per step, a step under torch.profiler, the write.

Prints, measured in this one run (CPU, torch's CPU build or CUDA when present):

- armed: the training thread's CPU per step of a ``run.steps`` loop with
  ``profile_on_slow_steps`` on but no capture running (the wrapped fetch and the slow-count
  read at each boundary), beside the same loop with the option off (no wrapper), in
  interleaved chunks; the paired difference per step with a bootstrap 95% interval;
- captured: the wall time of a small MLP's training step (forward, backward, optimizer)
  under ``torch.profiler`` (a ``run.profile_next`` capture), as a ratio to the same step
  not profiled, chunk by chunk;
- stopped / written: the training thread's time to stop the profiler at the boundary, and
  the background thread's wall time to write a capture's trace and sidecar and emit its
  ``train.profile`` spans (it holds the GIL much of it: training slows while it runs).

Usage::

    python benchmarks/bench_profile_capture.py [--rounds 20] [--steps 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_support import _fmt_ci  # noqa: E402

import otel_train  # noqa: E402


def _start(tmp: Path, **options: Any) -> Any:
    opts: dict[str, Any] = {"prometheus_port": None, "console": False, "exporter": "none",
                            "status_dir": str(tmp), "device_sync": "off", "report": False}
    return otel_train.start_run(**{**opts, **options})


def _armed_chunk(run: Any, steps: int) -> float:
    """Training-thread CPU per step (ns) of a loop of empty steps."""
    t0 = time.thread_time_ns()
    for step in run.steps(range(steps)):
        with step.phase("forward"):
            pass
    return (time.thread_time_ns() - t0) / steps


def bench_armed(tmp: Path, rounds: int, steps: int) -> None:
    # No step is judged slow (a 1 us step's jitter would be): the check runs, no capture.
    quiet = {"exporter": "jsonl", "slow_step_factor": 1e9}
    off = _start(tmp / "off", **quiet)
    on = _start(tmp / "on", profile_on_slow_steps=2, **quiet)
    diffs, offs = [], []
    for _ in range(rounds):
        a = _armed_chunk(off, steps)
        b = _armed_chunk(on, steps)
        offs.append(a)
        diffs.append(b - a)
    on.shutdown()
    off.shutdown()
    print(f"armed, no capture: +{statistics.median(diffs):6.0f} ns per step (paired median "
          f"of {rounds} chunks of {steps} steps; [95% CI] {_fmt_ci(diffs)} ns) over "
          f"{statistics.median(offs):6.0f} ns with the option off")


def _mlp_steps(run: Any, model: Any, opt: Any, x: Any, steps: int) -> float:
    """Wall seconds per step of ``steps`` training steps of the MLP."""
    t0 = time.perf_counter()
    for _ in range(steps):
        with run.step() as step:
            with step.phase("forward"):
                loss = model(x).square().mean()
            with step.phase("backward"):
                loss.backward()
            with step.phase("optimizer"):
                opt.step()
                opt.zero_grad()
    return (time.perf_counter() - t0) / steps


def bench_captured(tmp: Path, rounds: int, steps: int) -> None:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)  # one core: the shared machine's other work moves it less
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 256))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 256)
    run = _start(tmp / "mlp", exporter="jsonl")
    prof = run._profiling
    _mlp_steps(run, model, opt, x, 20)  # warm-up: allocator, first calls
    run.profile_next(2)
    _mlp_steps(run, model, opt, x, 3)  # the profiler's first start (its one-time set-up)
    prof.close()
    prof._closed = False
    ratios, plain_s, stop_s, write_s = [], [], [], []
    for _ in range(rounds):
        plain = _mlp_steps(run, model, opt, x, steps)
        run.profile_next(steps)
        profiled = _mlp_steps(run, model, opt, x, steps)  # starts at its first step
        t0 = time.perf_counter()
        with run.step():
            pass  # the boundary that stops the capture, on the training thread
        t1 = time.perf_counter()
        prof.close()  # the background write, waited for here (outside the timed steps)
        prof._closed = False
        write_s.append(time.perf_counter() - t1)
        stop_s.append(t1 - t0)
        ratios.append(profiled / plain)
        plain_s.append(plain)
    run.shutdown(timeout=30)
    print(f"captured: step x{statistics.median(ratios):5.2f} under torch.profiler (paired "
          f"median of {rounds} chunks of {steps} MLP steps, "
          f"{statistics.median(plain_s) * 1e3:.2f} ms each not profiled; [95% CI] "
          f"{_fmt_ci(ratios)})")
    size = sum(p.stat().st_size for p in prof.files[1:]) / max(1, (len(prof.files) - 1) * steps)
    print(f"stopped: {statistics.median(stop_s) * 1e3:.1f} ms on the training thread at the "
          f"boundary; written: {statistics.median(write_s) * 1e3 / steps:.1f} ms per profiled "
          f"step on the background thread, {size / 1024:.0f} KiB of trace per step")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--steps", type=int, default=200, help="steps per chunk")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        bench_armed(tmp, args.rounds, args.steps * 10)
        bench_captured(tmp, max(3, args.rounds // 2), max(2, args.steps // 10))
    return 0


if __name__ == "__main__":
    sys.exit(main())
