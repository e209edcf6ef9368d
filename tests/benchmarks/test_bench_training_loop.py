"""The training-loop benchmark runs end to end (smoke mode), so it cannot rot unnoticed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_training_loop.py"
_RATIO = r"\s+(\d+\.\d+) \[(\d+\.\d+), (\d+\.\d+)\]"
_SIGNED = r"\s+(-?\d+\.\d+) \[(-?\d+\.\d+), (-?\d+\.\d+)\]"


def test_the_smoke_run_prints_a_paired_ratio_and_interval_for_every_variant_and_delivers_spans(
        tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    saved = tmp_path / "blocks.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--smoke", "--save", str(saved)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    for workload in ("gpt", "mlp"):
        assert f"== {workload}, threads=1" in out
    for variant in ("otel-otlp", "otel-thread", "otel-paused", "otel-sampled",
                    "otel-throughput", "otel-any-cpu", "otel-none", "otel-recorder",
                    "instrument", "otel-sdk", "record-function", "timestamps"):
        rows = re.findall(rf"^{variant}{_RATIO}{_RATIO}", out, re.M)
        assert len(rows) == 2, (variant, out)  # one per workload
        for med, lo, hi, med_d, lo_d, hi_d in rows:
            assert float(lo) <= float(med) <= float(hi)
            assert float(lo_d) <= float(med_d) <= float(hi_d)
            assert float(med) > 0.2  # a ratio of step times, not a garbage number
    # The headline columns and the allocation figures are printed.
    assert "+GIL" in out and "stall" in out and "+bgCPU" in out and "expCPU" in out
    # otel-otlp exports from the exporter process, whose CPU is measured: not 0 there.
    exp_cpu = re.findall(r"^otel-otlp .*?(-?\d+)\s+\(one process", out, re.M)
    assert len(exp_cpu) == 2 and all(int(x) > 0 for x in exp_cpu), out
    # otel-otlp, otel-thread and the SDK: gc counts and allocations, both workloads.
    assert len(re.findall(r"gc collections per 1000 steps", out)) == 6
    assert len(re.findall(r"tracemalloc per step: bare kept", out)) == 6
    # Beside each otel-train run's row: the share the run reports of itself for the same
    # blocks, the A/B's share and their difference, each a finite median in its interval.
    own = re.findall(rf"^\s+own cost: A/B share{_SIGNED}\s*%, reported{_SIGNED}\s*%, "
                     rf"reported - A/B{_SIGNED}\s*pp; interference slope (\d+\.\d) us per busy "
                     r"step$", out, re.M)
    # otel-otlp/-thread/-paused/-sampled/-throughput/-any-cpu/-none, instrument
    assert len(own) == 2 * 8, out
    for row in own:
        ab, ab_lo, ab_hi, rep, rep_lo, rep_hi, diff, d_lo, d_hi, _slope = map(float, row)
        assert ab_lo <= ab <= ab_hi and rep_lo <= rep <= rep_hi and d_lo <= diff <= d_hi
        assert 0.0 <= rep <= 100.0  # a share of the block's time, not 28395%
    # Spans really reached the real receiver, and otel-train built them.
    delivered = [int(n) for n in re.findall(r"spans delivered to the receiver by this process: "
                                            r"(\d+)", out)]
    assert len(delivered) == 2 and all(n > 0 for n in delivered), out
    assert re.search(r"otel-none .*\(exporter none; [1-9]\d* built\)", out)
    assert len(re.findall(r"^otel-recorder .*- \(no export\)$", out, re.M)) == 2, out

    # Every block's figures were saved; two saves pool into one table with twice the pairs
    # and the same rows (a long comparison run in pieces).
    combined = subprocess.run([sys.executable, str(BENCH), "--combine", str(saved), str(saved)],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert combined.returncode == 0, combined.stderr[-2000:]
    assert "== mlp/threads=1: 4 pairs of 10-step blocks from 2 run(s), pooled" in combined.stdout
    assert len(re.findall(rf"^otel-otlp{_RATIO}{_RATIO}", combined.stdout, re.M)) == 2
    assert len(re.findall(r"own cost: A/B share", combined.stdout)) == 2 * 8


def test_with_the_background_frozen_between_blocks_every_span_still_arrives_and_runs_pool_apart(
        tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    saved = tmp_path / "frozen.json"
    proc = subprocess.run([sys.executable, str(BENCH), "--smoke", "--frozen-background",
                           "--variants", "otel-otlp", "--save", str(saved)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    for workload, steps in (("gpt", 5), ("mlp", 10)):
        assert (f"== {workload}, threads=1: 2 pairs of {steps}-step blocks; the background "
                "frozen between them") in out, out
    # The exporter process and the receiver were stopped between blocks, and resumed:
    # every span otel-train built reached the receiver.
    rows = re.findall(rf"^otel-otlp{_RATIO}{_RATIO}.*?(\d+)/(\d+) built$", out, re.M)
    assert len(rows) == 2, out
    for *_ratios, got, built in rows:
        assert int(got) == int(built) > 0
    assert len(re.findall(r"^\s+own cost: A/B share", out, re.M)) == 2
    assert len(re.findall(r"background frozen between blocks: drains in progress at a "
                          r"block's end took \d+\.\d\d us per step off both clocks", out)) == 2
    assert "tracemalloc" not in out  # its blocks would run with the background thawed

    # A frozen run and one that settles after each block measure differently: no pooling.
    blocks = json.loads(saved.read_text())
    settled = tmp_path / "settled.json"
    settled.write_text(json.dumps({k: dict(v, frozen_background=False)
                                   for k, v in blocks.items()}))
    mixed = subprocess.run([sys.executable, str(BENCH), "--combine", str(saved), str(settled)],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert mixed.returncode != 0 and "--frozen-background" in mixed.stderr, mixed.stderr
    same = subprocess.run([sys.executable, str(BENCH), "--combine", str(saved), str(saved)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert same.returncode == 0 and "4 pairs of 10-step blocks" in same.stdout, same.stderr


def test_frozen_background_refuses_a_variant_with_no_exporter_process_to_stop() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(BENCH), "--smoke", "--frozen-background",
                           "--variants", "otel-otlp,otel-none"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert proc.returncode != 0
    assert "--frozen-background: variant 'otel-none'" in proc.stderr, proc.stderr
