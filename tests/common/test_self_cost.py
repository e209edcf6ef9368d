"""otel-train's own cost: what the training loop loses per step, its share of the loop's time,
the CPU beside it, start-up apart, and a plain answer where schedstat is missing."""

from __future__ import annotations

import pytest

from otel_train.common.self_cost import (
    SHARED_INTERPRETER_FACTOR,
    SelfCostMeter,
    TrainingThreadSchedstat,
)

MS = 1_000_000


class ScriptedSchedstat:
    """The training thread's (on-CPU, run-queue) ns, as a test scripts them."""

    unavailable = None

    def __init__(self) -> None:
        self.now = (0, 0)

    def read(self) -> tuple[int, int]:
        return self.now


def _meter_with_steps(steps: int = 100, step_ms: int = 10, spans_per_step: int = 5,
                      ns_per_span: float = 2_000.0) -> SelfCostMeter:
    meter = SelfCostMeter(ns_per_span, started_ns=0, window_steps=50)
    meter.add_hot_path_spans(steps * spans_per_step)
    meter.note_steps(steps, 1_000 * MS, 1_000 * MS + steps * step_ms * MS)
    return meter


def test_the_hot_path_per_step_and_its_share_of_the_loops_time() -> None:
    meter = _meter_with_steps()  # 5 spans x 2 us per 10 ms step
    fig = meter.figures()
    assert fig["steps"] == 100
    assert fig["hot_path_us_per_step"] == pytest.approx(10.0)
    assert fig["step_wall_us"] == pytest.approx(10_000.0)
    assert fig["share_of_step_time"] == pytest.approx(0.001)
    assert fig["lost_us_per_step"] == pytest.approx(10.0)


def test_cold_spans_are_charged_at_the_cold_cost_and_both_costs_are_reported() -> None:
    meter = SelfCostMeter(1_000.0, started_ns=0, cold_ns_per_span=4_000.0)
    meter.add_hot_path_spans(10, cold_spans=20)  # 10 warm spans, 20 cold
    meter.note_steps(6, 0, 6 * 10 * MS)
    fig = meter.figures()
    assert fig["hot_path_us_per_step"] == pytest.approx((10 * 1.0 + 20 * 4.0) / 6, abs=1e-3)
    assert fig["hot_path_ns_per_span"] == {"warm": 1_000.0, "cold": 4_000.0}
    # A cold figure under the warm one (a disturbed calibration) is never charged below it.
    assert SelfCostMeter(2_000.0, cold_ns_per_span=500.0).cold_ns_per_span == 2_000.0


def test_background_cpu_is_reported_beside_the_loss_not_in_it() -> None:
    meter = _meter_with_steps()
    meter.add_background_ns(100 * 40_000)  # 40 us per step on another core
    fig = meter.figures(exporter_cpu_seconds=0.5 + 100 * 120e-6,
                        exporter_startup_cpu_seconds=0.5)
    assert fig["background_cpu_us_per_step"] == pytest.approx(40.0)
    assert fig["exporter_process_cpu_us_per_step"] == pytest.approx(120.0)
    assert fig["share_of_step_time"] == pytest.approx(0.001)  # the hot path only


def test_empty_steps_read_at_most_the_whole_loop_not_thousands_of_percent() -> None:
    # 2 us of hot path per 1 us step: the loop is all otel-train, not 28395% of it.
    meter = SelfCostMeter(2_000.0, started_ns=0)
    meter.add_hot_path_spans(1000)
    meter.note_steps(1000, 1_000 * MS, 1_000 * MS + 1000 * 1_000)
    assert meter.figures()["share_of_step_time"] == 1.0
    assert meter.recent_share() == 1.0


def test_start_up_is_reported_apart_and_not_averaged_into_the_steps() -> None:
    meter = SelfCostMeter(2_000.0, started_ns=0)
    meter.ready_ns = 300 * MS  # start_run took 0.3 s
    meter.add_hot_path_spans(500)
    meter.note_steps(100, 1_000 * MS, 2_000 * MS)  # the first step 1 s after start_run
    fig = meter.figures(exporter_cpu_seconds=0.8, exporter_startup_cpu_seconds=0.6)
    assert fig["startup"] == {"start_run_seconds": 0.3, "until_first_step_seconds": 1.0,
                              "exporter_process_cpu_seconds": 0.6}
    assert fig["lost_us_per_step"] == pytest.approx(10.0)  # 0.3 s of start-up not in it
    assert fig["exporter_process_cpu_us_per_step"] == pytest.approx(2_000.0)  # 0.2 s / 100


