"""The governor on simulated time (benchmarks/governing_replay.py drives the library's own
schedule, governor and overhead figures with no clock): convergence into the budget, the way
back when an operation is cheap again, bounds, sharing, no oscillation; its lines."""

from __future__ import annotations

import logging
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from governing_replay import SimOperation, simulate  # noqa: E402

from otel_train.derived.governor import (  # noqa: E402
    Governor,
    GovernorThread,
    change_line,
    fair_intervals,
    governing_lines,
)
from otel_train.recording.schedule import DueSchedule  # noqa: E402

pytestmark = pytest.mark.timeout(120)

STEP_SECONDS = 0.01
# val_loss at every=50 costs 15% of training time: 0.15 x 50 steps of training a call.
EXPENSIVE = 0.15 * 50 * STEP_SECONDS
CHEAP = 0.01 * 50 * STEP_SECONDS


def _converged_at(intervals: list[int]) -> int:
    """The first step from which the interval never changes again."""
    last = intervals[-1]
    at = len(intervals)
    while at > 0 and intervals[at - 1] == last:
        at -= 1
    return at


def test_an_evaluation_at_15_percent_converges_into_the_budget_then_returns_when_cheap() -> None:
    op = SimOperation("val_loss", 50, lambda i: EXPENSIVE if i < 6000 else CHEAP)
    r = simulate(10_000, STEP_SECONDS, [op], budget=0.05, decide_every_steps=10)
    ivals = r.intervals["val_loss"]
    # Converged within 100 steps: one decision after its first call, two plan steps later.
    assert _converged_at(ivals[:6000]) <= 100
    k = ivals[5999]
    assert k == 167  # ceil(0.15 x 50 / 0.045): 90% of the budget
    before = [c for c in r.calls["val_loss"] if c < 6000]
    steady = r.share_between(before[1], before[-1], STEP_SECONDS, [op])  # whole intervals
    assert 0.04 <= steady <= 0.05
    assert 0.04 <= EXPENSIVE / (k * STEP_SECONDS) <= 0.05
    # Cheap again from step 6000: back to every=50, in steps of at most a third, within
    # 500 steps, and never below the asked interval.
    assert ivals[-1] == 50 and min(ivals) == 50
    back = _converged_at(ivals)
    assert 6000 < back <= 6500
    shrinks = [(a, b) for _, _, a, b, _ in r.changes if b < a]
    assert len(shrinks) >= 2 and all(b >= a * 2 / 3 - 1 for a, b in shrinks)


@pytest.mark.parametrize("seed", range(4))
def test_noisy_costs_do_not_make_the_interval_oscillate(seed: int) -> None:
    # Each call +-10%, each step +-5%: the interval settles and stays (a second stretch may
    # correct a first one decided on a single call), never going back and forth.
    rng = random.Random(seed)
    op = SimOperation("val_loss", 50, lambda i: EXPENSIVE * rng.uniform(0.9, 1.1))
    r = simulate(20_000, lambda i: STEP_SECONDS * rng.uniform(0.95, 1.05), [op],
                 decide_every_steps=10)
    assert 1 <= len(r.changes) <= 2
    assert all(new > old for _, _, old, new, _ in r.changes)
    assert 0.04 <= r.share_between(2000, 20_000, STEP_SECONDS, [op]) <= 0.05


def test_max_every_is_never_exceeded_and_min_every_never_undercut() -> None:
    hog = SimOperation("val_loss", 50, 0.5 * 50 * STEP_SECONDS, max_every=200)  # 50%
    r = simulate(3000, STEP_SECONDS, [hog])
    assert max(r.intervals["val_loss"]) == 200  # pinned: never starved further
    calls = r.calls["val_loss"]
    assert {b - a for a, b in zip(calls[1:], calls[2:])} == {200}
    cheap = SimOperation("probe", 100, 0.001 * 100 * STEP_SECONDS, min_every=40)
    r = simulate(3000, STEP_SECONDS, [cheap])
    assert min(r.intervals["probe"]) == 40  # may run more often when cheap, not below min


