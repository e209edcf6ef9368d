"""Governing in a real run: an evaluation over budget is stretched, and the change is said
where users look: one console line, a span event on the step, the interval gauge, the costs
file's governing block and the advisor at the interval in force, the report."""

from __future__ import annotations

import json
import logging
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from train_helpers import clean_env, read_file_spans, start_in_process_run  # noqa: F401

from otel_train.common import attributes as A
from otel_train.recording.schedule import INTERVAL_EVENT

pytestmark = pytest.mark.timeout(120)


def _intervals(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return {s.labels["operation"]: s.value for fam in text_string_to_metric_families(text)
            if fam.name == A.METRIC_MONITORING_INTERVAL for s in fam.samples}


def test_an_evaluation_over_budget_is_stretched_and_every_place_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("otel_train.derived.governor.DECIDE_EVERY_SECONDS", 0.2)
    # 2 ms of training a step, 15 ms of val_loss every 50 steps: 15% of training time.
    run = start_in_process_run(tmp_path, budget_action="govern", prometheus_port=0)
    changed_at = None
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for step in run.steps(range(4000)):
            with step.phase("forward"):
                time.sleep(0.002)
            if step.due("val_loss", every=50):
                with step.monitor("val_loss"):
                    time.sleep(0.015)
            if changed_at is None and run._recorder.schedule.history:
                changed_at = step.index
            if changed_at is not None and step.index > changed_at + 400:
                break
        assert changed_at is not None, "no interval change within 4000 steps"
        in_force = run._recorder.schedule.intervals()["val_loss"]
        assert in_force > 50
        assert _intervals(run.prometheus_url) == {"val_loss": in_force}
        costs = run.costs()
        run.shutdown()
    block = costs["governing"]
    assert block["governing"] is True
    assert block["operations"]["val_loss"]["interval_steps"] == in_force
    first = block["changes"][0]
    assert first["from"] == 50 and first["step"] == changed_at
    (advice,) = costs["advisor"]
    assert advice["interval_steps"] == in_force and "(governed)" in advice["advice"]
    lines = [r.getMessage() for r in caplog.records if "val_loss every 50 ->" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].startswith(f"otel-train: val_loss every 50 -> {first['to']} steps: it costs ")
    assert lines[0].endswith(f"% of training time, budget 5% (from step {changed_at})")
    roots = [s for s in read_file_spans(tmp_path / "spans.jsonl") if s.name == A.STEP_SPAN_NAME]
    with_event = [(s.attributes[A.STEP],
                   attrs) for s in roots for name, attrs in s.events if name == INTERVAL_EVENT]
    assert with_event[0][0] == changed_at
    assert with_event[0][1]["train.monitoring.operation"] == "val_loss"
    assert with_event[0][1]["train.monitoring.previous_interval_steps"] == 50
    assert with_event[0][1]["train.monitoring.interval_steps"] == first["to"]
    saved = json.loads((tmp_path / "monitoring_costs.json").read_text())
    assert saved["governing"]["operations"]["val_loss"]["interval_steps"] == in_force


def test_without_governing_the_gauge_shows_the_asked_interval_and_nothing_changes(
        tmp_path: Path) -> None:
    run = start_in_process_run(tmp_path, prometheus_port=0)
    ran = [step.index for step in run.steps(range(300)) if step.due("val_loss", every=50)]
    assert ran == [0, 50, 100, 150, 200, 250]
    assert _intervals(run.prometheus_url) == {"val_loss": 50}
    costs = run.costs()
    run.shutdown()
    assert costs["governing"]["governing"] is False and costs["governing"]["changes"] == []


def test_the_interval_gauge_is_pushed_over_otlp_as_its_twin(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from otlp_metrics_receivers import GrpcOtlpMetricsReceiver

    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "60000")  # only our explicit flush
    with GrpcOtlpMetricsReceiver() as rx:
        run = start_in_process_run(tmp_path, prometheus_port=0, metrics_exporter="otlp",
                                   otlp_endpoint=rx.endpoint, otlp_protocol="grpc",
                                   run_id="governed", budget_action="govern")
        try:
            for step in run.steps(range(60)):
                run._recorder.schedule.proposed = {"val_loss": (30, 0.2)}  # as decided
                step.due("val_loss", every=10)
                step.due("inference", every=20)
            assert run._telemetry.derived.otlp_metrics.force_flush(5000)
            pulled = _intervals(run.prometheus_url)
            latest = rx.latest()
        finally:
            run.shutdown()
    assert pulled == {"val_loss": 30, "inference": 20}
    gauge = latest["otel_train.monitoring.interval_steps"]
    assert gauge.unit == "{step}"
    pushed = {p.attributes["operation"]: p.value for p in gauge.points}
    assert pushed == pulled
    assert all(p.attributes["run_id"] == "governed" and p.attributes["rank"] == "0"
               for p in gauge.points)
