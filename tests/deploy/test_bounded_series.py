"""Bounded series: with ``metrics_rank_label="gauges"`` a real scrape has no ``rank`` on the step
and phase histograms, the per-rank counters keep it, and a real Prometheus with the
repository's rules still names the slow rank as the straggler; the per-job recording rules
have one series per job whatever the number of ranks.

Two training processes of one run (rank 1 spends 40 ms more in ``forward`` per step), scraped
every second by ``prometheus`` (tests/prometheus_server.py) with the rules loaded.
"""

from __future__ import annotations

import textwrap
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from deploy_support import RULE_FILES, Child, alert_rules, child_env
from prometheus_client.parser import text_string_to_metric_families
from prometheus_server import PrometheusServer, require_binary

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(90)]

# `python child.py <stop_file> <status_dir> <rank> <extra forward s>`
CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    sys.modules["torch"] = None  # sleeping loops need no torch
    import otel_train

    stop_file, status_dir, rank, extra = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    deadline = time.monotonic() + 60.0

    def batches():
        i = 0
        while not os.path.exists(stop_file) and time.monotonic() < deadline:
            yield i
            i += 1

    with otel_train.start_run(
        service_name="bounded", run_id="bounded-run", rank=rank, world_size=2, local_rank=rank,
        prometheus_port=0, console=False, exporter="none", status_dir=status_dir,
        metrics_rank_label="gauges",
    ) as run:
        print(json.dumps({"prometheus_url": run.prometheus_url}), flush=True)
        for step in run.steps(batches(), loader="train"):
            with step.phase("forward"):
                time.sleep(0.02 + extra)
            with step.phase("backward"):
                time.sleep(0.015)
    """
)
HISTOGRAMS = ("otel_train_step_duration_seconds", "otel_train_phase_duration_seconds")
RANKED = ("otel_train_steps", "otel_train_slow_steps",  # counters: the parser drops _total
          "otel_train_last_step_timestamp_seconds", "otel_train_run_info")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    require_binary("prometheus")
    workdir = tmp_path_factory.mktemp("bounded-series")
    (workdir / "child.py").write_text(CHILD)
    env = child_env()
    children = {f"r{rank}": Child(f"r{rank}", workdir, env, [str(rank), str(extra)])
                for rank, extra in ((0, 0.0), (1, 0.04))}
    try:
        for child in children.values():
            child.wait_url(timeout=40)
        with PrometheusServer([c.hostport for c in children.values()], rule_files=RULE_FILES,
                              scrape_interval="1s") as prom:
            prom.wait_for("count(otel_train:training_seconds_per_step:rate5m) == 2",
                          timeout=30, interval=0.5)
            yield {"prom": prom, **children}
    finally:
        for child in children.values():
            child.stop_file.touch()
        for child in children.values():
            child.stop()


def test_a_scrape_has_no_rank_on_the_histograms_and_keeps_it_on_the_counters(
        ranks: dict[str, Any]) -> None:
    with urllib.request.urlopen(f"http://{ranks['r1'].hostport}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    labels: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels.setdefault(fam.name, set()).update(s.labels)
    for name in HISTOGRAMS:
        assert labels[name] and "rank" not in labels[name], (name, labels[name])
    assert {"phase", "kind", "loader"} <= labels["otel_train_phase_duration_seconds"]
    for name in RANKED:
        assert "rank" in labels[name], name


def test_the_straggler_rule_still_names_the_slow_rank(ranks: dict[str, Any]) -> None:
    prom = ranks["prom"]
    expr = alert_rules()["OtelTrainStraggler"]["expr"]
    found = prom.wait_for(expr, lambda r: len(r) == 1, timeout=20, interval=1)
    assert [s["metric"]["rank"] for s in found] == ["1"]
    ratios = {s["metric"]["rank"]: float(s["value"][1]) for s in prom.query(
        "otel_train:training_seconds_per_step:ratio_to_run_median_5m")}
    print("ratio to run median by rank:", ratios)
    assert ratios["1"] > 1.2 > ratios["0"]


def test_the_per_job_rules_have_one_series_per_job(ranks: dict[str, Any]) -> None:
    prom = ranks["prom"]
    prom.wait_for("otel_train:step_duration_seconds:p50_5m_by_job", timeout=15, interval=1)
    for rule in ("otel_train:step_duration_seconds:p50_5m_by_job",
                 "otel_train:steps:rate5m_by_job", "otel_train:ranks:count_by_job"):
        result = prom.query(rule)
        assert len(result) == 1 and "rank" not in result[0]["metric"], (rule, result)
    assert float(prom.query("otel_train:ranks:count_by_job")[0]["value"][1]) == 2
    per_phase = prom.query('otel_train:phase_duration_seconds:per_step_5m_by_job{phase="forward"}')
    assert len(per_phase) == 1  # both ranks' forward, one series
