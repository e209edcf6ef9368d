"""On a CUDA machine: otel-train's device busy time and memory peaks per phase against
``torch.cuda.Event``s and ``torch.cuda.max_memory_allocated`` taken by hand in the same phases.

A small MLP trains for ``--steps`` steps under ``device_sync="events"`` with events and peaks
on every step. Inside each phase the script records its own CUDA events right after the
library's (phase start) and right before them (phase end), and reads the allocator's peak
by hand just before the phase ends (the library resets the peak when the phase starts, so
both read the same window). Printed per phase: the median device time both ways and their
ratio, the peak both ways; and what ``device_sync="auto"`` picks here. It exits 1 when a phase's
device time differs by more than ``--tolerance`` (5%) or a peak differs at all. Without
CUDA it says so and exits 0.

Usage::

    python benchmarks/check_device_probes_gpu.py [--steps 50] [--width 4096] [--tolerance 0.05]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import otel_train  # noqa: E402
from otel_train.common import attributes as A  # noqa: E402
from otel_train.recording.device import resolve_device_timing  # noqa: E402
from otel_train.rundir.span_files import read_span_dicts, attributes_dict  # noqa: E402

PHASES = ("forward", "backward", "optimizer")


def _train(steps: int, width: int, status_dir: str) -> dict[tuple[int, str], tuple[float, int]]:
    """Run the loop; (step, phase) -> (hand device seconds, hand peak allocated bytes)."""
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)]).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    batch = torch.randn(256, width, device="cuda")
    hand: dict[tuple[int, str], tuple[Any, Any, int]] = {}
    with otel_train.start_run(device_sync="events", device_events_every_steps=1,
                              memory_peaks="on", exporter="jsonl", status_dir=status_dir,
                              console=False, prometheus_port=None) as run:
        for step in run.steps(range(steps)):
            marks = {}
            for name in PHASES:
                with step.phase(name):
                    start = torch.cuda.Event(enable_timing=True)
                    start.record()
                    if name == "forward":
                        loss = model(batch).square().mean()
                    elif name == "backward":
                        loss.backward()
                    else:
                        opt.step()
                        opt.zero_grad(set_to_none=True)
                    end = torch.cuda.Event(enable_timing=True)
                    end.record()
                    marks[name] = (start, end, torch.cuda.max_memory_allocated())
            hand.update({(step.index, n): m for n, m in marks.items()})
    torch.cuda.synchronize()
    return {k: (s.elapsed_time(e) / 1000.0, peak) for k, (s, e, peak) in hand.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--tolerance", type=float, default=0.05)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check (the fake-accelerator tests cover the logic)")
        return 0
    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}")
    print(f"device_sync=auto here: {resolve_device_timing('auto').describe()}")
    with tempfile.TemporaryDirectory() as tmp:
        hand = _train(args.steps, args.width, tmp)
        ours: dict[tuple[int, str], dict[str, Any]] = {}
        for d in read_span_dicts(tmp):
            attrs = attributes_dict(d.get("attributes"))
            if d["name"] in PHASES:
                ours[(attrs[A.STEP], d["name"])] = attrs
    failed = False
    warm = [k for k in hand if k[0] >= 3]  # the first steps include CUDA/cuBLAS start-up
    for name in PHASES:
        keys = [k for k in warm if k[1] == name and A.DEVICE_BUSY in ours.get(k, {})]
        mine = statistics.median(ours[k][A.DEVICE_BUSY] for k in keys)
        theirs = statistics.median(hand[k][0] for k in keys)
        ratio = mine / theirs if theirs else float("nan")
        peaks_ok = all(ours[k][A.MEMORY_PEAK_ALLOCATED] >= hand[k][1] for k in keys)
        print(f"  {name:10s} busy {mine * 1e3:8.3f} ms, by hand {theirs * 1e3:8.3f} ms "
              f"(x{ratio:.3f}); peak {ours[keys[-1]][A.MEMORY_PEAK_ALLOCATED] / 2**20:9.1f} "
              f"MiB, by hand {hand[keys[-1]][1] / 2**20:9.1f} MiB"
              f"{'' if peaks_ok else '  PEAK BELOW THE HAND READING'}")
        failed |= not abs(ratio - 1.0) <= args.tolerance or not peaks_ok
    print("FAIL" if failed else "OK")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
