"""The hot-path benchmark runs end to end (a few rounds), so it cannot rot unnoticed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_hot_path.py"


def _figure(out: str, label: str) -> float:
    match = re.search(rf"^{re.escape(label)}\s+(\d+\.\d+) us", out, re.M)
    assert match, (label, out)
    return float(match.group(1))


def test_a_short_run_prints_every_figure_and_the_paced_table_and_delivers_its_spans():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--rounds", "14", "--paced-rounds", "1",
         "--paced-steps", "40", "--step-us", "200", "--steady-blocks", "2",
         "--steady-steps", "60"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-2000:]
    floor = _figure(out, "floor: 6 empty timestamp context managers")
    ours = _figure(out, "otel-train hot path (training thread CPU)")
    # Real timings (with the C accelerator the hot path may cost less than six empty Python
    # blocks), and the ratio printed is theirs.
    assert floor > 0 and ours > 0
    assert re.search(r"^hot path: (C accelerator|pure Python)", out, re.M)
    ratio = float(re.search(r"= (\d+\.\d\d) x floor", out).group(1))
    assert ratio == pytest.approx(ours / floor, abs=0.06)
    rows = _figure(out, "  the same from span rows (the exporter process)")
    assert _figure(out, "  the same from span records (the exporter process)") > 0
    spans = _figure(out, "background: OTLP protobuf encoding (otel-train)")
    assert rows > 0 and spans > 0
    for variant in ("floor: 6 empty timestamp context managers", "otel-train, worker paused",
                    "otel-train, OTLP from the exporter process",
                    "otel-train, OTLP from an in-process thread"):
        assert re.search(rf"^{re.escape(variant)}\s+\d+\.\d\dus\s+\d+\.\d\dx", out, re.M), out
        if not variant.startswith("floor"):  # paired with the floor, round by round
            assert re.search(rf"^{re.escape(variant)}.*us\s+\d+\.\d+ \[\d+\.\d+, \d+\.\d+\]$",
                             out, re.M), out
    total = re.search(r"^background per exported 7-span step, .*: this process (\d+\.\d) us "
                      r"\+ the exporter process (\d+\.\d) us = (\d+\.\d) us", out, re.M)
    assert total, out
    here, there, both = map(float, total.groups())
    assert there > 0 and abs(here + there - both) < 0.2
    steady = re.search(r"^background per exported 7-span step in the steady state .*2 blocks "
                       r"of 60 paced steps.*: this process (\d+\.\d) us \+ the exporter "
                       r"process (\d+\.\d) us = (\d+\.\d) us \(blocks (\d+\.\d)-(\d+\.\d) us",
                       out, re.M)
    assert steady, out
    here, there, both, low, high = map(float, steady.groups())
    assert there > 0 and abs(here + there - both) < 0.2 and low <= both <= high
    # Every span the paced runs recorded reached the real receiver (the steady blocks too).
    match = re.search(r"spans: (\d+) delivered to the OTLP receiver, (\d+) built, (\d+) "
                      r"recorded", out)
    assert match, out
    delivered, built, recorded = map(int, match.groups())
    assert delivered == recorded > 0 and built <= recorded
