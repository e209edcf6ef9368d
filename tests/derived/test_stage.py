"""DerivedMetricsStage end to end: a real run, scraped by a real Prometheus, checked with PromQL."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_server import PrometheusServer

import otel_train

pytestmark = pytest.mark.timeout(90)

STEPS = 20
SLOW_INDEX = 12
TRAIN_S, MONITOR_S = 0.180, 0.020  # monitoring: 10% of every step, 1/9 of its training time


def hold(seconds: float) -> None:
    """Sleep, then spin the last 2 ms: phase durations exact to well under a millisecond."""
    deadline = time.perf_counter() + seconds
    time.sleep(max(0.0, seconds - 0.002))
    while time.perf_counter() < deadline:
        pass


def train(options: dict[str, Any], ready: threading.Event, release: threading.Event,
          out: dict[str, Any]) -> None:
    """The training loop of the test, run in its own thread."""
    try:
        with otel_train.start_run(**options) as run:
            out["url"] = run.prometheus_url
            ready.set()
            for step in run.steps(range(STEPS), loader="train"):
                scale = 10 if step.index == SLOW_INDEX else 1  # the planted slow step
                with step.phase("forward"):
                    hold(TRAIN_S * scale)
                with step.monitor("inference"):
                    hold(MONITOR_S * scale)
            with run.step() as step:  # the stuck step
                with step.phase("backward"):
                    out["stuck"] = True
                    release.wait(60)
            out["costs"] = run.costs()
    except BaseException as exc:  # surfaced by the test thread
        out["error"] = exc
    finally:
        ready.set()


def value(result: list[Any]) -> float:
    assert len(result) == 1, result
    return float(result[0]["value"][1])


@pytest.mark.prometheus
def test_prometheus_sees_a_10_percent_overhead_a_slow_step_and_a_stuck_step(
        tmp_path: Path) -> None:
    ready, release, out = threading.Event(), threading.Event(), {}
    options = dict(prometheus_port=0, exporter="none", console=False, status_dir=str(tmp_path),
                   slow_step_factor=5.0, run_id="e2e")
    worker = threading.Thread(target=train, args=(options, ready, release, out), daemon=True)
    worker.start()
    try:
        assert ready.wait(30) and "error" not in out, out.get("error")
        target = out["url"].removeprefix("http://")
        with PrometheusServer([target]) as prom:
            prom.wait_for(f"otel_train_steps_total == {STEPS}", timeout=40)
            ratio = value(prom.query('otel_train_monitoring_overhead_ratio{window="cumulative"}'))
            assert ratio == pytest.approx(1 / 9, abs=0.01)  # monitoring / training time
            share = value(prom.query(
                'otel_train_monitoring_wall_share_ratio{window="cumulative"}'))
            assert share == pytest.approx(0.10, abs=0.01)  # monitoring / wall time
            # the same figure from the histograms, as the deploy recording rule computes it
            from_hist = value(prom.query(
                'sum(otel_train_phase_duration_seconds_sum{kind="monitor"})'
                ' / (sum(otel_train_step_duration_seconds_sum)'
                ' - sum(otel_train_phase_duration_seconds_sum{kind="monitor"}))'))
            assert from_hist == pytest.approx(1 / 9, abs=0.01)
            op = value(prom.query('otel_train_operation_overhead_ratio{operation="inference"}'))
            assert op == pytest.approx(ratio, abs=1e-9)
            assert value(prom.query("otel_train_slow_steps_total")) == 1
            assert value(prom.query("otel_train_monitoring_budget_ratio")) == 0.05
            # Only data phases carry a loader (issue 11): forward has none, data has its own.
            loaders = prom.query('otel_train_phase_duration_seconds_count{phase="forward"}')
            assert [r["metric"].get("loader") for r in loaders] == [None]
            loaders = prom.query('otel_train_phase_duration_seconds_count{phase="data"}')
            assert [r["metric"]["loader"] for r in loaders] == ["train"]
            # the stuck step: visible while its span has not ended
            stuck = prom.wait_for("otel_train_step_in_progress_seconds > 1.5", timeout=30)
            assert value(stuck) > 1.5
            # the phase it is stuck in: a label the stall alert carries
            phase = prom.wait_for("otel_train_step_phase_in_progress_seconds > 1", timeout=30)
            assert [r["metric"]["phase"] for r in phase] == ["backward"]
            last = value(prom.query("otel_train_last_step_timestamp_seconds"))
            assert time.time() - last > 1.0  # not moving while stuck
            now = time.time()
            exemplars = prom.query_exemplars("otel_train_step_duration_seconds_bucket",
                                             now - 300, now + 60)
            trace_ids = [e["labels"]["trace_id"] for s in exemplars for e in s["exemplars"]]
            assert trace_ids and all(re.fullmatch(r"[0-9a-f]{32}", t) for t in trace_ids)
    finally:
        release.set()
        worker.join(30)
    assert not worker.is_alive() and "error" not in out, out.get("error")
    costs = json.loads((tmp_path / "monitoring_costs.json").read_text())
    assert costs["steps"] == STEPS + 1
    assert costs["operations"]["inference"]["calls"] == STEPS
    assert costs["run_id"] == "e2e"
    # the stuck step (no monitoring) ended after the checks: it lowered the cumulative share
    assert 0.0 < costs["total_share"] < 0.10 and costs["budget_status"] in ("ok", "warning")


def test_a_taken_port_fails_start_run_naming_the_port_and_the_option(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ValueError) as err:
            otel_train.start_run(prometheus_port=port, exporter="none", console=False,
                                 status_dir=str(tmp_path))
    msg = str(err.value)
    assert f"port {port}" in msg and "prometheus_port" in msg
    assert "OTEL_TRAIN_PROMETHEUS_PORT" in msg


def test_run_costs_matches_the_costs_file_written_at_shutdown(tmp_path: Path) -> None:
    with otel_train.start_run(prometheus_port=None, exporter="none", console=False,
                              status_dir=str(tmp_path), run_id="c1") as run:
        for step in run.steps(range(5), loader="train"):
            with step.phase("forward"):
                pass
            if step.index == 2:
                with step.monitor("val_loss"):
                    for _ in step.iter_data(range(3), loader="val"):
                        pass
        with run.monitor("checkpoint"):
            pass
        assert run.prometheus_url is None
        live = run.costs()
    written = json.loads((tmp_path / "monitoring_costs.json").read_text())
    for key in ("run_id", "steps", "operations", "budget_status", "advisor"):
        assert written[key] == live[key], key
    assert set(written["operations"]) == {"val_loss", "checkpoint"}


class _FileSdPrometheus(PrometheusServer):
    """The real Prometheus with deploy/prometheus/prometheus-local.yml's discovery job."""

    def __init__(self, runs_root: Path) -> None:
        super().__init__([], job="unused")
        self._jobs = {}
        local = yaml.safe_load(
            (Path(__file__).parents[2] / "deploy/prometheus/prometheus-local.yml").read_text())
        job = local["scrape_configs"][0]
        sd = job["file_sd_configs"][0]
        assert sd["files"][0].endswith("otel-train-runs/prometheus-targets/*.json")
        sd["files"] = [str(runs_root / "prometheus-targets" / "*.json")]
        sd["refresh_interval"] = "1s"
        job["scrape_interval"] = job["scrape_timeout"] = "1s"
        self._job = job

    def _config_text(self) -> str:
        base = super()._config_text().replace("scrape_configs:\n", "")
        return base + yaml.safe_dump({"scrape_configs": [self._job]})


