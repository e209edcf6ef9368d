"""Goodput and the job envelope (derived/goodput.py): the parts of the job's time from hand-made
span records, and a real MLP loop with a planted 1 s checkpoint every 100 steps measured
against its own clock."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from train_helpers import read_file_spans

from otel_train.common import attributes as A
from otel_train.derived.goodput import (
    GoodputCollector,
    GoodputSpanProcessor,
    carry_previous,
    envelope_line,
)
from otel_train.records.envelope_records import StartupRecordMaker
from otel_train.records.span_rows import view_from_record
from otel_train.records.steps_view import SharedStepSpanProcessor

pytestmark = pytest.mark.timeout(180)  # one subprocess importing torch
MS = 1_000_000
T0 = 1_700_000_000 * 1_000_000_000  # the job's start, epoch ns


def step_rec(index: int, start_ms: int, end_ms: int,
             monitors: tuple[tuple[str, int], ...] = ()) -> tuple[Any, ...]:
    """A step's span record: a forward phase, then monitoring phases of the given ms."""
    start, end = T0 + start_ms * MS, T0 + end_ms * MS
    phases = []
    at = end - sum(ms for _, ms in monitors) * MS
    phases.append(("forward", A.KIND_TRAIN, None, at - start, 1, 7, start, at, None, None,
                   None, None))
    for name, ms in monitors:
        phases.append((name, A.KIND_MONITOR, None, ms * MS, len(phases) + 1, 7, at,
                       at + ms * MS, None, None, None, None))
        at += ms * MS
    return (A.STEP_SPAN_NAME, index + 1, 7, 1, start, end, {A.STEP: index}, None, None,
            phases, None)


def op_rec(name: str, start_ms: int, end_ms: int, span_name: str | None = None,
           **attrs: Any) -> tuple[Any, ...]:
    """A monitoring operation between steps."""
    a = {A.STEP: 0, A.PHASE: name, A.PHASE_KIND: A.KIND_MONITOR, **attrs}
    return (span_name or name, 99, 8, 1, T0 + start_ms * MS, T0 + end_ms * MS, a, None, None,
            None, None)


def processor(**settings: Any) -> tuple[GoodputSpanProcessor, SharedStepSpanProcessor]:
    proc = GoodputSpanProcessor({"job_start_epoch_ns": T0, **settings})
    return proc, SharedStepSpanProcessor([proc])


def feed(shared: SharedStepSpanProcessor, *recs: tuple[Any, ...]) -> None:
    shared.on_views([view_from_record(r, 0) for r in recs])


def test_the_jobs_time_is_cut_into_startup_steps_checkpoint_evaluation_and_other() -> None:
    proc, shared = processor()
    startup = StartupRecordMaker(T0, "process", 100 * MS, T0).record(500 * MS, 300 * MS)
    feed(shared, startup,
         step_rec(0, 500, 600),
         step_rec(1, 600, 800, monitors=(("val_loss", 50),)),  # 150 ms training, 50 eval
         op_rec("checkpoint", 800, 1800, A.CHECKPOINT_SPAN_NAME,
                **{A.CHECKPOINT_ACTION: "save"}),
         op_rec("final_eval", 1900, 2000))  # 100 ms gap before it: other
    parts = proc.parts_seconds()
    assert parts == pytest.approx({"startup": 0.5, "steps": 0.25, "checkpoint": 1.0,
                                   "evaluation": 0.15, "restart_lost": 0.0, "other": 0.1})
    assert proc.job_seconds() == pytest.approx(2.0)
    assert proc.goodput_ratio() == pytest.approx(0.25 / 2.0)
    assert sum(parts.values()) == pytest.approx(proc.job_seconds())


