"""The processors benchmark runs end to end (a short run), so it cannot rot unnoticed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_run_prints_the_processors_both_ways_of_feeding_a_frame_and_both_record_twins():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_processors.py"), "--steps", "600",
         "--rounds", "1"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for label in ("processors + metrics (console off) [median]",
                  "span records' views (console off), view by view [median]",
                  "span records' views (console off), a frame at a time [median]",
                  "span records, flat phase rows in pure Python"):
        match = re.search(rf"^{re.escape(label)}\s+(\d+\.\d\d) µs$", proc.stdout, re.M)
        assert match and float(match.group(1)) > 0, proc.stdout


def test_a_short_live_run_prints_the_exporter_process_stage_by_stage():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_processors.py"), "--live",
         "--steps", "800", "--step-us", "300"], capture_output=True, text=True, env=env,
        cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for label in ("the exporter process, /proc, steps 200 on (all threads)", "  thread main",
                  "chain: views from records", "chain: PrometheusMetrics",
                  "chain: Overhead + Budget + Throughput", "main: marshal.loads of a frame",
                  "main: records queued for export (on_records)", "send: HTTP POST (_post)"):
        match = re.search(rf"^{re.escape(label)}\s+(\d+\.\d\d) µs", proc.stdout, re.M)
        assert match and float(match.group(1)) > 0, proc.stdout


def test_a_short_live_run_through_the_step_ring_prints_its_read_and_build_rows():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_processors.py"), "--live", "--ring",
         "--steps", "800", "--step-us", "300"], capture_output=True, text=True, env=env,
        cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "through the step ring (read and built in " in proc.stdout, proc.stdout
    for label in ("ring: read and decode (read_items)", "ring: build the steps' records (_build_run)",
                  "  thread otel-train-ring", "chain: views from records"):
        match = re.search(rf"^{re.escape(label)}\s+(\d+\.\d\d) µs", proc.stdout, re.M)
        assert match and float(match.group(1)) > 0, proc.stdout