def test_the_budget_is_shared_max_min_fairly_a_cheap_collector_keeps_its_interval() -> None:
    snapshot = SimOperation("evolution_snapshot", 500, 180.0)
    collector = SimOperation("detail_collector", 50, 0.3)
    r = simulate(5000, 3.5, [snapshot, collector], decide_every_steps=1)
    assert r.intervals["detail_collector"][-1] == 50  # 0.17%: under the common cap
    k = r.intervals["evolution_snapshot"][-1]
    assert 0.04 <= 180 / (k * 3.5) + 0.3 / (50 * 3.5) <= 0.045
    # Two equally expensive operations: the same cap, so the same share each.
    wanted = fair_intervals({"a": (10.0, 50, 1000), "b": (10.0, 100, 2000)}, 0.045)
    assert wanted == {"a": 445, "b": 445}
    # One pinned at its max takes what it takes there; the other gets the rest.
    wanted = fair_intervals({"a": (10.0, 50, 100), "b": (10.0, 50, 5000)}, 0.2)
    assert wanted == {"a": 100, "b": 100}
    wanted = fair_intervals({"a": (30.0, 50, 200), "b": (10.0, 50, 5000)}, 0.2)
    assert wanted["a"] == 200 and 10 / wanted["b"] <= 0.2 - 30 / 200


def test_monitoring_not_scheduled_with_due_is_counted_and_left_alone() -> None:
    sim = SimOperation("val_loss", 50, EXPENSIVE)
    assert simulate(2000, STEP_SECONDS, [sim]).intervals["val_loss"][-1] == 167
    # Beside a hand-scheduled collector taking 2%: val_loss gets 4.5% - 2% = 2.5%.
    hand = SimOperation("hand", 10, 0.02 * 10 * STEP_SECONDS, scheduled=False)
    r = simulate(2000, STEP_SECONDS, [sim, hand])
    assert r.intervals["val_loss"][-1] == 300
    assert r.calls["hand"] == list(range(0, 2000, 10))


def test_an_operation_never_called_yet_keeps_its_interval() -> None:
    gov = Governor(0.05)
    r = simulate(30, STEP_SECONDS, [])
    assert r.changes == []
    from governing_replay import _View  # noqa: PLC0415

    from otel_train.derived.overhead import OverheadSpanProcessor
    ov = OverheadSpanProcessor()
    ov.on_step(_View(0, 10_000_000, []))  # type: ignore[arg-type]
    assert gov.decide(ov.snapshot(), [("val_loss", 50, 50, 1000, 50, 0)]) == {
        "val_loss": (50, 0.0)}


def test_each_change_is_one_line_said_by_rank_zero(caplog: pytest.LogCaptureFixture) -> None:
    assert change_line("val_loss", 200, 450, 0.112, 0.05) == (
        "otel-train: val_loss every 200 -> 450 steps: it costs 11.2% of training time, "
        "budget 5%")
    for rank, said in ((0, 1), (1, 0)):
        schedule = DueSchedule(governed=True, rank=rank)
        schedule.changes.append((450, "val_loss", 200, 450, 0.112))
        thread = GovernorThread(Governor(0.05), schedule, lambda: None)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="otel_train"):
            thread.say_changes()
        assert thread.lines_said == said
        assert caplog.text.count("val_loss every 200 -> 450 steps") == said


def test_a_failed_decision_is_logged_and_keeps_the_intervals(
        caplog: pytest.LogCaptureFixture) -> None:
    schedule = DueSchedule(governed=True)
    thread = GovernorThread(Governor(0.05), schedule, lambda: 1 / 0)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        thread.tick()
    assert "governing skipped a decision" in caplog.text and schedule.proposed == {}


def test_the_costs_table_says_the_intervals_in_force() -> None:
    block = {"governing": True, "operations": {"val_loss": {
        "asked_every": 50, "min_every": 50, "max_every": 1000, "interval_steps": 167,
        "changes": 1}}}
    assert governing_lines(block) == [
        "", "governing (budget_action=govern): intervals in force:",
        "  val_loss: every 167 steps (asked 50, bounds 50..1000, 1 change(s))"]
    assert governing_lines({"operations": {}}) == []


def test_only_rank_zero_decides_the_others_read_its_plans() -> None:
    for rank, decided in ((0, True), (1, False)):
        asked: list[int] = []
        schedule = DueSchedule(governed=True, rank=rank)
        thread = GovernorThread(Governor(0.05), schedule, lambda: asked.append(1) or 1 / 0)
        thread.tick()
        assert bool(asked) is decided


def test_a_slow_first_call_is_left_out_once_a_second_call_is_measured() -> None:
    # 11.25 ms of training a step; val_loss every 10 steps: 96 ms on its first call
    # (warm-up), 3.6 ms afterwards: 3.2% in steady state, inside the budget.
    op = SimOperation("val_loss", 10, lambda i: 0.096 if i == 0 else 0.0036)
    r = simulate(3000, 0.01125, [op], decide_every_steps=5)
    ivals = r.intervals["val_loss"]
    assert max(ivals) > 10  # judged on its one call first: stretched
    assert ivals[-1] == 10  # back to the asked interval once the steady calls are known
    assert _converged_at(ivals) < 1000
    assert r.status == "ok"