def test_the_startup_span_has_its_three_children_and_starts_at_the_process_start() -> None:
    rec = StartupRecordMaker(T0, "process", 100 * MS, T0).record(500 * MS, 300 * MS)
    name, _, root, _, start, end, attrs, _, _, phases, _ = rec
    assert (name, start, end) == (A.STARTUP_SPAN_NAME, T0, T0 + 500 * MS)
    assert attrs[A.PHASE_KIND] == A.KIND_ENVELOPE and attrs[A.STARTUP_FROM] == "process"
    assert [(p[0], p[6] - T0, p[7] - T0) for p in phases] == [
        ("before_start_run", 0, 100 * MS), ("start_run", 100 * MS, 300 * MS),
        ("to_first_step", 300 * MS, 500 * MS)]
    assert all(p[5] == root for p in phases)
    fallback = StartupRecordMaker(T0 + 100 * MS, "start_run", 100 * MS, T0).record(
        500 * MS, 300 * MS)
    assert [p[0] for p in fallback[9]] == ["start_run", "to_first_step"]


def test_the_startup_view_reaches_only_processors_that_take_the_envelope() -> None:
    seen: list[str] = []

    class Other(GoodputSpanProcessor):
        takes_envelope = False

        def on_operation(self, view: Any) -> None:
            seen.append(view.name)

    other = Other({"job_start_epoch_ns": T0})
    proc = GoodputSpanProcessor({"job_start_epoch_ns": T0})
    shared = SharedStepSpanProcessor([other, proc])
    startup = StartupRecordMaker(T0, "process", 0, T0).record(5 * MS, None)
    feed(shared, startup, op_rec("checkpoint", 2, 3), step_rec(0, 5, 6))
    assert seen == ["checkpoint"]  # not the start-up: it is neither training nor monitoring
    # Start-up: the job's start -> the first step, less the checkpoint load counted apart.
    assert proc.parts_seconds()["startup"] == pytest.approx(0.004)
    assert proc.parts_seconds()["checkpoint"] == pytest.approx(0.001)
    shared._dispatch(view_from_record(startup, 0))  # the span path's dispatch: the same rule
    assert seen == ["checkpoint"]


def test_a_checkpoint_inside_a_step_counts_as_checkpoint_and_a_load_keeps_the_redo_clock() -> None:
    proc, shared = processor()
    feed(shared, step_rec(0, 0, 100, monitors=((A.CHECKPOINT_OPERATION, 40),)))
    assert proc.parts_seconds()["checkpoint"] == pytest.approx(0.04)
    assert proc.checkpoint_saves == 1 and proc.steps_since_save_ns == 0
    feed(shared, step_rec(1, 100, 200),
         op_rec("checkpoint", 200, 300, A.CHECKPOINT_SPAN_NAME, **{A.CHECKPOINT_ACTION: "load"}))
    assert proc.checkpoint_saves == 1
    assert proc.steps_since_save_ns == 100 * MS  # a load is not a save


def test_the_parts_only_grow_as_steps_arrive_and_gaps_between_steps_are_other() -> None:
    proc, shared = processor()
    seen = []
    for i in range(20):
        feed(shared, step_rec(i, i * 100 + 30, i * 100 + 100))  # 30 ms unrecorded between
        seen.append(proc.parts_seconds())
    for before, after in zip(seen, seen[1:]):
        assert all(after[p] >= before[p] for p in A.JOB_PARTS)
    assert seen[-1]["startup"] == pytest.approx(0.03)  # the job's start -> the first step
    assert seen[-1]["other"] == pytest.approx(19 * 0.03)  # the gaps between steps


def test_state_exported_from_one_processor_continues_in_another() -> None:
    proc, shared = processor()
    feed(shared, step_rec(0, 0, 100), op_rec("checkpoint", 100, 200, A.CHECKPOINT_SPAN_NAME))
    copy = GoodputSpanProcessor({"job_start_epoch_ns": T0})
    copy.load_state(json.loads(json.dumps(proc.export_state())))
    assert copy.envelope() == proc.envelope()


