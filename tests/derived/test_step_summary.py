"""Summary mode: each rank exports one train.summary span per interval instead of its steps'
spans; the summaries add up to the per-step truth, slow steps still go out in full, and the
report and the chrome-trace export read them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from train_helpers import clean_env  # noqa: F401  (autouse)

from otel_train.common import attributes as A
from otel_train.derived.step_summary import StepSummary, nearest_rank
from otel_train.records.span_rows import rows_from_record
from otel_train.cli.main import main
from otel_train.rundir.span_files import read_span_dicts
from otel_train.rundir.summaries import phase_totals, read_summaries

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
STEPS, EVERY = 120, 50
PLANTED_SLOW = {0: 70, 1: 90}

CHILD = textwrap.dedent("""
    import json, sys, time, urllib.request
    sys.modules["torch"] = None  # sleeping loops need no torch
    import otel_train
    rank, status, here, slow = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
    run = otel_train.start_run(
        run_id="summary-run", rank=rank, world_size=2, local_rank=rank, span_mode="summary",
        summary_every_steps=int(sys.argv[6]), exporter="jsonl", prometheus_port=0,
        console=False, status_dir=status, warmup_steps=5, slow_step_factor=1000.0,
        slow_step_seconds=0.25, metrics_in_export_process=not here, report=False,
        step_ring=sys.argv[7])
    for step in run.steps(range(int(sys.argv[5]))):
        with step.phase("forward"):
            time.sleep(0.4 if step.index == slow else 0.001)
        with step.phase("backward"):
            pass
        with step.phase("backward"):  # twice a step: counted per phase span
            pass
    run.flush()
    with urllib.request.urlopen(run.prometheus_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    run.shutdown()
    print(json.dumps({"metrics": text}))
""")


def _phase_truth(text: str, rank: int) -> dict[str, tuple[float, float]]:
    """(count, sum seconds) per phase, from every step: the Prometheus phase histogram."""
    out: dict[str, list[float]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != A.METRIC_PHASE_DURATION:
            continue
        for s in fam.samples:
            if s.labels.get("rank") != str(rank):
                continue
            slot = out.setdefault(s.labels["phase"], [0.0, 0.0])
            if s.name.endswith("_count"):
                slot[0] += s.value
            elif s.name.endswith("_sum"):
                slot[1] += s.value
    return {k: (v[0], v[1]) for k, v in out.items()}


@pytest.mark.parametrize("step_ring", ["off", "on"])  # on: rank 0's exporter process reads it
def test_two_ranks_in_summary_mode_add_up_to_every_step(tmp_path: Path, step_ring: str):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    # rank 0: the exporter process summarizes; rank 1: this process does, before the pipe
    procs = [subprocess.Popen(
        [sys.executable, str(script), str(rank), str(run_dir), str(rank),
         str(PLANTED_SLOW[rank]), str(STEPS), str(EVERY), step_ring],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for rank in (0, 1)]
    outs = [p.communicate(timeout=90) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]

    summaries = read_summaries(run_dir)
    totals = phase_totals(summaries)
    for rank, (out, _) in enumerate(outs):
        mine = [s for s in summaries if s.rank == rank]
        # every 50 steps, and the last 20 at the end
        assert [(s.attributes[A.SUMMARY_STEP_FIRST], s.attributes[A.SUMMARY_STEP_LAST])
                for s in mine] == [(0, 49), (50, 99), (100, 119)]
        truth = _phase_truth(json.loads(out.strip().splitlines()[-1])["metrics"], rank)
        assert set(truth) == {"data", "forward", "backward"}
        for phase, (count, seconds) in truth.items():
            t = totals[(rank, phase)]
            assert t["count"] == count, (rank, phase)
            assert t["sum_seconds"] == pytest.approx(seconds, rel=1e-6, abs=1e-6), (rank, phase)
        assert totals[(rank, "backward")]["count"] == 2 * STEPS
        assert totals[(rank, "step")]["count"] == STEPS
        slow = PLANTED_SLOW[rank]
        listed = [n for s in mine for n in s.attributes[A.SUMMARY_SLOW_STEPS]]
        assert listed == [slow]
        assert totals[(rank, "forward")]["max_seconds"] >= 0.4
    # Per-step spans: only the slow steps, in full (root and phases).
    spans = read_span_dicts(run_dir)
    roots = sorted((int(_attr(s, A.RANK)), int(_attr(s, A.STEP))) for s in spans
                   if s["name"] == A.STEP_SPAN_NAME)
    assert roots == [(0, PLANTED_SLOW[0]), (1, PLANTED_SLOW[1])]
    assert sum(1 for s in spans if s["name"] == "backward") == 4
    # `otel-train report` and `otel-train export` read them.
    assert main(["report", str(run_dir)]) == 0 and main(["export", str(run_dir)]) == 0
    page = (run_dir / "report.html").read_text()
    assert "id='summaries'" in page and "p99 s (worst interval)" in page
    trace = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    slices = [e for e in trace if e.get("cat") == "summary"]
    assert len(slices) == 6
    assert {e["name"] for e in trace if e.get("ph") == "C"} == {
        "step seconds (summary)", "phase mean seconds (summary)"}
    assert sum(e["args"]["phase.forward.count"] for e in slices) == 2 * STEPS


def _attr(span: dict, key: str):
    for kv in span.get("attributes", ()):
        if kv["key"] == key:
            return next(iter(kv["value"].values()))
    return None


def _record(step: int, start: int, forward_ns: int, slow: bool = False) -> tuple:
    phase = ("forward", "train", None, forward_ns, 1, 7, start, start + forward_ns, None, (),
             None, None)
    return ("train.step", 1, 7, 1, start, start + forward_ns, {A.STEP: step, A.SLOW: slow},
            None, (), [phase], None)


def test_a_summary_carries_exact_percentiles_and_the_slow_steps():
    summary = StepSummary(every_steps=100, every_seconds=60.0)
    durations = [1000 * (i + 1) for i in range(100)]  # 1..100 us
    for step, ns in enumerate(durations):
        summary.add(_record(step, step * 10**6, ns, slow=step == 42), "slow" if step == 42 else None)
    (rec,) = summary.take_ready()
    a = rec[6]
    assert a[A.SUMMARY_STEPS] == 100 and (a[A.SUMMARY_STEP_FIRST], a[A.SUMMARY_STEP_LAST]) == (0, 99)
    assert a["train.summary.phase.forward.count"] == 100
    assert a["train.summary.phase.forward.sum_seconds"] == pytest.approx(sum(durations) / 1e9)
    assert a["train.summary.phase.forward.min_seconds"] == pytest.approx(1e-6)
    assert a["train.summary.phase.forward.max_seconds"] == pytest.approx(100e-6)
    assert a["train.summary.phase.forward.p50_seconds"] == pytest.approx(50e-6)
    assert a["train.summary.phase.forward.p99_seconds"] == pytest.approx(99e-6)
    assert a[A.SUMMARY_SLOW_STEPS] == [42] and a[A.SUMMARY_FAILED_STEPS] == []
    # One root span of its own, exported like a monitoring operation's.
    (row,) = rows_from_record(rec)
    assert row[0] == A.SUMMARY_SPAN_NAME and row[4] == 0
    assert nearest_rank([5], 0.99) == 5
    assert summary.take_all() == []  # nothing left over


def test_a_summary_also_closes_once_its_seconds_have_passed():
    summary = StepSummary(every_steps=1000, every_seconds=0.05)
    summary.add(_record(0, 0, 1000), None)
    assert summary.take_ready() == []
    time.sleep(0.06)
    summary.add(_record(1, 10**6, 1000), None)
    (rec,) = summary.take_ready()
    assert rec[6][A.SUMMARY_STEPS] == 2
    summary.add(_record(2, 2 * 10**6, 1000), None)
    (last,) = summary.take_all()  # the run ended: the partial interval goes out
    assert (last[6][A.SUMMARY_STEP_FIRST], last[6][A.SUMMARY_STEP_LAST]) == (2, 2)
