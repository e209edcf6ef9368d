"""The step ring read by the span worker, or by the exporter process (step_ring="on"):
records in the order they ended, the queue's in their places; a full ring's drops in the
run's accounting; the own cost counts the ring's steps whoever reads them."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from train_helpers import clean_env  # noqa: F401  (autouse fixture)

import otel_train
from otel_train.common.drop_counter import DropCounter
from otel_train.pipeline.ring_source import RingSource
from otel_train.recording.recorder import MonitorRecord, Recorder
from otel_train.recording.step_ring import StepRing
from otel_train.rundir.span_files import read_otlp_json_lines

pytestmark = pytest.mark.timeout(120)


def test_ring_steps_and_queued_records_come_back_in_the_order_they_ended():
    rec = Recorder(100, DropCounter(), None)
    source = RingSource(rec, StepRing.create(1 << 16))
    for step in rec.steps(range(5), "train"):
        with step.phase("forward"):
            pass
        if step.index == 2:
            step.set_attribute("weights", [1.0, 2.0])  # a sequence: the queue's
    with MonitorRecord(rec, "evaluate"):
        pass
    for step in rec.steps(range(2), "train"):
        pass
    assert source.refill() == 8
    got = [type(r).__name__ + str(getattr(r, "index", "")) for r in source.pending]
    assert got == ["RingStep0", "RingStep1", "Step2", "RingStep3", "RingStep4",
                   "MonitorRecord", "RingStep5", "RingStep6"]
    assert not rec.queue and source.refill() == 0
    source.detach()
    for step in rec.steps(range(1), "train"):
        pass
    assert len(rec.queue) == 1 and source.refill() == 0  # detached: queued, no marker


def _spans_per_step(path: Path) -> dict[int, int]:
    counts: dict[int, int] = {}
    for line in read_otlp_json_lines(path):
        for rs in line["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    attrs = {a["key"]: a["value"] for a in span["attributes"]}
                    step = int(attrs["train.step"]["intValue"])
                    counts[step] = counts.get(step, 0) + 1
    return counts


@pytest.mark.parametrize("export_process", [True, False])
def test_a_full_ring_drops_the_newest_steps_counted_and_delivered_plus_dropped_is_emitted(
        tmp_path: Path, export_process: bool):
    run = otel_train.start_run(
        exporter="jsonl", spans_path=str(tmp_path / "spans.jsonl"), prometheus_port=None,
        console=False, status_dir=str(tmp_path), run_id="ring-full", step_ring="on",
        max_queued_steps=64, export_process=export_process, startup_span=False)
    worker = run._telemetry.worker
    worker.paused = True  # nothing reads the ring: it fills (64 KiB: ~300 steps of 4 spans)
    client = run._telemetry.client
    if export_process:  # the exporter process reads it (step_ring_in_exporter): stopped
        assert client.reads_ring
        os.kill(client.pid, signal.SIGSTOP)
    steps = 1000
    for step in run.steps(range(steps), loader="train"):
        with step.phase("forward"):
            pass
        with step.phase("backward"):
            pass
        with step.monitor("val_loss"):
            pass
    ring = worker._ring_source.ring
    written, dropped = ring.counters()["written_steps"], ring.counters()["dropped_steps"]
    assert written + dropped == steps and 100 < written < steps
    worker.paused = False
    if export_process:
        os.kill(client.pid, signal.SIGCONT)
    run.shutdown(timeout=30)
    drops = run.dropped_spans()
    assert drops == {"step_ring_full": 5 * dropped}
    delivered = _spans_per_step(tmp_path / "spans.jsonl")
    assert set(delivered.values()) == {5} and sorted(delivered) == list(range(written))
    assert sum(delivered.values()) + drops["step_ring_full"] == 5 * steps  # emitted
    if export_process:  # monitoring_costs.json says it beside the ring's other counts
        costs = _costs_file(tmp_path)
        assert costs["dropped_spans"] == drops
        assert costs["step_ring"]["full_dropped_spans"] == 5 * dropped
        assert costs["step_ring"]["steps_built_in_exporter_process"] == written


def _costs_file(status_dir: Path) -> dict:
    import json

    (path,) = status_dir.rglob("monitoring_costs*.json")
    return json.loads(path.read_text())


def test_queued_records_late_for_their_place_in_the_ring_are_counted_in_the_costs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The exporter process's reader does not wait at a marker whose queued record has not
    come (its wait set to 0 there): it passes it over and exports the record when it comes.
    run.costs() and monitoring_costs.json count both; nothing is lost."""
    from otel_train.export.process import launch

    monkeypatch.setattr(launch, "_BOOT", launch._BOOT.replace(
        "from otel_train.export.process.child import child_main; ",
        "from otel_train.export.process import ring_feed; "
        "ring_feed.MARKER_WAIT_SECONDS = 0.0; "
        "from otel_train.export.process.child import child_main; "))
    run = otel_train.start_run(
        exporter="jsonl", spans_path=str(tmp_path / "spans.jsonl"), prometheus_port=None,
        console=False, status_dir=str(tmp_path), run_id="ring-late", startup_span=False)
    assert run._telemetry.client.reads_ring  # step_ring="auto": read by the exporter process
    for step in run.steps(range(60), loader="train"):
        with step.phase("forward"):
            pass
        if step.index % 6 == 0:  # longer than the ring carries: queued, a marker in its place
            step.set_attribute("note", "x" * 400)
        if step.index % 6 == 1:
            time.sleep(0.05)  # the reader (every 20 ms) reaches the marker before the record
    costs = run.costs()
    ring = costs["step_ring"]
    assert ring["markers_unmatched"] >= 1 and ring["late_records"] >= 1
    assert ring["steps_built_in_exporter_process"] == 50
    run.shutdown(timeout=10)
    final = _costs_file(tmp_path)["step_ring"]
    assert 1 <= final["markers_unmatched"] == final["late_records"] <= 10  # all came late
    assert final["resent_spans"] == final["full_dropped_spans"] == 0
    assert run.dropped_spans() == {}
    assert sorted(_spans_per_step(tmp_path / "spans.jsonl")) == list(range(60))