def test_a_resumed_attempt_carries_the_previous_parts_and_counts_the_gap_and_redone_steps() -> None:
    previous = {"attempt": 1, "job_seconds": 10.0, "horizon_epoch_ns": T0,
                "parts_seconds": {"startup": 2.0, "steps": 6.0, "checkpoint": 1.0,
                                  "evaluation": 0.5, "restart_lost": 0.0, "other": 0.5},
                "checkpoint_saves": 2, "steps_since_save_seconds": 1.5,
                "startup_trace_id": "ab" * 16}
    carried = carry_previous(previous, T0 + 4_000 * MS)  # started 4 s after its last step
    assert carried["attempt"] == 2
    assert carried["restart_lost_seconds"] == pytest.approx(5.5)
    assert carried["carried_seconds"]["steps"] == pytest.approx(4.5)
    assert carried["carried_job_seconds"] == pytest.approx(14.0)
    proc = GoodputSpanProcessor({"job_start_epoch_ns": T0 + 4_000 * MS, **carried})
    shared = SharedStepSpanProcessor([proc])
    feed(shared, step_rec(0, 4_000, 5_000))
    assert proc.job_seconds() == pytest.approx(15.0)
    assert proc.parts_seconds()["restart_lost"] == pytest.approx(5.5)
    assert proc.goodput_ratio() == pytest.approx(5.5 / 15.0)
    never_saved = carry_previous({**previous, "checkpoint_saves": 0}, T0)
    assert never_saved["restart_lost_seconds"] == 0.0  # no save recorded: nothing known redone


def test_the_collector_serves_the_gauge_and_one_counter_per_part() -> None:
    proc, shared = processor()
    feed(shared, step_rec(0, 0, 100))
    fams = {f.name: f for f in GoodputCollector(proc, 3).collect()}
    assert fams[A.METRIC_GOODPUT].samples[0].value == pytest.approx(1.0)
    assert fams[A.METRIC_GOODPUT].samples[0].labels == {"rank": "3"}
    parts = {s.labels["part"]: s.value for s in fams["otel_train_job_seconds"].samples
             if s.name == A.METRIC_JOB_SECONDS}
    assert set(parts) == set(A.JOB_PARTS) and parts["steps"] == pytest.approx(0.1)
    assert "goodput 100.0%" in envelope_line(proc.envelope())


MLP_SCRIPT = """
import time
T0 = time.time()  # first line: the process started just before
import json, sys
import torch
import otel_train

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))
run = otel_train.start_run(run_id="mlp-goodput", status_dir=sys.argv[1], prometheus_port=None,
                           console=True, log_every=1000, export_interval_seconds=0.1,
                           startup_span=True)
checkpoint_walls = []
loop_start = time.time()
for i in range(300):
    with run.step() as step:
        with step.phase("forward"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        with step.phase("backward"):
            loss.backward()
        with step.phase("optimizer"):
            opt.step(); opt.zero_grad()
        time.sleep(0.002)  # a steadier step on a busy machine
    if i % 100 == 99:  # the planted checkpoint
        c0 = time.time()
        with run.checkpoint():
            time.sleep(1.0)
        checkpoint_walls.append(time.time() - c0)
loop_end = time.time()
run.shutdown()
print(json.dumps({"T0": T0, "loop_start": loop_start, "loop_end": loop_end,
                  "checkpoint_walls": checkpoint_walls}))
"""


