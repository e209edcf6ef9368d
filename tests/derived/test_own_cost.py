"""otel-train's own cost, end to end: ``run.costs()``, the costs file and the summary line
report the training loop's loss per step and its share, start-up apart; a busy background
thread shows as the training thread's wait."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from train_helpers import clean_env, start_test_run  # noqa: F401  (clean_env: autouse)

from otel_train.common.drop_counter import DropCounter
from otel_train.common.identity import RunIdentity
from otel_train.common.self_cost import SelfCostMeter
from otel_train.derived.costs import format_costs_table
from otel_train.pipeline.record_sinks import SinkExport
from otel_train.pipeline.span_worker import RowRoute, SpanBuildWorker
from otel_train.recording.recorder import Recorder
from otel_train.records.step_records import StepRecordBuilder, epoch_offset_ns

pytestmark = pytest.mark.timeout(60)


def test_empty_steps_report_a_share_of_the_loop_not_thousands_of_percent(tmp_path: Path) -> None:
    run = start_test_run(tmp_path, exporter="none", prometheus_port=None, console=False)
    for step in run.steps(range(3000)):
        with step.phase("forward"):
            pass
    costs = run.costs()
    run.shutdown()
    own = costs["own_cost"]
    assert own["steps"] == 3000
    assert 0.0 < own["share_of_step_time"] <= 1.0
    assert costs["instrumentation_overhead_ratio"] == own["share_of_step_time"]
    assert own["hot_path_us_per_step"] > 0 and own["step_wall_us"] > 0
    line = format_costs_table(costs).splitlines()[-1]
    assert line.startswith("otel-train's own cost: ") and "of the training loop's time" in line
    if own["wait_unavailable"] is None:  # the span worker's share of the interpreter, named
        assert "computing slower beside them" in line
        assert own["shared_interpreter_us_per_step"] is not None
    assert "wall time" not in line
    written = json.loads(next(tmp_path.rglob("monitoring_costs.json")).read_text())
    assert 0.0 < written["own_cost"]["share_of_step_time"] <= 1.0


def test_start_up_and_the_wait_before_the_first_step_are_apart_from_the_steps(
        tmp_path: Path) -> None:
    run = start_test_run(tmp_path, exporter="none", prometheus_port=None, console=False)
    time.sleep(0.3)  # the user's own set-up after start_run: not a step's cost
    for step in run.steps(range(200)):
        with step.phase("forward"):
            sum(range(2000))
    own = run.costs()["own_cost"]
    run.shutdown()
    start = own["startup"]
    assert start["start_run_seconds"] > 0
    assert start["until_first_step_seconds"] >= 0.3 + start["start_run_seconds"] - 0.01
    # 0.3 s over 200 steps would be 1500 us per step: none of it is in the loss.
    assert own["lost_us_per_step"] < 1500
    assert own["step_wall_us"] < 0.3e6 / 200


class BusySink:
    """An export sink that takes ``busy_seconds`` per drain: holding the GIL (pure Python
    spinning) or, with ``hold_gil=False``, asleep (the GIL released), so both drain at the
    same pace and only the GIL differs."""

    def __init__(self, busy_seconds: float, hold_gil: bool = True) -> None:
        self.busy_seconds = busy_seconds
        self.hold_gil = hold_gil

    def on_records(self, records, rows=()) -> None:
        if not self.hold_gil:
            time.sleep(self.busy_seconds)
            return
        end = time.perf_counter() + self.busy_seconds
        while time.perf_counter() < end:
            pass

    def close(self) -> None:
        pass


def _worker_run(busy_seconds: float, hold_gil: bool = True, train_seconds: float = 1.5) -> dict:
    """A span worker draining every 32 steps into ``BusySink`` while this thread runs
    GIL-bound steps; the meter's figures, with the GIL wait per second of training."""
    meter = SelfCostMeter(0.0)  # made on this thread: it is the training thread
    rec = Recorder(100_000, DropCounter(), None)
    builder = StepRecordBuilder(RunIdentity("run-busy", 0, 1, 0, "option"),
                                Resource.create({"service.name": "busy"}),
                                InstrumentationScope("otel_train", "0.1.0"), False, "cpu",
                                lambda tid: True, epoch_offset_ns())
    worker = SpanBuildWorker(rec, builder, RowRoute(None, SinkExport([BusySink(busy_seconds, hold_gil)]), 0),
                             DropCounter(), meter, poll_interval_seconds=0.01,
                             drain_at_records=32)
    worker.start()
    start = time.perf_counter()
    end = start + train_seconds
    i = 0
    while time.perf_counter() < end:
        step = rec.begin_step("train", i)
        with step.phase("forward"):
            sum(range(30_000))  # ~1 ms of Python work: it needs the GIL the sink holds
        rec.finish_step(step, None)
        i += 1
    trained = time.perf_counter() - start
    worker.stop(5.0)
    figures = meter.figures()
    figures["wait_gil_ms_per_second"] = (figures["wait_gil_us_per_step"] or 0.0) * \
        figures["steps"] / 1e3 / trained
    return figures


def test_a_busy_background_thread_shows_as_the_training_threads_wait() -> None:
    if SelfCostMeter().schedstat.unavailable:
        pytest.skip("no per-thread schedstat here")
    busy = _worker_run(busy_seconds=0.02)
    assert busy["wait_gil_us_per_step"] > 0, busy
    # Never more than the background thread ran: the wait is bounded by its CPU.
    assert busy["wait_us_per_step"] <= busy["background_cpu_us_per_step"] * 1.001 + 0.01, busy
    assert busy["share_of_step_time"] > 0, busy
    # The same drains, asleep instead of spinning: only the GIL held differs. Compared per
    # second of training, not per step: the quiet loop takes more steps in the same time.
    # The spinning sink holds the GIL 20 ms per 32 steps of ~1 ms; the worker's own work
    # (building the spans, ~2-4% of the steps' time) is what the sleeping sink leaves: 7x
    # apart on an idle machine, more under load (the training thread runs less).
    quiet = _worker_run(busy_seconds=0.02, hold_gil=False)
    assert quiet["wait_gil_ms_per_second"] < busy["wait_gil_ms_per_second"], (quiet, busy)


def test_the_gauge_serves_the_recent_share_of_the_loops_time(tmp_path: Path) -> None:
    run = start_test_run(tmp_path, exporter="none", prometheus_port=0, console=False)
    try:
        for step in run.steps(range(500)):
            with step.phase("forward"):
                sum(range(1000))
        own = run.costs()["own_cost"]
        text = urllib.request.urlopen(run.prometheus_url + "/metrics", timeout=10).read().decode()
    finally:
        run.shutdown()
    got = re.findall(r"^otel_train_instrumentation_overhead_ratio\{[^}]*\} (\S+)$", text, re.MULTILINE)
    assert len(got) == 1, text
    assert 0.0 < float(got[0]) <= 1.0
    assert float(got[0]) == pytest.approx(own["recent_share_of_step_time"], rel=0.5)


def test_the_summary_line_says_why_the_wait_is_missing_where_it_cannot_be_measured() -> None:
    own = SelfCostMeter(2_000.0, started_ns=0)
    own.schedstat.unavailable = "no per-thread schedstat on darwin"
    own.add_hot_path_spans(500)
    own.note_steps(100, 0, 100_000_000)
    line = format_costs_table({"own_cost": own.figures()}).splitlines()[-1]
    assert "1.00% of the training loop's time" in line
    assert "wait on its threads not measured: no per-thread schedstat on darwin" in line
