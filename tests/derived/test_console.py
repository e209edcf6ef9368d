"""ConsoleReportSpanProcessor: the fast log, the full breakdown on material monitoring only,
warm-up marks, red flags, rank names."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest
from span_trees import feed, monitor_span, step_spans, train_step

import otel_train
from otel_train.common.options import RunOptions
from otel_train.derived.budget import BudgetSpanProcessor
from otel_train.derived.console import ConsoleReportSpanProcessor
from otel_train.pipeline.settings import fast_log_min_interval_seconds
from otel_train.derived.overhead import OverheadSpanProcessor
from otel_train.derived.slow_steps import SlowStepSpanProcessor
from otel_train.records.steps_view import SharedStepSpanProcessor

pytestmark = pytest.mark.timeout(30)


def pipeline(log_every: int = 10, warmup_steps: int = 0, budget_min_steps: int = 10,
             **kw: object) -> tuple[SharedStepSpanProcessor, io.StringIO]:
    out = io.StringIO()
    ov = OverheadSpanProcessor(warmup_steps=warmup_steps)
    budget = BudgetSpanProcessor(ov, min_steps=budget_min_steps)
    console = ConsoleReportSpanProcessor(log_every, ov, budget, stream=out,
                                         warmup_steps=warmup_steps, **kw)  # type: ignore[arg-type]
    return SharedStepSpanProcessor([SlowStepSpanProcessor(warmup_steps=warmup_steps), ov,
                                    budget, console]), out


def test_fast_log_every_log_every_steps_one_line_each() -> None:
    shared, out = pipeline(log_every=10)
    for i in range(25):
        feed(shared, train_step(i, step_ms=100))
    lines = out.getvalue().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["⏱️  step 0", "⏱️  step 10", "⏱️  step 20"]
    assert "0.100s (data[train] 0.010s, forward 0.040s, backward 0.050s, other 0.000s)" in lines[1]
    # the verdict and its figure only: recent and total read the same, so they add nothing
    assert lines[1].endswith(" | monitoring OK: 0.0% steady state (budget 5%)")


def test_the_status_line_starts_with_the_steady_state_figure_that_drives_the_verdict() -> None:
    shared, out = pipeline(log_every=10)
    for i in range(101):  # 7 ms of inference every 10 steps of 100 ms: 7 / 1000 = 0.7%
        monitor_ms = 7 if i % 10 == 5 else 0
        feed(shared, train_step(i, step_ms=100 + monitor_ms, monitor_ms=monitor_ms))
    statuses = [ln.split(" | monitoring ")[1] for ln in out.getvalue().splitlines()
                if " | monitoring " in ln]
    # steps 0 and 5: before the budget judges (its 10th step), no verdict; step 10: the
    # inference has run once, its steady cost is not known
    assert statuses[:3] == [
        "verdict: not enough steps yet (a verdict needs 10)",
        "verdict: not enough steps yet (a verdict needs 10)",
        "verdict: not enough steps yet ('inference' ran once, at step 5: its steady cost "
        "needs a second call)"]
    statuses = statuses[3:]
    assert all(st.startswith(("OK: 0.6% steady state (budget 5%)",
                              "OK: 0.7% steady state (budget 5%)")) for st in statuses)
    # recent and total follow while they read differently (the first calls count in them)
    assert "OK: 0.7% steady state (budget 5%); recent 0.9%, total 0.9%" in statuses
    assert statuses[-1] == "OK: 0.7% steady state (budget 5%)"  # then they add nothing


def test_no_verdict_before_the_budget_judges_a_first_calls_cost_is_not_critical() -> None:
    # Step 0 runs a 3.4 s first inference beside 1.2 s of training: 290% of its training
    # time, a figure that means nothing yet; the budget judges once the inference has run
    # again, or, run once only, once it is a recent window (100 steps) behind.
    shared, out = pipeline(log_every=10)
    feed(shared, train_step(0, step_ms=4600, monitor_ms=3400))
    for i in range(1, 101):
        feed(shared, train_step(i, step_ms=100))
    lines = out.getvalue().splitlines()
    before = "\n".join(lines[:-1])  # step 0's breakdown, steps 10 to 90
    assert "CRITICAL" not in before and "critical" not in before and "%)" not in before[-200:]
    assert "| monitoring verdict: not enough steps yet (a verdict needs 10)" in lines[7]
    assert lines[-2].endswith("| monitoring verdict: not enough steps yet ('inference' ran "
                              "once, at step 0: its steady cost needs a second call)")
    # 100 steps on, told as what it cost over them (3.4 s over 11.2 s of training)
    assert lines[-1].startswith("⏱️  step 100:") and " | monitoring CRITICAL: " in lines[-1]


def test_a_critical_verdict_beside_lower_figures_says_why_it_stands() -> None:
    # 5 warm-up steps of 2 s (compilation), then 100 ms steps with 150 ms of validation
    # every 10 steps: 15% of the steady training time, but only 4.4% of all training time.
    shared, out = pipeline(log_every=10, warmup_steps=5)
    for i in range(5):
        feed(shared, train_step(i, step_ms=2000))
    for i in range(5, 41):
        monitor_ms = 150 if i % 10 == 5 else 0
        feed(shared, train_step(i, step_ms=100 + monitor_ms, monitor_ms=monitor_ms,
                                monitor="val_loss"))
    statuses = [ln.split(" | monitoring ")[1] for ln in out.getvalue().splitlines()
                if " | monitoring CRITICAL" in ln]
    status = statuses[0]  # the first verdict line says why the other figures are lower
    assert status.startswith("CRITICAL: 15.0% steady state (over the 10% critical level); "
                             "recent 2.7%, total 2.7%.")
    assert ("Recent and total are lower: the 5 warm-up steps (2.000 s of training each, "
            "against 0.100 s after) count there, not in the steady state.") in status
    assert status.endswith("The steady state is what a long run converges to, so the verdict "
                           "stands.")
    # and the lines after it say the figures only: the reason is said once
    assert statuses[-1] == ("CRITICAL: 15.0% steady state (over the 10% critical level); "
                            "recent 4.4%, total 4.4%")
    assert sum("verdict stands" in st for st in statuses) == 1


def test_an_explicit_log_every_has_no_time_floor_the_default_keeps_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    default = RunOptions.resolve(environ={})
    assert fast_log_min_interval_seconds(default) == 1.0
    assert fast_log_min_interval_seconds(RunOptions.resolve(environ={}, log_every=10)) == 0.0
    from_env = RunOptions.resolve(environ={"OTEL_TRAIN_LOG_EVERY": "10"})
    assert fast_log_min_interval_seconds(from_env) == 0.0
    both = RunOptions.resolve(environ={}, log_every=10, console_min_interval_seconds=5.0)
    assert fast_log_min_interval_seconds(both) == 5.0


def test_start_run_with_an_explicit_log_every_prints_every_tenth_fast_step(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = otel_train.start_run(exporter="none", prometheus_port=None, status_dir=str(tmp_path),
                               report=False, log_every=10)
    for step in run.steps(range(60), loader="train"):
        with step.phase("forward"):
            time.sleep(0.002)  # 2 ms steps: the default would print one line a second
    run.shutdown(timeout=10)
    err = capsys.readouterr().err
    # a step the machine made slow gets its line too ("🚩 slow step"): not a routine one
    printed = [int(m.group(1)) for m in re.finditer(r"⏱️  step (\d+)[^\n]*", err)
               if "slow step" not in m.group(0) or int(m.group(1)) % 10 == 0]
    assert printed == [0, 10, 20, 30, 40, 50]


def fast_loop_step(index: int, step_ms: float = 1.0) -> list:
    """A step of a ~1 ms loop: steps follow each other 1 ms apart."""
    return step_spans(index, [("forward", "train", 0, step_ms * 0.4),
                              ("backward", "train", step_ms * 0.4, step_ms)],
                      step_ms, start_ms=index * 1.0)


def test_a_fast_loop_gets_one_routine_line_per_interval_not_every_log_every_steps() -> None:
    shared, out = pipeline(log_every=10, min_interval_seconds=1.0)
    for i in range(3000):  # 3 s of 1 ms steps: log_every alone would print 300 lines
        feed(shared, fast_loop_step(i))
    lines = out.getvalue().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["⏱️  step 0", "⏱️  step 1000", "⏱️  step 2000"]
    shared, out = pipeline(log_every=10, min_interval_seconds=0)
    for i in range(100):
        feed(shared, fast_loop_step(i))
    assert len(out.getvalue().splitlines()) == 10  # 0: every log_every steps, as before


def test_slow_steps_and_breakdowns_are_never_held_back_by_the_interval() -> None:
    shared, out = pipeline(log_every=10, min_interval_seconds=60.0)
    for i in range(300):
        feed(shared, fast_loop_step(i, step_ms=40.0 if i == 150 else 1.0))
    phases = [("forward", "train", 0, 1), ("val_loss", "monitor", 1, 30)]
    feed(shared, step_spans(300, phases, 30, start_ms=300.0))
    text = out.getvalue()
    lines = [ln.split(":")[0] for ln in text.splitlines() if ln.startswith("⏱️  step")]
    assert lines == ["⏱️  step 0", "⏱️  step 150"]  # the routine ones wait a minute
    assert "🚩 slow step" in text.splitlines()[1]
    assert "TIMING BREAKDOWN (Step 300)" in text


def test_warm_up_steps_are_marked_on_their_lines() -> None:
    shared, out = pipeline(log_every=2, warmup_steps=3)
    for i in range(6):
        feed(shared, train_step(i, step_ms=100))
    lines = out.getvalue().splitlines()
    assert [ln.split(":")[0] for ln in lines] == [
        "⏱️  step 0 [warm-up]", "⏱️  step 2 [warm-up]", "⏱️  step 4"]


def test_full_breakdown_with_percentages_on_steps_that_ran_monitoring() -> None:
    shared, out = pipeline(log_every=1000)
    for i in range(1, 5):
        feed(shared, train_step(i, step_ms=100))
    phases = [("forward", "train", 0, 345), ("inference", "monitor", 345, 6468),
              ("val_loss", "monitor", 6468, 7924), ("data", "monitor", 6500, 6600, 2, "val")]
    feed(shared, step_spans(2600, phases, 8234))  # the first calls (marked: see below)
    feed(shared, step_spans(2800, phases, 8234))
    text = out.getvalue().split("⏱️  TIMING BREAKDOWN")[-1]
    assert "(Step 2,800):" in text
    assert "8.234s" in text
    assert "inference:      6.123s (74.4%)  [monitor]" in text
    assert "val_loss:       1.456s (17.7%)  [monitor]" in text
    assert "forward:        0.345s (4.2%)" in text
    assert "other:          0.310s (3.8%)" in text
    assert "(data[val] inside monitoring: 0.100s)" in text
    # the hand-timed summary: inference / val loss above, then training and other/overhead
    assert "monitoring: 92.0% of this step (training 4.2%, other/overhead 3.8%)" in text


def test_a_first_call_is_marked_and_said_to_be_left_out_of_the_steady_state() -> None:
    shared, out = pipeline(log_every=1000)
    for i in (0, 10):
        feed(shared, train_step(i, step_ms=200, monitor_ms=100))
    first, second = out.getvalue().split("⏱️  TIMING BREAKDOWN")[1:]
    assert "[monitor, first call: warm-up]" in first
    assert ("first call of inference: in the total; left out of the steady state (budget "
            "status, advisor) once it has run again") in first
    assert "first call" not in second and "[monitor]" in second


def test_small_monitoring_gets_the_fast_line_only_and_an_eval_operation_the_breakdown() -> None:
    shared, out = pipeline(log_every=10)
    for i in range(1, 101):  # a 0.3 ms collector every 5 steps of 100 ms: not material
        feed(shared, train_step(i, step_ms=100.3 if i % 5 == 0 else 100,
                                monitor_ms=0.3 if i % 5 == 0 else 0, monitor="collector"))
    text = out.getvalue()
    assert "TIMING BREAKDOWN" not in text
    assert len(text.splitlines()) == 10  # steps 10, 20, ..., 100
    assert "collector 0.000s" in text  # still shown on the fast line
    shared, out = pipeline(log_every=10, eval_operations=["val_loss"])
    feed(shared, train_step(3, step_ms=100.3, monitor_ms=0.3, monitor="val_loss"))
    assert "TIMING BREAKDOWN (Step 3)" in out.getvalue()
    shared, out = pipeline(log_every=10, breakdown_min_share=0.001)
    feed(shared, train_step(3, step_ms=100.3, monitor_ms=0.3, monitor="collector"))
    assert "TIMING BREAKDOWN (Step 3)" in out.getvalue()


def test_with_several_ranks_every_line_names_its_rank() -> None:
    shared, out = pipeline(log_every=1, world_size=8)
    feed(shared, step_spans(0, [("forward", "train", 0, 10)], 10, rank=5))
    feed(shared, step_spans(1, [("forward", "train", 0, 10),
                                ("inference", "monitor", 10, 20)], 20, rank=5))
    lines = out.getvalue().splitlines()
    assert len(lines) > 3 and all(ln.startswith("[rank 5] ") for ln in lines)
    shared, out = pipeline(log_every=1)
    feed(shared, step_spans(0, [("forward", "train", 0, 10)], 10))
    assert out.getvalue().startswith("⏱️  step 0")


def test_red_flags_are_named_when_a_share_crosses_its_threshold() -> None:
    shared, out = pipeline(log_every=1000, budget_min_steps=1)
    for step in (1, 2):  # its second call: the budget has its steady cost
        feed(shared, step_spans(step, [("forward", "train", 0, 20),
                                       ("inference", "monitor", 20, 960)], 1000))
    text = out.getvalue()
    assert "🚩 inference 94.0% of this step (> 90%)" in text
    assert ("🚩 monitoring budget critical: 1566.7% steady state share of training time "
            "(budget 5%, critical 10%)") in text
    shared, out = pipeline(log_every=1000)
    feed(shared, step_spans(1, [("forward", "train", 0, 20), ("val_loss", "monitor", 20, 60)],
                            100))
    text = out.getvalue()
    assert "🚩 val_loss 40.0%" not in text
    assert "🚩 other 40.0% of this step (> 20%)" in text


def test_monitoring_between_steps_prints_one_line() -> None:
    shared, out = pipeline()
    shared.on_end(monitor_span("checkpoint", after_step=41, duration_ms=1234))
    assert out.getvalue().startswith(
        "⏱️  monitor 'checkpoint' after step 41: 1.234s (first call)")


def test_validations_of_two_loaders_between_steps_each_name_their_loader() -> None:
    # The Lightning example: val_loss of loader 'clean', then of 'noisy', after step 9.
    shared, out = pipeline()
    for loader in ("clean", "noisy"):
        span = monitor_span("val_loss", after_step=9, duration_ms=120)
        span._attributes = {**span.attributes, "train.dataloader": loader}
        shared.on_end(span)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("⏱️  monitor 'val_loss' (loader 'clean') after step 9: 0.120s")
    assert lines[1].startswith("⏱️  monitor 'val_loss' (loader 'noisy') after step 9: 0.120s")


def test_a_monitoring_phase_large_in_its_step_is_said_beside_its_share_of_the_run() -> None:
    # multi_dataloader's shape: a validation pass that is 69% of its step every 100 steps,
    # a few percent of the run's training time (3 x 45 ms over 201 x 20 ms: 3.4%): the red
    # flag says both.
    shared, out = pipeline(log_every=1000)
    for i in range(201):
        val = 45.0 if i % 100 == 0 else 0.0
        feed(shared, train_step(i, step_ms=20 + val, monitor_ms=val, monitor="val_loss"))
    flag = [ln for ln in out.getvalue().splitlines() if "🚩 val_loss" in ln][-1]
    assert flag == ("   🚩 val_loss 69.2% of this step (> 50%): validation set too large or "
                    "inefficient; over the run so far val_loss is 3.4% of training time, the "
                    "measure the monitoring verdict uses")


def test_log_every_must_be_positive() -> None:
    with pytest.raises(ValueError, match="log_every"):
        ConsoleReportSpanProcessor(0)
    with pytest.raises(ValueError, match="console_min_interval_seconds"):
        ConsoleReportSpanProcessor(10, min_interval_seconds=-1.0)


@pytest.mark.parametrize("step_ring", ["off", "auto"])
def test_the_console_reads_alike_when_the_exporter_process_reads_the_step_ring(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], step_ring: str) -> None:
    """The console runs in the exporter process (its derived metrics there); with the step
    ring (the default on that plan) it builds the flat steps from the ring: the same lines
    in step order, the fast lines every log_every steps, the breakdown of the step whose
    monitoring is material, as on the queue path."""
    from train_helpers import start_test_run

    run = start_test_run(tmp_path, console=True, log_every=10,
                         console_min_interval_seconds=0, step_ring=step_ring)
    assert run._telemetry.client.reads_ring == (step_ring == "auto")
    assert run._telemetry.derived.remote is not None  # the console's lines come from there
    for step in run.steps(range(50), loader="train"):
        with step.phase("forward"):
            time.sleep(0.002)
        if step.index == 35:
            with step.monitor("val_loss"):
                time.sleep(0.1)  # material monitoring: a breakdown
    run.shutdown(timeout=10)
    err = capsys.readouterr().err
    printed = [int(m.group(1)) for m in re.finditer(r"⏱️  step (\d+)[^\n]*", err)]
    assert printed == sorted(printed)  # in step order
    # a step the machine made slow gets its line too ("🚩 slow step"): not a routine one
    routine = [int(m.group(1)) for m in re.finditer(r"⏱️  step (\d+)[^\n]*", err)
               if "slow step" not in m.group(0) or int(m.group(1)) % 10 == 0]
    assert [i for i in routine if i % 10 == 0] == [0, 10, 20, 30, 40]
    assert "TIMING BREAKDOWN (Step 35)" in err
    breakdown = err.split("TIMING BREAKDOWN (Step 35)")[1]
    assert re.search(r"val_loss:\s+0\.1\d\ds \(\d+\.\d%\)", breakdown)