def test_an_mlp_loop_with_a_1s_checkpoint_every_100_steps_reports_goodput_within_1pp(
        tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "mlp.py"
    script.write_text(textwrap.dedent(MLP_SCRIPT))
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    before_popen = time.time()
    proc = subprocess.run([sys.executable, str(script), str(run_dir)], capture_output=True,
                          text=True, timeout=150, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    clock = json.loads(proc.stdout.strip().splitlines()[-1])
    # The truth, by the script's own clock: steps = the loop's wall less the checkpoints';
    # the job = its first line -> the loop's end.
    steps_truth = clock["loop_end"] - clock["loop_start"] - sum(clock["checkpoint_walls"])
    goodput_truth = steps_truth / (clock["loop_end"] - clock["T0"])
    env_ = json.loads((run_dir / "monitoring_costs.json").read_text())["envelope"]
    print(f"goodput {env_['goodput_ratio']:.4f}, truth {goodput_truth:.4f}, "
          f"job {env_['job_seconds']:.2f}s, parts {env_['parts_seconds']}")
    assert env_["goodput_ratio"] == pytest.approx(goodput_truth, abs=0.01)
    # Start-up (torch's import) dominates this short job: the steps' part on its own too.
    assert env_["parts_seconds"]["steps"] == pytest.approx(steps_truth, rel=0.03)
    assert env_["parts_seconds"]["checkpoint"] == pytest.approx(
        sum(clock["checkpoint_walls"]), abs=0.05)
    spans = read_file_spans(run_dir)
    startup = [s for s in spans if s.name == A.STARTUP_SPAN_NAME]
    assert len(startup) == 1 and startup[0].duration_seconds > 0
    # It starts when the process did: after the test's Popen, before the script's first line
    # (to the 10 ms ticks /proc counts in: 30 ms either side).
    assert before_popen * 1e9 - 30e6 <= startup[0].start_ns <= clock["T0"] * 1e9 + 30e6
    assert startup[0].attributes[A.ATTEMPT] == 1
    children = {s.name for s in spans if s.parent_id == startup[0].span_id}
    assert children == {"before_start_run", "start_run", "to_first_step"}
    checkpoints = [s for s in spans if s.name == A.CHECKPOINT_SPAN_NAME]
    assert [s.attributes[A.CHECKPOINT_ACTION] for s in checkpoints] == ["save"] * 3
    assert all(s.duration_seconds >= 1.0 for s in checkpoints)
    assert "otel-train: goodput" in proc.stderr  # the console's summary at the end
    report = (run_dir / "report.html").read_text()
    assert f"data-goodput='{env_['goodput_ratio']:.6f}'" in report


def test_a_frame_of_steps_adds_up_as_step_by_step_even_where_a_step_fails_half_way() -> None:
    """on_steps (the sums in locals over a frame) against on_step per view: the first step
    failing after its sums (an unreadable end), checkpoint phases among the monitoring,
    steps without monitoring; the same parts, horizon and saves."""
    def views() -> list[Any]:
        out = []
        for i in range(40):
            phases = [("forward", "train", None, 4_000_000, 1, 0x40 + i, 0, 1, None, (), None,
                       None)]
            if i % 3 == 0:
                phases.append(("inference", "monitor", None, 500_000, 2, 0x40 + i, 0, 1, None,
                               (), None, None))
            if i % 7 == 2:
                phases.append(("checkpoint", "monitor", None, 900_000, 3, 0x40 + i, 0, 1,
                               None, (), None, None))
            start = 2_000_000_000 + i * 10_000_000
            view = view_from_record(("train.step", i, 0x40 + i, 1, start, start + 6_000_000,
                                     {"train.step": i}, None, (), phases, None), 0)
            out.append(view)
        out[0].end_ns = None  # on_step fails at the horizon, after adding the step
        out[9].duration_ns = None  # fails before adding anything
        return out

    settings = {"job_start_epoch_ns": 1_000_000_000}
    by_frame, by_step = GoodputSpanProcessor(settings), GoodputSpanProcessor(settings)
    failed: list[int] = []
    by_frame.on_steps(views(), lambda proc, view, exc: failed.append(view.step))
    for view in views():
        try:
            by_step.on_step(view)
        except TypeError:
            failed.append(view.step)
    assert failed == [0, 9, 0, 9]
    assert by_frame.export_state() == by_step.export_state()
    assert by_frame.checkpoint_saves == 5 and by_frame.parts_ns["checkpoint"] > 0