def test_the_training_threads_wait_is_attributed_only_up_to_the_background_cpu() -> None:
    meter = _meter_with_steps()
    clock = meter.schedstat = ScriptedSchedstat()
    meter.sample(0, 0, True)  # the first sample only sets the marks
    # 50 ms: 30 ms on a CPU, 5 ms runnable, 15 ms blocked (the GIL) while the worker ran 8 ms
    # and the exporter process 3 ms: 8 ms of GIL wait, 5 ms of run-queue wait.
    clock.now = (30 * MS, 5 * MS)
    meter._prev = (meter._prev[0] - 50 * MS, (0, 0), 0, None)
    meter.sample(8 * MS, 3 * MS, True)
    fig = meter.figures()
    assert fig["wait_gil_us_per_step"] == pytest.approx(80.0)  # 8 ms / 100 steps
    # run queue: min(5 ms, exporter 3 ms + the worker's CPU beyond the GIL wait 0) = 3 ms
    assert fig["wait_run_queue_us_per_step"] == pytest.approx(30.0)
    assert fig["wait_us_per_step"] == pytest.approx(110.0)
    # the worker's 8 ms beside training, at SHARED_INTERPRETER_FACTOR (1.0): 80 us a step
    assert fig["shared_interpreter_us_per_step"] == pytest.approx(80.0)
    assert fig["lost_us_per_step"] == pytest.approx(200.0)  # + the hot path's 10 us


def test_an_interval_without_training_charges_no_wait() -> None:
    meter = _meter_with_steps()
    clock = meter.schedstat = ScriptedSchedstat()
    meter.sample(0, 0, False)
    clock.now = (0, 5 * MS)
    meter._prev = (meter._prev[0] - 50 * MS, (0, 0), 0, None)
    meter.sample(20 * MS, 10 * MS, False)  # the training thread slept: nothing lost
    fig = meter.figures()
    assert fig["wait_us_per_step"] == 0.0
    assert fig["shared_interpreter_us_per_step"] == 0.0
    assert fig["background_cpu_us_per_step"] == pytest.approx(200.0)


def test_without_schedstat_the_wait_says_why_and_nothing_breaks() -> None:
    meter = _meter_with_steps()
    meter.schedstat = TrainingThreadSchedstat(2**31 - 1)  # no such thread
    meter.sample(MS, MS, True)
    meter.sample(MS, MS, True)
    fig = meter.figures()
    assert fig["wait_us_per_step"] is None and fig["wait_gil_us_per_step"] is None
    assert "missing" in fig["wait_unavailable"] or "schedstat" in fig["wait_unavailable"]
    assert fig["share_of_step_time"] == pytest.approx(0.001)  # the hot path still counts


def test_the_recent_share_covers_the_last_window_of_steps() -> None:
    meter = SelfCostMeter(1_000.0, started_ns=0, window_steps=100)
    meter.add_hot_path_spans(100)  # 1 us per step over the first 100 steps of 1 ms
    meter.note_steps(100, 0, 100 * MS)
    meter.add_hot_path_spans(100 * 50)  # then 50 us per step
    meter.note_steps(100, None, 200 * MS)
    assert meter.recent_share() == pytest.approx(0.05)
    assert meter.figures()["share_of_step_time"] == pytest.approx(0.0255)


def test_nothing_drained_yet_reads_none() -> None:
    fig = SelfCostMeter(1_000.0).figures()
    assert fig["share_of_step_time"] is None and fig["lost_us_per_step"] is None
    assert SelfCostMeter().recent_share() is None


def _alternating_busy(by_worker: bool) -> tuple[SelfCostMeter, int]:
    """200 intervals of 50 ms, 90 steps each; the training thread computes 500 us per step
    alone and 40% more while otel-train's background is busy (its share alternating 0 /
    0.5), the busy CPU the span worker's (``by_worker``) or the exporter process's; returns
    the meter and that busy CPU in ns."""
    meter = _meter_with_steps(steps=18_000, step_ms=1, spans_per_step=0)
    clock = meter.schedstat = ScriptedSchedstat()
    meter.sample(0, 0, True, 0)
    on_cpu = busy_cpu = begun = 0
    for i in range(200):
        busy = 0.5 if i % 2 else 0.0
        on_cpu += int(90 * 500_000 * (1 + 0.4 * busy))
        begun += 90
        clock.now = (on_cpu, 0)
        meter._prev = (meter._prev[0] - 50 * MS,) + meter._prev[1:]
        busy_cpu += int(busy * 50 * MS)
        if by_worker:
            meter.sample(int(busy * 50 * MS), 0, True, begun)
        else:  # the exporter process's CPU so far
            meter.sample(0, busy_cpu, True, begun)
    return meter, busy_cpu


def test_training_cpu_that_rises_with_the_exporters_work_is_charged_as_interference() -> None:
    fig = _alternating_busy(by_worker=False)[0].figures()
    # slope: 200 us of extra training CPU per step at full exporter activity
    assert fig["cpu_interference_us_per_busy_step"] == pytest.approx(200.0, rel=0.02)
    # charged: 200 us x 0.5 busy on half the 18,000 steps = 50 us per step
    assert fig["cpu_interference_us_per_step"] == pytest.approx(50.0, rel=0.02)
    assert fig["lost_us_per_step"] == pytest.approx(50.0, rel=0.02)