@pytest.mark.parametrize("step_ring", ["off", "on"])
def test_the_own_cost_counts_every_step_and_its_spans_whoever_reads_the_ring(
        tmp_path: Path, step_ring: str):
    """With the ring read by the exporter process, its reader's counts feed this process's
    own-cost meter (RingCostCounts): every step and each of its spans' hot-path cost, as
    when the span worker builds them here; run.costs() has them at once."""
    run = otel_train.start_run(
        exporter="jsonl", spans_path=str(tmp_path / "spans.jsonl"), prometheus_port=None,
        console=False, status_dir=str(tmp_path), run_id="ring-cost", step_ring=step_ring,
        startup_span=False)
    assert run._telemetry.client.reads_ring == (step_ring == "on")
    for step in run.steps(range(300), loader="train"):
        with step.phase("forward"):
            pass
        with step.phase("backward"):
            pass
    costs = run.costs()
    own = costs["own_cost"]
    assert costs["steps"] == own["steps"] == 300
    per_span = own["hot_path_ns_per_span"]
    # Four spans a step (root, data, forward, backward), each at the warm or cold figure.
    assert 4 * per_span["warm"] / 1e3 - 0.01 <= own["hot_path_us_per_step"] \
        <= 4 * per_span["cold"] / 1e3 + 0.01
    run.shutdown(timeout=10)
    assert run.dropped_spans() == {}
    assert sum(_spans_per_step(tmp_path / "spans.jsonl").values()) == 300 * 4


def test_ring_cost_counts_add_what_the_exporter_process_counted_since_its_last_report():
    from otel_train.common.self_cost import SelfCostMeter
    from otel_train.pipeline.ring_source import RingCostCounts

    meter = SelfCostMeter(100.0, cold_ns_per_span=300.0)

    class _Startup:
        done = False

    startup = _Startup()
    counts = RingCostCounts(meter, startup)
    counts({"steps": 2, "warm_spans": 6, "cold_spans": 2, "first_start_ns": 10,
            "last_end_ns": 50, "startup_done": True})
    counts({"steps": 2, "warm_spans": 6, "cold_spans": 2, "first_start_ns": 10,
            "last_end_ns": 50, "startup_done": True})  # the same report again: nothing new
    counts({"steps": 3, "warm_spans": 9, "cold_spans": 2, "first_start_ns": 10,
            "last_end_ns": 90, "startup_done": True})
    figures = meter.figures()
    assert figures["steps"] == 3 and startup.done
    assert figures["hot_path_us_per_step"] == round((9 * 100 + 2 * 300) / 3 / 1e3, 3)


def test_a_take_over_reads_the_ring_from_what_the_childs_last_report_settled():
    from ring_helpers import RingExporter

    from otel_train.recording.step_ring_reader import StepRingReader

    class _Client(RingExporter):
        """The child has read four steps, reported two settled, and died."""

        def __init__(self) -> None:
            super().__init__()
            self.settled: int | None = None
            self.resent = 0

        def settled_ring_position(self) -> int | None:
            return self.settled

        def count_resent(self, spans: int) -> None:
            self.resent += spans

    rec = Recorder(100, DropCounter(), None)
    ring = StepRing.create(1 << 16)
    client = _Client()
    source = RingSource(rec, ring, exporter=client)
    for step in rec.steps(range(6), "train"):
        with step.phase("forward"):
            pass
    child = StepRingReader(StepRing.open(os.dup(ring.fd)), move_tail=False)
    items = child.read_items(4)  # read ahead: steps 0-3, handed on there
    client.settled = items[1][1]  # its last report read here: steps 0 and 1 settled
    assert ring.counters()["tail"] == 0  # not freed yet: the child died before that
    client.taken_over = True
    source.refill()
    assert [r.index for r in source.pending] == [2, 3, 4, 5]  # 0 and 1 are in its counts
    assert client.resent == 2 * 3  # steps 2 and 3 were handed on there: sent again
