"""step.due: a plain every-N schedule, forced calls, bad input at the call, governed plans
put in force at plan steps, the same on two ranks sharing a store, and the fall-back."""

from __future__ import annotations

import json
import logging
from datetime import timedelta

import pytest
import torch.distributed as dist

import otel_train
from otel_train.recording.plan_store import ProcessGroupPlanStore, resolve_plan_store
from otel_train.recording.schedule import INTERVAL_EVENT, PLAN_EVERY_STEPS, DueSchedule

pytestmark = pytest.mark.timeout(60)


class _Step:
    def __init__(self, index: int) -> None:
        self.index = index


def _due_steps(schedule: DueSchedule, steps: range, name: str = "val_loss", every: int = 50,
               **kw: object) -> list[int]:
    return [i for i in steps if schedule.due(_Step(i), name, every, **kw)]  # type: ignore[arg-type]


def test_without_governing_due_is_exactly_index_modulo_every_step_zero_included() -> None:
    schedule = DueSchedule()
    for every in (1, 7, 50):
        assert _due_steps(schedule, range(300), f"op{every}", every) == [
            i for i in range(300) if i % every == 0]


def test_a_plain_schedule_is_the_same_in_a_real_run_loop_and_with_run_step() -> None:
    with otel_train.start_run(console=False, prometheus_port=None, exporter="none",
                              report=False) as run:
        seen = [step.index for step in run.steps(range(120)) if step.due("val_loss", every=40)]
        with run.step() as step:  # index 120
            assert run.due("val_loss") is True  # the registered every=40
    assert seen == [0, 40, 80]


def test_a_forced_call_runs_and_leaves_the_schedule_as_it_was() -> None:
    schedule = DueSchedule()
    due = [i for i in range(0, 120) if schedule.due(_Step(i), "val_loss", 50, force=i == 77)]
    assert due == [0, 50, 77, 100]
    governed = DueSchedule(governed=True)
    due = [i for i in range(0, 120) if governed.due(_Step(i), "val_loss", 50, force=i == 77)]
    assert due == [0, 50, 77, 100]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"every": 0}, r"every=0 must be a positive integer"),
    ({"every": -5}, r"every=-5 must be a positive integer"),
    ({"every": 2.5}, r"every=2.5 must be a positive integer"),
    ({"every": True}, r"every=True must be a positive integer"),
    ({"every": 50, "max_every": 0}, r"max_every=0 must be a positive integer"),
    ({"every": 50, "min_every": 80, "max_every": 60}, r"min_every=80 is above max_every=60"),
    ({"every": 50, "max_every": 40}, r"every=50 is above max_every=40"),
    ({"every": 50, "min_every": 60}, r"every=50 is below min_every=60"),
    ({"force": True}, r"forcing an unknown operation: give every=N on its first call"),
    ({}, r"an unknown operation: give every=N"),
])
def test_bad_input_raises_at_the_call_naming_the_argument(kwargs: dict, message: str) -> None:
    with otel_train.start_run(console=False, prometheus_port=None, exporter="none",
                              report=False) as run:
        with run.step() as step:
            with pytest.raises(ValueError, match=r"due\('val_loss'\): " + message):
                step.due("val_loss", **kwargs)


def test_due_outside_a_step_says_where_to_call_it() -> None:
    with otel_train.start_run(console=False, prometheus_port=None, exporter="none",
                              report=False) as run:
        with pytest.raises(RuntimeError, match=r"run.due\('val_loss'\) called outside a step"):
            run.due("val_loss", every=10)


def test_a_proposal_takes_effect_two_plan_steps_later_and_puts_an_event_on_that_step() -> None:
    schedule = DueSchedule(governed=True)
    steps = [_Step(i) for i in range(400)]
    ran = []
    for step in steps:
        if step.index == 10:
            schedule.proposed = {"val_loss": (120, 0.15)}
        if schedule.due(step, "val_loss", 50):
            ran.append(step.index)
    # Published at plan step 25, in force at plan step 50: 0 ran, then 0 + 120, +120...
    assert ran == [0, 120, 240, 360]
    events = steps[2 * PLAN_EVERY_STEPS].governing_events  # type: ignore[attr-defined]
    (name, _, attrs), = events
    assert name == INTERVAL_EVENT
    assert attrs["train.monitoring.interval_steps"] == 120
    assert attrs["train.monitoring.previous_interval_steps"] == 50
    assert attrs["train.monitoring.share_at_previous_interval"] == 0.15
    assert list(schedule.changes) == [(50, "val_loss", 50, 120, 0.15)]