@pytest.mark.prometheus
def test_a_taken_default_port_moves_on_and_prometheus_finds_both_runs_by_file_sd(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    held = socket.socket()
    try:
        held.bind(("127.0.0.1", 9464))  # the default port: taken (by us, or already)
        held.listen()
    except OSError:
        pass
    runs = []
    try:
        with caplog.at_level("WARNING", logger="otel_train"):
            for name in ("exp-a", "exp-b"):
                runs.append(otel_train.start_run(
                    run_id=name, status_dir=str(tmp_path / name), exporter="none",
                    console=False))
        urls = [run.prometheus_url for run in runs]
        assert all(u and not u.endswith(":9464") for u in urls) and len(set(urls)) == 2
        moved = [r.getMessage() for r in caplog.records if "is taken" in r.getMessage()]
        assert len(moved) == 2 and all(u in m for u, m in zip(urls, moved)), moved
        targets = [json.loads((tmp_path / n / "prometheus_targets-rank0.json").read_text())
                   for n in ("exp-a", "exp-b")]
        assert targets == [json.loads((tmp_path / "prometheus-targets" / f"{n}-rank0.json")
                                      .read_text()) for n in ("exp-a", "exp-b")]
        assert [t[0]["targets"][0] for t in targets] == [u.split("//")[1] for u in urls]
        for _ in range(3):
            for run in runs:
                with run.step() as step, step.phase("forward"):
                    pass
        for run in runs:
            run.flush()
        with _FileSdPrometheus(tmp_path) as prom:
            found = prom.wait_for('count(otel_train_steps_total) == 2', timeout=30)
            assert found
            per_run = prom.query('sum by (otel_train_run) (otel_train_steps_total)')
            assert {r["metric"]["otel_train_run"]: float(r["value"][1]) for r in per_run} == {
                "exp-a": 3.0, "exp-b": 3.0}
    finally:
        for run in runs:
            run.shutdown()
        held.close()
    assert not list(tmp_path.glob("**/*targets*.json"))  # ended runs leave discovery


def test_an_explicit_port_that_is_taken_still_raises(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ValueError, match="already in use"):
            otel_train.start_run(prometheus_port=taken.getsockname()[1], exporter="none",
                                 console=False, status_dir=str(tmp_path))
