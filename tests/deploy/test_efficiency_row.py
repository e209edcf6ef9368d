"""The dashboard's "Efficiency" row against the real Prometheus, fed by a tiny fake exporter.

The throughput, MFU and FLOP/s series come from runs that count tokens, samples or FLOPs; the
end-to-end test's plain loops export none of them. So a fake exporter (prometheus_client on
127.0.0.1) serves every series the row reads, for two ranks, and the real ``prometheus``
scrapes it every second. Each query of the row must return the served values; the dashed
"alert below" lines (a baseline that ends 10 minutes ago) are run with their window moved to
the last 30 s, where they must be (1 - drop) x the served value.

Runs in CI (``CI=true``) and never skips there: a missing ``prometheus`` binary fails the test.
"""

from __future__ import annotations

import math
import socket
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from deploy_support import GRAFANA, REPO, load_dashboard, prometheus_queries
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_server import PrometheusServer, require_binary

sys.path[:0] = [str(GRAFANA), str(REPO / "deploy")]
import rows_efficiency  # noqa: E402
from promql import T  # noqa: E402

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(90)]

SERVED = {  # rank -> value, for every gauge the row reads
    "otel_train_tokens_per_second": {"0": 5000.0, "1": 4000.0},
    "otel_train_samples_per_second": {"0": 50.0, "1": 40.0},
    "otel_train_achieved_flops_per_second": {"0": 2e14, "1": 1.6e14},
    "otel_train_peak_flops_per_second": {"0": 1e15, "1": 1e15},
    "otel_train_goodput_ratio": {"0": 0.8, "1": 0.6},
}
JOB_SECONDS = {"startup": 60.0, "steps": 800.0, "checkpoint": 90.0, "evaluation": 30.0,
               "restart_lost": 0.0, "other": 20.0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def prom() -> Iterator[PrometheusServer]:
    require_binary("prometheus")
    registry = CollectorRegistry()
    for name, by_rank in SERVED.items():
        gauge = Gauge(name, name, ["rank"], registry=registry)
        for rank, value in by_rank.items():
            gauge.labels(rank).set(value)
    mfu = Gauge("otel_train_mfu_ratio", "mfu", ["rank", "basis"], registry=registry)
    mfu.labels("0", "step").set(0.4)
    mfu.labels("0", "exclude_data").set(0.5)
    mfu.labels("1", "step").set(0.3)
    steps = Counter("otel_train_steps", "steps", ["rank"], registry=registry)
    job = Counter("otel_train_job_seconds", "job", ["part", "rank"], registry=registry)
    for rank in ("0", "1"):
        steps.labels(rank).inc(100)
        for part, seconds in JOB_SECONDS.items():
            job.labels(part, rank).inc(seconds)
    port = _free_port()
    server, _ = start_http_server(port, "127.0.0.1", registry=registry)
    try:
        with PrometheusServer([f"127.0.0.1:{port}"], scrape_interval="1s") as p:
            p.wait_for("count(otel_train_goodput_ratio) == 2", timeout=30, interval=0.5)
            yield p
    finally:
        server.shutdown()


def _row_queries() -> dict[tuple[str, str], str]:
    found = {(title, ref): q for title, ref, q in prometheus_queries(load_dashboard())
             if title in rows_efficiency.PANELS}
    assert {title for title, _ in found} == set(rows_efficiency.PANELS)
    return found


def _values(result: list[Any], *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(s["metric"].get(k, "") for k in labels): float(s["value"][1]) for s in result}


def test_each_panel_of_the_row_shows_the_served_series(prom: PrometheusServer) -> None:
    q = _row_queries()
    throughput = _values(prom.query(q[("Throughput per rank", "A")]), "rank", "throughput")
    assert throughput == {("0", "tokens"): 5000.0, ("1", "tokens"): 4000.0,
                          ("0", "samples"): 50.0, ("1", "samples"): 40.0}
    mfu = _values(prom.query(q[("MFU per rank", "A")]), "rank", "basis")
    assert mfu == {("0", "step"): 0.4, ("0", "exclude_data"): 0.5, ("1", "step"): 0.3}
    flops = _values(prom.query(q[("Achieved FLOP/s per rank", "A")]), "rank")
    assert flops == {("0",): 2e14, ("1",): 1.6e14}
    peak = _values(prom.query(q[("Achieved FLOP/s per rank", "B")]), "rank")
    assert peak == {("0",): 1e15, ("1",): 1e15}
    goodput = _values(prom.query(q[("Goodput", "A")]), "rank")
    assert goodput == {("0",): 0.8, ("1",): 0.6}
    shares = _values(prom.query(q[("Where the job's time went", "A")]), "part")
    total = sum(JOB_SECONDS.values())
    assert shares == pytest.approx({(p,): s / total for p, s in JOB_SECONDS.items()})
    assert math.fsum(shares.values()) == pytest.approx(1.0)


def test_the_dashed_alert_lines_sit_the_drop_threshold_below_the_baseline(
        prom: PrometheusServer) -> None:
    q = _row_queries()
    for (title, ref), drop_key, label, served in (
            (("Throughput per rank", "B"), "throughput_drop_ratio", "throughput",
             {("0", "tokens"): 5000.0, ("0", "samples"): 50.0}),
            (("MFU per rank", "B"), "mfu_drop_ratio", "basis", {("0", "step"): 0.4})):
        expr = q[(title, ref)]
        assert " offset 10m" in expr and "[60m:1m]" in expr
        recent = expr.replace(" offset 10m", "").replace("[60m:1m]", "[30s:1s]")
        want = {k: (1 - T.deploy[drop_key]) * v for k, v in served.items()}
        # The subquery's steps are whole seconds: it needs a second of samples behind it.
        result = prom.wait_for(recent, lambda r: set(want) <= set(_values(r, "rank", label)),
                               timeout=15, interval=0.5)
        got = _values(result, "rank", label)
        assert {k: got[k] for k in want} == pytest.approx(want), (title, got)