def test_governed_intervals_stay_within_min_and_max_whatever_is_proposed() -> None:
    schedule = DueSchedule(governed=True)
    for i in range(200):
        schedule.proposed = {"a": (10_000, 0.5), "b": (1, 0.0)}
        schedule.due(_Step(i), "a", 50, max_every=300)
        schedule.due(_Step(i), "b", 50, min_every=25)
    assert schedule.intervals() == {"a": 300, "b": 25}


def test_two_ranks_sharing_a_store_switch_at_the_same_step() -> None:
    store = dist.HashStore()
    rank0 = DueSchedule(governed=True, rank=0, world_size=2, run_id="r",
                        store=ProcessGroupPlanStore(store))
    rank1 = DueSchedule(governed=True, rank=1, world_size=2, run_id="r",
                        store=ProcessGroupPlanStore(store))
    ran: dict[int, list[int]] = {0: [], 1: []}
    for i in range(600):
        if i == 30:
            rank0.proposed = {"val_loss": (170, 0.15)}
        if i == 300:  # only rank 0's governor decides; rank 1's proposal is never read
            rank1.proposed = {"val_loss": (60, 0.0)}
        for rank, sched in ((0, rank0), (1, rank1)):
            if sched.due(_Step(i), "val_loss", 50):
                ran[rank].append(i)
    assert ran[0] == ran[1] == [0, 50, 220, 390, 560]
    assert rank1.plans_read == 600 // PLAN_EVERY_STEPS - 1


def test_without_a_store_a_multi_rank_run_falls_back_to_the_asked_interval_with_one_line(
        caplog: pytest.LogCaptureFixture) -> None:
    assert not dist.is_initialized()
    store, reason = resolve_plan_store(2)
    assert store is None and "torch.distributed is not initialized" in reason
    schedule = DueSchedule(governed=True, rank=1, world_size=2)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        ran = [i for i in range(300) if (setattr(schedule, "proposed", {"v": (90, 0.2)})
                                          or schedule.due(_Step(i), "v", 50))]
    assert ran == [0, 50, 100, 150, 200, 250]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "every operation runs at its asked interval" in lines[0]
    assert schedule.describe()["fallback"] == reason


def test_a_plan_that_never_comes_falls_back_after_the_bounded_wait(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("otel_train.recording.schedule.PLAN_WAIT_SECONDS", 0.2)
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=0.2))
    rank1 = DueSchedule(governed=True, rank=1, world_size=2, store=ProcessGroupPlanStore(store))
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        ran = _due_steps(rank1, range(120), "v", 20)
    assert ran == [0, 20, 40, 60, 80, 100]  # the asked interval; no hang
    assert "could not be read" in caplog.text


def test_the_costs_block_lists_each_operation_and_the_changes() -> None:
    schedule = DueSchedule(governed=True)
    schedule.proposed = {"val_loss": (120, 0.15)}  # published at plan step 0, for step 25
    _due_steps(schedule, range(100))
    block = schedule.describe()
    assert block["operations"]["val_loss"] == {"asked_every": 50, "min_every": 50,
                                               "max_every": 1000, "interval_steps": 120,
                                               "changes": 1}
    assert block["changes"] == [{"step": 25, "operation": "val_loss", "from": 50, "to": 120,
                                 "share_at_previous_interval": 0.15}]
    json.dumps(block)


class _FailingSets:
    """A store whose writes fail from one point on (reads are the other ranks')."""

    def __init__(self, inner: ProcessGroupPlanStore, fail_after: int) -> None:
        self.inner, self.sets, self.fail_after = inner, 0, fail_after

    def set(self, key: str, plan: dict) -> None:
        self.sets += 1
        if self.sets > self.fail_after:
            raise RuntimeError("store gone")
        self.inner.set(key, plan)

    def get_plan(self, key: str, timeout_seconds: float) -> object:
        return self.inner.get_plan(key, timeout_seconds)


def test_a_plan_rank_zero_cannot_publish_makes_every_rank_fall_back_at_the_same_step(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("otel_train.recording.schedule.PLAN_WAIT_SECONDS", 0.2)
    shared = ProcessGroupPlanStore(dist.HashStore())
    rank0 = DueSchedule(governed=True, rank=0, world_size=2, store=_FailingSets(shared, 3))
    rank1 = DueSchedule(governed=True, rank=1, world_size=2, store=shared)
    rank0.proposed = {"v": (40, 0.2)}
    ran: dict[int, list[int]] = {0: [], 1: []}
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for i in range(200):
            for rank, sched in ((0, rank0), (1, rank1)):
                if sched.due(_Step(i), "v", 20):
                    ran[rank].append(i)
    # 40 in force from step 25; the plan for step 100 (the 4th write) fails: both ranks run
    # the asked 20 again from step 100, rank 1 after its bounded wait for that plan.
    assert ran[0] == ran[1] == [0, 20, 60, 100, 120, 140, 160, 180]
    assert rank0.fallback_reason and rank1.fallback_reason
