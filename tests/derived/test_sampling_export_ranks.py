"""export_ranks: only the chosen ranks send their ordinary steps; every rank still sends the
steps that matter, keeps its metrics, and step N's spans of all ranks share one trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest
from otlp_receivers import GrpcOtlpReceiver
from prometheus_client.parser import text_string_to_metric_families
from train_helpers import clean_env  # noqa: F401  (autouse)

from otel_train.common.identity import step_trace_id
from otel_train.derived.sampling import SAMPLE_REASON

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]
STEPS = 100
PLANTED_SLOW = {0: 30, 1: 45, 2: 60, 3: 75}

CHILD = textwrap.dedent("""
    import json, sys, time, urllib.request
    sys.modules["torch"] = None  # sleeping loops need no torch: start in a second, not ten
    import otel_train
    rank, endpoint, status, route = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    slow = int(sys.argv[5])
    run = otel_train.start_run(
        run_id="ranks-run", rank=rank, world_size=4, local_rank=rank, export_ranks="0",
        exporter="otlp", otlp_endpoint=endpoint, otlp_protocol="grpc", prometheus_port=0,
        console=False, status_dir=status, export_interval_seconds=0.2, warmup_steps=5,
        slow_step_factor=1000.0, slow_step_seconds=0.25,  # slow: the planted step only
        export_process=route != "stage", metrics_in_export_process=route in ("process", "ring"),
        step_ring="on" if route == "ring" else "off")
    for step in run.steps(range(int(sys.argv[6]))):
        with step.phase("forward"):
            time.sleep(0.4 if step.index == slow else 0.002)
        with step.phase("backward"):
            pass
    run.flush()
    with urllib.request.urlopen(run.prometheus_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    run.shutdown()
    print(json.dumps({"metrics": text}))
""")
# Each route a rank's spans can take: the exporter process deciding (metrics there), this
# process deciding before the exporter process, the in-process export stage, and the
# exporter process deciding on the steps it reads from the step ring.
ROUTES = {0: "process", 1: "here", 2: "stage", 3: "ring"}


def _steps_total(text: str, rank: int) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "otel_train_steps_total" and s.labels.get("rank") == str(rank):
                return s.value
    raise KeyError("otel_train_steps_total")


def test_export_ranks_0_sends_rank_0s_steps_and_every_ranks_slow_step(tmp_path: Path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    with GrpcOtlpReceiver() as rx:
        procs = [subprocess.Popen(
            [sys.executable, str(script), str(rank), rx.endpoint, str(tmp_path / f"r{rank}"),
             ROUTES[rank], str(PLANTED_SLOW[rank]), str(STEPS)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for rank in range(4)]
        outs = [p.communicate(timeout=90) for p in procs]
        for p, (out, err) in zip(procs, outs):
            assert p.returncode == 0, err[-3000:]
        spans = rx.spans()
    roots: dict[int, dict[int, object]] = defaultdict(dict)
    for s in spans:
        if s.name == "train.step":
            roots[s.attributes["train.rank"]][s.attributes["train.step"]] = s
    # Rank 0 sends every step; the others only their planted slow step (root and phases).
    assert sorted(roots[0]) == list(range(STEPS))
    for rank in (1, 2, 3):
        assert sorted(roots[rank]) == [PLANTED_SLOW[rank]], (rank, sorted(roots[rank]))
        root = roots[rank][PLANTED_SLOW[rank]]
        assert root.attributes["train.slow"] is True
        assert root.attributes[SAMPLE_REASON] == "slow"
        phases = {s.name for s in spans if s.trace_id == root.trace_id
                  and s.attributes.get("train.rank") == rank and s.name != "train.step"}
        assert phases >= {"forward", "backward"}
    # Step N of every rank is one trace: the slow step of rank 2 joins rank 0's step 60.
    for rank, step in PLANTED_SLOW.items():
        assert roots[rank][step].trace_id == roots[0][step].trace_id == \
            f"{step_trace_id('ranks-run', step):032x}"
    # Every rank served its metrics, from every step.
    for rank, (out, _) in enumerate(outs):
        text = json.loads(out.strip().splitlines()[-1])["metrics"]
        assert _steps_total(text, rank) == STEPS


def _record(step: int, attrs: dict | None = None, events: tuple = (), kind: str = "train",
            failed: bool = False) -> tuple:
    phase = ("forward", kind, None, 1000, 1, 7, 0, 1000, (2, "boom") if failed else None, (),
             None, None)
    return ("train.step", step + 1, 7, 1, 0, 1000, {"train.step": step, **(attrs or {})},
            None, events, [phase], None)


def test_a_rank_left_out_keeps_slow_failed_stalled_and_truncated_steps_only():
    from otel_train.derived.sampling import StepTailSampler
    from otel_train.derived.stall_stacks import STALL_EVENT
    quiet = StepTailSampler(0.0, 0, keep_monitor=False)
    records = {
        "ordinary": _record(1), "first": _record(0), "monitoring": _record(2, kind="monitor"),
        "slow": _record(3, {"train.slow": True}), "error": _record(4, failed=True),
        "truncated": _record(5, {"train.truncated": True}),
        "stall": _record(6, events=((STALL_EVENT, 0, {}),)),
    }
    kept = {name: quiet.keep_record(rec) for name, rec in records.items()}
    assert kept == {"ordinary": False, "first": False, "monitoring": False, "slow": True,
                    "error": True, "truncated": True, "stall": True}
    assert {name: rec[6].get(SAMPLE_REASON) for name, rec in records.items() if kept[name]} == {
        "slow": "slow", "error": "error", "truncated": "truncated", "stall": "stall"}
