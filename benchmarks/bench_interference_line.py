"""What a continuous run charges itself for on-CPU interference, and the points behind it.

A paired A/B alternates bare and instrumented blocks; a user's run trains without a pause.
This bench runs the README's loop (``run.steps`` + phases, an evaluation every 50 steps) for
``--rounds`` chunks of ``--block-steps`` steps in one live run exporting OTLP/HTTP to a receiver
process, keeps every interval the span worker feeds to the interference line
(``common/cpu_interference.py``: the background's busy share, the training thread's CPU per
step, the steps, fitted or charged only), and prints:

- the run's own-cost figures at the end (``run.costs()["own_cost"]``): the share of step time,
  the hot path, the wait, the interference charged per step and its slope;
- the fitted intervals by busy share: their training CPU per step, as measured and over the
  steps' mean over their 20 neighbours (the machine's drift over seconds taken out), which shows
  whether the training thread computes slower while the background runs;
- the slope through the intervals' levels beside the one through consecutive intervals'
  differences (what the run fits), each with its standard error.

Usage::

    python benchmarks/bench_interference_line.py                       # mlp, ~70 s
    python benchmarks/bench_interference_line.py --workloads mlp,gpt --rounds 40
    python benchmarks/bench_interference_line.py --smoke               # seconds; the test runs it
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loop_workloads import Workload, loop_otel  # noqa: E402
from bench_support import live_run, rounds_main  # noqa: E402

from otel_train.common.cpu_interference import CpuInterferenceRegression  # noqa: E402

BLOCK_STEPS = {"gpt": 200, "mlp": 1500}
BINS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 1.01)
NEIGHBOURS = 10  # each side, for the drift-free column
FIGURES = ("share_of_step_time", "step_wall_us", "hot_path_us_per_step", "wait_us_per_step",
           "cpu_interference_us_per_step", "cpu_interference_us_per_busy_step",
           "background_cpu_us_per_step", "exporter_process_cpu_us_per_step")


def _levels_line(points: list[tuple[float, float, int, bool]]) -> tuple[float, float] | None:
    """(slope, standard error) in ns per busy step of the steps-weighted least-squares line
    through the intervals' levels (busy, CPU per step)."""
    if len(points) < 3:
        return None
    w = sum(p[2] for p in points)
    mx = sum(p[2] * p[0] for p in points) / w
    my = sum(p[2] * p[1] for p in points) / w
    sxx = sum(p[2] * (p[0] - mx) ** 2 for p in points) / w
    if sxx <= 0:
        return None
    sxy = sum(p[2] * (p[0] - mx) * (p[1] - my) for p in points) / w
    syy = sum(p[2] * (p[1] - my) ** 2 for p in points) / w
    slope = sxy / sxx
    return slope, math.sqrt(max(0.0, syy - slope * sxy) / (sxx * (len(points) - 2)))


def _differences_line(points: list[tuple[float, float, int, bool]]) -> tuple[float, float] | None:
    """The run's own fit (CpuInterferenceRegression) over the same intervals."""
    reg = CpuInterferenceRegression(min_points=3)
    for busy, cpu, steps, _ in points:
        reg.add(busy, cpu, steps)
    return reg.line_ns()


def _report(points: list[tuple[float, float, int, bool]], figures: dict[str, Any]) -> None:
    fitted = [p for p in points if p[3]]
    print(f"  intervals: {len(points)}, fitted {len(fitted)}")
    print("  run's own cost: " + ", ".join(f"{k} {figures.get(k)}" for k in FIGURES))
    if len(fitted) < 3:
        return
    print(f"  {'busy share':<14}{'intervals':>10}{'steps':>8}{'CPU/step us':>13}"
          f"{'over neighbours us':>20}")
    over = []
    for i, (_, y, _, _) in enumerate(fitted):
        near = fitted[max(0, i - NEIGHBOURS):i + NEIGHBOURS + 1]
        over.append(y - sum(q[1] * q[2] for q in near) / sum(q[2] for q in near))
    for lo, hi in zip(BINS, BINS[1:]):
        sel = [(p, d) for p, d in zip(fitted, over) if lo <= p[0] < hi]
        if sel:
            steps = sum(p[2] for p, _ in sel)
            cpu = sum(p[1] * p[2] for p, _ in sel) / steps / 1e3
            extra = sum(d * p[2] for p, d in sel) / steps / 1e3
            print(f"  [{lo:.2f}, {hi:.2f})  {len(sel):>10}{steps:>8}{cpu:>13.1f}{extra:>+20.1f}")
    for name, fit in (("levels", _levels_line(fitted)),
                      ("differences", _differences_line(fitted))):
        if fit is not None:
            print(f"  slope through the {name:<12} {fit[0] / 1e3:>8.0f} +- {fit[1] / 1e3:.0f} us "
                  "per busy step")


def run_workload(name: str, rounds: int, steps: int, endpoint: str) -> None:
    """``rounds`` chunks of ``steps`` steps in one live run; the report."""
    w = Workload(name, eval_every=50)
    print(f"== {name}: {rounds} x {steps} steps in one run", flush=True)
    with live_run(endpoint, "bench-interference") as (run, _):
        line = run.self_cost.interference
        points: list[tuple[float, float, int, bool]] = []
        add = line.add

        def recorded(busy: float, cpu_per_step_ns: float, steps: int, fit: bool = True) -> None:
            points.append((busy, cpu_per_step_ns, steps, fit))
            add(busy, cpu_per_step_ns, steps, fit)

        line.add = recorded
        for _ in range(rounds):
            loop_otel(w, steps, run)
        figures = run.costs()["own_cost"]
    _report(points, figures)


def main(argv: list[str] | None = None) -> int:
    return rounds_main(argv, __doc__, run_workload, workloads="mlp", rounds=40,
                       block_steps=BLOCK_STEPS, smoke=(2, 20), pair="",
                       rounds_help="chunks of steps, one after another in one run")


if __name__ == "__main__":
    sys.exit(main())