def test_the_span_workers_cpu_is_charged_beside_training_and_not_on_the_line() -> None:
    # The same training CPU, the worker busy instead: its loss to the shared interpreter is
    # the worker's CPU x the factor, never a second time through the line.
    meter, worker = _alternating_busy(by_worker=True)
    fig = meter.figures()
    assert fig["cpu_interference_us_per_step"] == 0.0  # the exporter never varied
    assert fig["shared_interpreter_us_per_step"] == pytest.approx(
        SHARED_INTERPRETER_FACTOR * worker / 18_000 / 1e3)


def test_an_index_jump_is_not_taken_for_steps_run() -> None:
    meter = _meter_with_steps()
    clock = meter.schedstat = ScriptedSchedstat()
    meter.sample(0, 0, True, 0)
    clock.now = (40 * MS, 0)
    meter._prev = (meter._prev[0] - 50 * MS,) + meter._prev[1:]
    meter.sample(0, 0, True, 50_000)  # a resumed run's first index, not 50,000 steps in 50 ms
    assert meter.interference.points == 0


def _intervals(meter: SelfCostMeter, steps_and_extra_ms: list[tuple[int, int]],
               state: list[int] | None = None) -> list[int]:
    """Feed 50 ms intervals of ``steps`` 0.5 ms steps plus ``extra`` ms of the training
    thread's CPU each, the exporter process busy half of each; returns (on-CPU ns, steps
    begun, the exporter's CPU ns) to go on from."""
    clock = meter.schedstat
    on_cpu, begun, exporter = state or [0, 0, 0]
    for steps, extra_ms in steps_and_extra_ms:
        on_cpu += steps * 500_000 + extra_ms * MS
        begun += steps
        exporter += 25 * MS
        clock.now = (on_cpu, 0)
        meter._prev = (meter._prev[0] - 50 * MS,) + meter._prev[1:]
        meter.sample(0, exporter, True, begun)
    return [on_cpu, begun, exporter]


def _sampled_meter() -> SelfCostMeter:
    meter = _meter_with_steps()
    meter.schedstat = ScriptedSchedstat()
    meter.sample(0, 0, True, 0)
    return meter


def test_an_interval_at_a_fraction_of_the_usual_pace_is_charged_but_not_fitted() -> None:
    meter = _sampled_meter()
    # 8 intervals set the usual pace (not fitted: it is not known before them), 3 at that
    # pace, then one where an evaluation ran on the training thread
    _intervals(meter, [(90, 0)] * 11 + [(10, 30)])
    assert meter.interference.points == 3
    assert meter.interference.busy_steps == pytest.approx(0.5 * (11 * 90 + 10), rel=0.01)


def test_a_slow_warm_up_does_not_become_the_usual_pace() -> None:
    meter = _sampled_meter()
    # the run's first three intervals warm up at a tenth of the pace: a pace set by them
    # would fit them, and every slow interval after them
    _intervals(meter, [(9, 40)] * 3 + [(90, 0)] * 20 + [(9, 40)] * 2)
    assert meter.interference.points == 15  # the 9th to the 23rd interval


def test_intervals_of_a_few_steps_or_with_a_drain_on_the_training_thread_are_not_fitted() -> None:
    meter = _sampled_meter()
    state = _intervals(meter, [(90, 0)] * 10)
    assert meter.interference.points == 2
    _intervals(meter, [(3, 0)], state)  # a drain's interval: three steps are no figure
    assert meter.interference.points == 2
    meter.add_training_thread_ns(5 * MS)  # run.costs() drained on the training thread
    state = _intervals(meter, [(90, 5)], [state[0] + 3 * 500_000, state[1] + 3, state[2]])
    assert meter.interference.points == 2
    _intervals(meter, [(90, 0)], state)
    assert meter.interference.points == 3


def test_the_batch_counters_timed_work_is_charged_in_the_loss_and_the_overhead_total() -> None:
    class Counter:
        spent_ns = 0

    counter = Counter()
    meter = SelfCostMeter(2_000.0, started_ns=0, window_steps=50, batch_counter=counter)
    meter.add_hot_path_spans(100 * 5)
    meter.note_steps(100, 1_000 * MS, 1_000 * MS + 100 * 10 * MS)
    before = meter.figures()
    counter.spent_ns = 100 * 3_000  # 3 us a step
    fig = meter.figures()
    assert before["batch_counting_us_per_step"] == 0.0 and fig["batch_counting_us_per_step"] == 3.0
    assert fig["lost_us_per_step"] == pytest.approx(before["lost_us_per_step"] + 3.0)
    assert meter.total_ns == 100 * 5 * 2_000 + 100 * 3_000
    assert _meter_with_steps().figures()["batch_counting_us_per_step"] is None
