"""BudgetSpanProcessor status and warnings, and the advisor's projections."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
from span_trees import feed, monitor_span, train_step

from otel_train.derived.budget import (
    BudgetSpanProcessor,
    BudgetVerdict,
    VerdictContext,
    advise,
    budget_status,
    held_status,
)
from otel_train.derived.overhead import OverheadSpanProcessor
from otel_train.records.steps_view import SharedStepSpanProcessor

pytestmark = pytest.mark.timeout(30)


def make(**kw: object) -> tuple[SharedStepSpanProcessor, OverheadSpanProcessor,
                                BudgetSpanProcessor]:
    ov = OverheadSpanProcessor()
    budget = BudgetSpanProcessor(ov, **kw)  # type: ignore[arg-type]
    return SharedStepSpanProcessor([ov, budget]), ov, budget


def test_status_is_ok_up_to_the_budget_then_warning_then_critical() -> None:
    assert budget_status(0.05, 0.05, 0.10) == "ok"
    assert budget_status(0.06, 0.05, 0.10) == "warning"
    assert budget_status(0.11, 0.05, 0.10) == "critical"


def test_one_warning_when_the_budget_is_crossed_not_one_per_step(
        caplog: pytest.LogCaptureFixture) -> None:
    shared, ov, budget = make(min_steps=1)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for i in range(50):
            feed(shared, train_step(i, step_ms=100, monitor_ms=7))  # 7 / 93 = 7.5%: warning
    msgs = [r.getMessage() for r in caplog.records if "monitoring WARNING" in r.getMessage()]
    assert len(msgs) == 1
    # the verdict's own figure first, named
    assert msgs[0].startswith("otel-train: monitoring WARNING: 7.5% of training time in "
                              "steady state (over the 5% budget)")
    assert budget.status() == "warning"


def test_a_warning_beside_lower_recent_and_total_figures_says_why_it_stands(
        caplog: pytest.LogCaptureFixture) -> None:
    # 5 warm-up steps of 2 s, then 150 ms of validation every 10 steps of 100 ms: 15% of
    # the steady training time, a few percent of all of it.
    ov = OverheadSpanProcessor(warmup_steps=5)
    shared = SharedStepSpanProcessor([ov, BudgetSpanProcessor(ov, min_steps=1)])
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for i in range(5):
            feed(shared, train_step(i, step_ms=2000))
        for i in range(5, 60):
            monitor_ms = 150 if i % 10 == 0 else 0
            feed(shared, train_step(i, step_ms=100 + monitor_ms, monitor_ms=monitor_ms,
                                    monitor="val_loss"))
    msgs = [r.getMessage() for r in caplog.records if "monitoring CRITICAL" in r.getMessage()]
    assert len(msgs) == 1
    assert msgs[0].startswith("otel-train: monitoring CRITICAL: 15.0% of training time in "
                              "steady state (over the 10% critical level); recent 2.6%, "
                              "total 2.6%. Recent and total are lower: the 5 warm-up steps "
                              "(2.000 s of training each, against 0.100 s after) count there")
    assert "so the verdict stands" in msgs[0]


def test_the_verdict_names_each_figure_and_the_reason_it_disagrees() -> None:
    ok = BudgetVerdict(0.03, 0.20, 0.03, 0.05, 0.10)
    ctx = VerdictContext(steps=1000, recent_steps=100)
    assert ok.disagreeing() == ["recent"]
    assert ok.describe(context=ctx) == (
        "OK: 3.0% steady state (budget 5%); recent 20.0%, total 3.0%. Recent is higher: the "
        "last 100 steps had a monitoring call, which weighs more there than over its "
        "interval. The steady state, without warm-up, is what a long run converges to.")
    late = BudgetVerdict(0.12, 0.12, 0.06, 0.05, 0.10)
    ctx = VerdictContext(steps=1000, late_operation=("val_loss", 500), recent_steps=100)
    assert late.describe(context=ctx, all_figures=False) == (
        "CRITICAL: 12.0% steady state (over the 10% critical level); total 6.0%. The total "
        "is lower: the steps before 'val_loss' first ran (step 500) count there. The steady "
        "state is what a long run converges to, so the verdict stands.")
    agreeing = BudgetVerdict(0.07, 0.08, 0.06, 0.05, 0.10)
    assert agreeing.describe() == ("WARNING: 7.0% steady state (over the 5% budget); "
                                   "recent 8.0%, total 6.0%")


def test_going_critical_warns_again(caplog: pytest.LogCaptureFixture) -> None:
    shared, ov, budget = make(min_steps=1)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for i in range(5):
            feed(shared, train_step(i, step_ms=100, monitor_ms=7))
        for i in range(5, 30):
            feed(shared, train_step(i, step_ms=100, monitor_ms=30))
    text = caplog.text
    assert "monitoring WARNING" in text and "monitoring CRITICAL" in text
    assert budget.status() == "critical"


def test_no_status_warning_before_min_steps(caplog: pytest.LogCaptureFixture) -> None:
    shared, ov, budget = make(min_steps=10)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        feed(shared, train_step(0, step_ms=100, monitor_ms=90))  # eval at step 0
    assert "monitoring" not in caplog.text
    assert budget.status() == "critical"  # the status itself is still the truth


def test_a_single_slow_operation_warns_once_and_is_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    shared, ov, budget = make(slow_operation_seconds=0.05)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for i in range(3):
            feed(shared, train_step(i, step_ms=1000, monitor_ms=60))
    msgs = [r.getMessage() for r in caplog.records if "took" in r.getMessage()]
    assert len(msgs) == 1 and "'inference'" in msgs[0] and "0.1 s" in msgs[0]
    assert budget.slow_operations == {"inference": 3}


def test_advisor_projects_share_and_smallest_interval_within_budget() -> None:
    ov = OverheadSpanProcessor()
    # 2 s steps of training; a 1 s operation every 10 steps
    for i in range(21):
        feed(ov, train_step(i, step_ms=3000 if i % 10 == 0 else 2000,
                            monitor_ms=1000 if i % 10 == 0 else 0))
    (adv,) = advise(ov.snapshot(), 0.05)
    assert adv.operation == "inference"
    assert adv.interval_steps == 10
    assert adv.mean_seconds == pytest.approx(1.0)
    assert adv.projected_share == pytest.approx(1 / (10 * 2))  # c / (k s)
    # c / (b s) = 1 / (0.05 * 2) = 10 -> every >= 10 steps
    assert adv.min_interval_steps == 10
    assert adv.within_budget
    assert "every >= 10 steps" in adv.advice


def test_advisor_says_to_run_an_expensive_operation_less_often() -> None:
    ov = OverheadSpanProcessor()
    for i in range(11):  # 180 s snapshot every 5 steps of 3.5 s (the 'hung' evolution-snapshot case)
        feed(ov, train_step(i, step_ms=3500 + (180_000 if i % 5 == 0 else 0),
                            monitor_ms=180_000 if i % 5 == 0 else 0, monitor="evolution"))
    (adv,) = advise(ov.snapshot(), 0.05)
    assert not adv.within_budget
    assert adv.min_interval_steps == math.ceil(180 / (0.05 * 3.5)) == 1029
    assert "over the 5% budget" in adv.advice


def test_a_slow_first_validation_pass_leaves_the_run_ok_and_the_advisor_on_steady_state(
        caplog: pytest.LogCaptureFixture) -> None:
    # 11.25 ms of training per step; val_loss every 10 steps: 96 ms on its first call
    # (warm-up), 3.6 ms afterwards: 3.2% in steady state, inside the 5% budget.
    shared, ov, budget = make()
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for i in range(100):
            val = (96.0 if i == 0 else 3.6) if i % 10 == 0 else 0.0
            feed(shared, train_step(i, step_ms=11.25 + val, monitor_ms=val, monitor="val_loss"))
    snap = ov.snapshot()
    assert snap.cumulative_ratio == pytest.approx((96 + 9 * 3.6) / 1125)  # 11.4%: all counted
    assert snap.cumulative_ratio > budget.critical
    assert snap.steady_ratio == pytest.approx(10 * 3.6 / 1125)  # 3.2%
    assert budget.status() == "ok"
    assert "monitoring" not in caplog.text  # no budget warning either
    (adv,) = budget.advice()
    assert adv.mean_seconds == pytest.approx(0.0036)
    assert adv.projected_share == pytest.approx(0.032)
    assert adv.within_budget
    assert adv.min_interval_steps == math.ceil(3.6 / (0.05 * 11.25)) == 7  # not 23
    assert "first call 0.096 s: warm-up, left out" in adv.advice


def test_budget_must_be_below_critical() -> None:
    with pytest.raises(ValueError, match="budget"):
        BudgetSpanProcessor(OverheadSpanProcessor(), budget=0.2, critical=0.1)


def test_with_several_ranks_budget_warnings_name_their_rank(
        caplog: pytest.LogCaptureFixture) -> None:
    ov = OverheadSpanProcessor()
    budget = BudgetSpanProcessor(ov, min_steps=1, slow_operation_seconds=0.01, world_size=4)
    shared = SharedStepSpanProcessor([ov, budget])
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for i in range(3):
            feed(shared, train_step(i, step_ms=100, monitor_ms=50))
    msgs = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("otel-train: rank 0: monitoring CRITICAL") for m in msgs)
    assert any(m.startswith("otel-train: rank 0: monitoring operation 'inference'")
               for m in msgs)


def test_a_budget_crossed_by_faster_training_alone_warns_within_eight_steps(
        caplog: pytest.LogCaptureFixture) -> None:
    # val_loss costs 200 ms every 50 steps. Training at 100 ms per step: 4%, ok. Then steps
    # get faster (20 ms): the steady ratio climbs past 5% on steps with no monitoring at
    # all, long before the next eval would check it.
    shared, ov, budget = make(min_steps=1)
    crossed = warned = None
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for i in range(100):
            monitor_ms = 200 if i % 50 == 0 else 0
            feed(shared, train_step(i, step_ms=(20 if i > 50 else 100) + monitor_ms,
                                    monitor_ms=monitor_ms, monitor="val_loss"))
            if crossed is None and ov.steady_ratio(settled_only=True) > 0.05:
                crossed = i
            if warned is None and "monitoring WARNING" in caplog.text:
                warned = i
    assert crossed is not None and warned is not None
    assert 50 < crossed < 90  # between two evals, well before the next
    assert crossed <= warned <= crossed + 8


def test_light_monitoring_in_every_step_is_checked_every_few_steps_a_heavy_step_at_once(
        caplog: pytest.LogCaptureFixture) -> None:
    # 2 ms of val_loss in every 100 ms step (2%): each step moves the steady ratio a little,
    # so the status is read every eight steps, not on each. A step whose monitoring is half
    # the budget or more (here the seed's 20-minute eval freeze) is read at once.
    shared, ov, budget = make(min_steps=1)
    reads = []
    real = ov.steady_ratio
    ov.steady_ratio = lambda settled_only=False: reads.append(1) or real(settled_only)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for i in range(64):
            feed(shared, train_step(i, step_ms=100, monitor_ms=2, monitor="val_loss"))
        assert len(reads) == 8  # every eighth step
        assert budget.status() == "ok" and "monitoring" not in caplog.text
        reads.clear()
        for i in range(64, 66):  # the eval froze training: 20 minutes, twice
            feed(shared, train_step(i, step_ms=1_200_100, monitor_ms=1_200_000,
                                    monitor="val_loss"))
        assert len(reads) == 2  # each read at once
    msgs = [r.getMessage() for r in caplog.records if "monitoring CRITICAL" in r.getMessage()]
    assert len(msgs) == 1


# The field notes' run: 1000 steps x 3.5 s = 3500 s of training.
def _field_notes_overhead(after_loop: list[tuple[str, float]]) -> OverheadSpanProcessor:
    ov = OverheadSpanProcessor()
    for i in range(1000):
        feed(ov, train_step(i, step_ms=3500))
    for name, seconds in after_loop:  # run.monitor after the loop: after its last step
        ov.on_end(monitor_span(name, after_step=999, duration_ms=seconds * 1000))
    return ov


def test_an_operation_run_once_after_the_loop_is_told_as_one_off() -> None:
    (adv,) = advise(_field_notes_overhead([("final_eval", 14.0)]).snapshot(), 0.05)
    assert adv.advice == "final_eval: once, 14 s = 0.4% of training"  # 14 / 3500
    assert (adv.pattern, adv.calls, adv.interval_steps) == ("once", 1, None)
    assert adv.projected_share == pytest.approx(14 / 3500) and adv.within_budget


def test_a_one_off_operation_over_the_budget_says_so_without_an_interval() -> None:
    (adv,) = advise(_field_notes_overhead([("evolution_snapshot", 180.0 * 2)]).snapshot(),
                    0.05)
    assert adv.advice == ("evolution_snapshot: once, 360 s = 10.3% of training, over the 5% "
                          "budget on its own: make it cheaper (smaller sample) or run it "
                          "offline")
    assert not adv.within_budget and "every" not in adv.advice


def test_calls_all_after_the_loop_are_one_off_too() -> None:
    ov = _field_notes_overhead([("final_eval", 4.0), ("final_eval", 5.0), ("final_eval", 5.0)])
    (adv,) = advise(ov.snapshot(), 0.05)
    assert adv.advice == "final_eval: 3 calls at step 999, 14 s = 0.4% of training"
    assert adv.pattern == "once" and adv.interval_steps is None


def test_an_operation_before_any_training_has_nothing_to_compare_with() -> None:
    ov = OverheadSpanProcessor()
    ov.on_end(monitor_span("baseline_eval", after_step=-1, duration_ms=1200))
    (adv,) = advise(ov.snapshot(), 0.05)
    assert adv.advice == "baseline_eval: once, 1.2 s; no training time yet to compare it with"


def test_calls_at_irregular_steps_are_told_with_their_mean_interval() -> None:
    ov = OverheadSpanProcessor()
    for i in range(300):  # 3 s checkpoints at steps 0, 10 and 251 of 3.5 s steps
        ckpt = 3000 if i in (0, 10, 251) else 0
        feed(ov, train_step(i, step_ms=3500 + ckpt, monitor_ms=ckpt, monitor="checkpoint"))
    (adv,) = advise(ov.snapshot(), 0.05)
    assert adv.pattern == "irregular" and adv.interval_steps == 125.5
    assert adv.advice.startswith(
        "checkpoint: 3 s per call, 3 calls at irregular steps 0..251 (every 126 steps on "
        "average) -> 0.7% of training time")  # 3 / (125.5 x 3.5)


def test_two_calls_are_told_as_their_distance_apart() -> None:
    ov = OverheadSpanProcessor()
    for i in range(300):
        val = 3000 if i in (0, 150) else 0
        feed(ov, train_step(i, step_ms=3500 + val, monitor_ms=val, monitor="val_loss"))
    (adv,) = advise(ov.snapshot(), 0.05)
    assert adv.pattern == "periodic" and adv.interval_steps == 150
    assert "val_loss: 3 s per call, 2 calls 150 steps apart -> 0.6% of training time" in (
        adv.advice)


def test_a_first_call_over_a_few_fast_steps_is_not_enough_evidence_for_a_share() -> None:
    # The demo's start on a loaded machine: step 0 runs inference for the first time
    # (150 ms), then 12 ms steps. At step 10 its one call over ten steps reads as a share of
    # 104%; the verdict waits for its second call (step 50).
    shared, ov, budget = make()
    gaps, statuses, raw = {}, {}, {}
    for i in range(60):
        monitor_ms = 150.0 if i % 50 == 0 else 0.0
        feed(shared, train_step(i, step_ms=12 + monitor_ms, monitor_ms=monitor_ms))
        gaps[i], statuses[i], raw[i] = budget.evidence_gap(), budget.judging, ov.steady_ratio()
    assert raw[10] > 1.0  # the raw figure exists all along ...
    assert gaps[5] == "not enough steps yet (a verdict needs 10)"
    assert gaps[10] == ("not enough steps yet ('inference' ran once, at step 0: its steady "
                        "cost needs a second call)")
    assert not any(statuses[i] for i in range(50))  # ... and is said from step 50 on only
    assert gaps[50] is None and statuses[59]
    assert budget.verdict().steady == pytest.approx(150.0 / (50 * 12), rel=0.01)  # 25%


def test_no_verdict_before_a_tenth_of_a_second_of_training() -> None:
    # 100 steps of 0.5 ms with 0.1 ms of monitoring in each: 50 ms of training, a share made
    # of timer and scheduler noise; the verdict comes at 0.1 s of training (step 200).
    shared, ov, budget = make()
    judged_from = None
    for i in range(300):
        feed(shared, train_step(i, step_ms=0.6, monitor_ms=0.1))
        if judged_from is None and budget.judging:
            judged_from = i
    assert judged_from is not None and 195 <= judged_from <= 200
    assert budget.evidence_gap() is None


def test_the_status_holds_until_its_figure_is_clearly_back_under_the_threshold(
        caplog: pytest.LogCaptureFixture) -> None:
    # val_loss in every 100 ms step. 10.6 ms per call: CRITICAL. Then calls of 8.6 ms bring
    # the steady figure (the mean cost per call) to ~9.6%: noise around the 10% level, the
    # status holds; calls of 6 ms bring it under 9%: WARNING, said as one change.
    shared, ov, budget = make(min_steps=1)
    seen = []
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for i, cost in enumerate([10.6] * 30 + [8.6] * 30 + [6.0] * 60):
            feed(shared, train_step(i, step_ms=100 + cost, monitor_ms=cost,
                                    monitor="val_loss"))
            verdict = budget.verdict()
            seen.append((i, round(verdict.steady, 4), verdict.status))
    at = {i: (steady, status) for i, steady, status in seen}
    assert at[59][1] == "critical" and 0.09 < at[59][0] <= 0.10  # held: noise
    assert budget.verdict().status == "warning"
    changes = [seen[0][2]] + [b[2] for a, b in zip(seen, seen[1:]) if a[2] != b[2]]
    assert changes == ["critical", "warning"]  # no flapping back and forth
    first_warning = next(i for i, _, status in seen if status == "warning")
    assert seen[first_warning][1] <= 0.09
    held = BudgetVerdict(0.095, 0.095, 0.095, 0.05, 0.10, held="critical")
    assert held.describe() == ("CRITICAL: 9.5% steady state (held until under 9%); "
                               "recent 9.5%, total 9.5%")
    assert [r.getMessage()[:40] for r in caplog.records] == [
        "otel-train: monitoring CRITICAL: 10.6% o"]  # a better status is not a warning


def test_hysteresis_is_one_tenth_of_each_threshold() -> None:
    assert held_status(0.095, "critical", 0.05, 0.10) == "critical"
    assert held_status(0.085, "critical", 0.05, 0.10) == "warning"
    assert held_status(0.046, "critical", 0.05, 0.10) == "warning"
    assert held_status(0.044, "critical", 0.05, 0.10) == "ok"
    assert held_status(0.046, "warning", 0.05, 0.10) == "warning"
    assert held_status(0.051, "ok", 0.05, 0.10) == "warning"  # up at once
    assert held_status(0.2, None, 0.05, 0.10) == "critical"
    with pytest.raises(ValueError, match="hysteresis"):
        BudgetSpanProcessor(OverheadSpanProcessor(), hysteresis=1.0)


def test_two_validations_after_one_step_are_no_interval_yet() -> None:
    # The Lightning example: val_loss of loader 'clean' then of 'noisy' after step 9 (two
    # calls at one step), 10 ms steps: no verdict (it read 555%) until the next validation;
    # then two calls every 10 steps: 2 x 25 ms / (10 x 10 ms) = 50%.
    shared, ov, budget = make()
    for i in range(20):
        feed(shared, train_step(i, step_ms=10))
        if i in (9, 19):
            for _ in range(2):
                ov.on_end(monitor_span("val_loss", after_step=i, duration_ms=25))
        if i == 9:
            assert budget.evidence_gap() == (
                "not enough steps yet ('val_loss' ran 2 times, all at step 9: its interval "
                "needs a call at another step)")
    assert budget.evidence_gap() is None
    assert ov.steady_ratio() == pytest.approx(2 * 25 / (10 * 10))
    (adv,) = budget.advice()
    assert adv.interval_steps == 5 and adv.projected_share == pytest.approx(0.5)


def test_an_operation_seen_once_waits_only_in_a_young_run_and_never_once_it_is_over() -> None:
    shared, ov, budget = make()
    for i in range(40):  # a short run of 10 ms steps, a final evaluation after the loop
        feed(shared, train_step(i, step_ms=10))
    ov.on_end(monitor_span("final_eval", after_step=39, duration_ms=30))
    assert budget.evidence_gap() == ("not enough steps yet ('final_eval' ran once, at step "
                                     "39: its steady cost needs a second call)")
    assert budget.evidence_gap(run_over=True) is None  # the final costs: a one-off
    for i in range(40, 100):  # a run of 100 steps: a one-off's share is its true share
        feed(shared, train_step(i, step_ms=10))
    assert budget.evidence_gap() is None


def test_several_operations_waiting_for_their_second_call_are_named_together() -> None:
    # The demo's step 10: inference and val_loss both ran once, at step 0.
    shared, ov, budget = make()
    for i in range(20):
        monitor_ms = 15.0 if i == 0 else 0.0
        spans = train_step(i, step_ms=12 + 2 * monitor_ms, monitor_ms=monitor_ms)
        feed(shared, spans)
        if i == 0:
            ov.on_end(monitor_span("val_loss", after_step=0, duration_ms=15))
    assert budget.evidence_gap() == (
        "not enough steps yet ('inference' and 'val_loss' ran at one step each, the first at "
        "step 0: their steady cost needs a call at a second step)")


def _budget_views(first: int, count: int) -> list[Any]:
    """Steps of 10 ms with a 0.2 ms monitor each (not material), every 7th a 4 ms one
    (material), every 11th a 2.5 s step with a 40 ms monitor (slow, limit 0.03 s, not
    material), and steps the overhead cannot read (no duration), with a slow operation."""
    from otel_train.records.span_rows import view_from_record

    out = []
    for i in range(first, first + count):
        slow_op = i % 11 == 5 or i % 53 == 49
        step_ns = 2_500_000_000 if slow_op else 10_000_000
        mon_ns = 40_000_000 if slow_op else 4_000_000 if i % 7 == 0 else 200_000
        phases = [("forward", "train", None, step_ns // 2, 1, 0x70 + i, 0, 1, None, (), None,
                   None),
                  ("inference", "monitor", None, mon_ns, 2, 0x70 + i, 0, 1, None, (), None,
                   None)]
        view = view_from_record(("train.step", i, 0x70 + i, 1, i * 10**10,
                                 i * 10**10 + step_ns, {"train.step": i}, None, (), phases,
                                 None), 0)
        if i % 53 == 49:  # with a slow operation: warned of before the budget fails
            view.duration_ns = None  # type: ignore[assignment]
        out.append(view)
    return out


@pytest.mark.parametrize("take", [True, False])
def test_the_overhead_and_budget_in_one_loop_judge_as_view_by_view(take: bool,
                                                                     caplog: Any) -> None:
    """take_group (the overhead's loop, the budget read at its status checks and slow
    operations) against the two fed view by view: warm-up, operations between frames,
    material monitoring, slow operations, a view the overhead fails on. The same figures
    after every frame, the same warnings, the same failures counted."""
    from otel_train.records.span_rows import view_from_record

    def run(by_loop: bool) -> tuple[list[Any], list[str], int]:
        ov = OverheadSpanProcessor(recent_window_steps=20, warmup_steps=3)
        log = logging.getLogger(f"otel_train.test_budget_loop.{by_loop}")
        budget = BudgetSpanProcessor(ov, 0.05, 0.10, slow_operation_seconds=0.03, logger=log,
                                     min_training_seconds=0.0)
        shared = SharedStepSpanProcessor([ov, budget])
        figures: list[Any] = []
        caplog.clear()
        for k in range(12):
            views = _budget_views(k * 30, 30)
            if k % 4 == 2:  # an operation between steps: this frame is not steps alone
                views.insert(3, view_from_record(
                    ("eval", 99, 0x99, 1, 0, 50_000_000,
                     {"train.step": k, "train.phase": "eval", "train.phase.kind": "monitor"},
                     None, (), None, None), 0))
            if by_loop:
                shared.on_views(views)
            else:
                with shared.lock:
                    shared.feed_group([(p, p.on_step, p.on_operation) for p in (ov, budget)],
                                      views, False)
            figures.append((ov.export_state(), budget.export_state()))
        return figures, [r.getMessage() for r in caplog.records], shared.errors

    caplog.set_level(logging.INFO)
    fast, general = run(take), run(False)
    assert fast == general
    assert any("took" in m for m in fast[1]) and fast[2] >= 12
    assert fast[0][-1][1]["slow_operations"]
