"""The hot path's C accelerator against its pure-Python twin, paired in one process.

``otel_train/recording/recorder.py`` is loaded twice more under other names: once on the pure-Python
twin (``OTEL_TRAIN_PURE_PYTHON=1`` while it loads) and once more on C, beside the package's
own module. Each round times a chunk of 7-span steps (``run.steps`` + 5 phases, a bare
Recorder, no run) on each of the four (the floor of six empty timestamp context managers,
C, C again, pure Python) in a shuffled order, with ``time.thread_time_ns`` around each step.
Paced rounds put a ~1 ms GIL-holding spin before each step (caches cold, as in a real loop);
warm rounds do not. Printed: the medians per step, each against the floor, and the paired
ratios (a chunk against the other chunks of its round, so the machine's drift cancels) with
a bootstrap 95% interval. "C again / C" shows the noise of the method (and of where in memory
a copy of the same code lands): read C / pure against it.

Usage::

    python benchmarks/bench_accelerator.py [--rounds 16] [--steps 300] [--step-us 1000]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The same floor, the same 7-span step and the same paced timing as bench_hot_path.py.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_hot_path import _paced_chunk  # noqa: E402
from bench_support import ThreadClock, _median_ci  # noqa: E402

from otel_train.recording import recorder  # noqa: E402
from otel_train.common.drop_counter import DropCounter  # noqa: E402


def _load(name: str, pure: bool) -> ModuleType:
    """Another copy of recorder.py, on the pure-Python twin if ``pure``."""
    spec = importlib.util.spec_from_file_location(name, recorder.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = os.environ.get("OTEL_TRAIN_PURE_PYTHON")
    os.environ["OTEL_TRAIN_PURE_PYTHON"] = "1" if pure else "0"
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is None:
            del os.environ["OTEL_TRAIN_PURE_PYTHON"]
        else:
            os.environ["OTEL_TRAIN_PURE_PYTHON"] = saved
    return module


def _measure(modules: dict[str, ModuleType | None], rounds: int, steps: int, step_us: float
             ) -> dict[str, list[float]]:
    """Per-step training-thread CPU (ns) of each chunk, by key; round 0 only warms up."""
    loops: dict[str, Any] = {}
    for key, module in modules.items():
        if module is not None:
            rec = module.Recorder(10**9, DropCounter(), None)
            loops[key] = (rec, iter(rec.steps(range(10**12), "train")))
    clock = ThreadClock()
    step_ns = int(step_us * 1000)
    res: dict[str, list[float]] = {key: [] for key in modules}
    order = list(modules)
    for r in range(rounds + 1):
        random.shuffle(order)
        for key in order:
            rec, loop = loops.get(key, (None, None))
            hot = _paced_chunk(loop, clock, steps, step_ns, ours=rec is not None)["hot"]
            if rec is not None:
                rec.queue.clear()  # the background's drain, outside the timing
            if r:
                res[key].append(hot / steps)
    return res


def _print(title: str, res: dict[str, list[float]]) -> None:
    print(title)
    floor = res["floor"]
    for key, values in res.items():
        med, lo, hi = _median_ci([v / f for v, f in zip(values, floor)])
        print(f"  {key:<28}{statistics.median(values):8.0f} ns   "
              f"x floor {med:.3f} [{lo:.3f}, {hi:.3f}]")
    for a, b in (("C again", "C"), ("C", "pure Python")):
        med, lo, hi = _median_ci([x / y for x, y in zip(res[a], res[b])])
        print(f"  paired {a} / {b}:{'':<{14 - len(a) - len(b)}}{med:.3f} [{lo:.3f}, {hi:.3f}]")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=16, help="paced rounds (warm: 2.5x as many)")
    ap.add_argument("--steps", type=int, default=300, help="steps per chunk")
    ap.add_argument("--step-us", type=float, default=1000.0,
                    help="the GIL-holding spin before each paced step")
    args = ap.parse_args(argv)
    if not recorder.ACCELERATED:
        print(f"hot path: {recorder.HOT_PATH}")
        print("nothing to compare: this install has no C accelerator")
        return 1
    modules: dict[str, ModuleType | None] = {
        "floor": None,
        "C": recorder,
        "C again": _load("_recorder_c_again", pure=False),
        "pure Python": _load("_recorder_pure", pure=True),
    }
    assert modules["pure Python"].ACCELERATED is False  # type: ignore[union-attr]
    print(f"hot path: {recorder.HOT_PATH}; 7-span steps (run.steps + 5 phases), bare Recorder")
    print("floor: six empty timestamp context managers; training-thread CPU per step, "
          "medians; paired ratios [bootstrap 95% CI]")
    _print(f"paced ({args.step_us:.0f} us spin before each step), {args.rounds} rounds of "
           f"{args.steps} steps:", _measure(modules, args.rounds, args.steps, args.step_us))
    warm = max(2, int(args.rounds * 2.5))
    _print(f"warm (no spin), {warm} rounds of {args.steps} steps:",
           _measure(modules, warm, args.steps, 0.0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
