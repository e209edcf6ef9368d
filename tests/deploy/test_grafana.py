"""deploy/grafana: provisioning structure, fixed datasource uids, every panel has a query,
and the committed dashboard / alerting files equal what dashboards_gen.py generates."""

from __future__ import annotations

import json
import re

import pytest
from deploy_support import (
    DASHBOARD_FILES,
    GENERATOR,
    PROVISIONING,
    RUNBOOK,
    alert_rules,
    github_anchor,
    iter_panels,
    load_dashboard,
    load_generator,
    load_yaml,
    prometheus_queries,
    variables,
)

pytestmark = pytest.mark.timeout(60)

CONTRACT_METRICS = {
    "otel_train_step_duration_seconds",
    "otel_train_phase_duration_seconds",
    "otel_train_monitoring_overhead_ratio",
    "otel_train_operation_overhead_ratio",
    "otel_train_monitoring_budget_ratio",
    "otel_train_steps_total",
    "otel_train_slow_steps_total",
    "otel_train_last_step_timestamp_seconds",
    "otel_train_step_in_progress_seconds",
    "otel_train_spans_dropped_total",
    "otel_train_instrumentation_overhead_ratio",
    "otel_train_gpu_utilization_ratio",
    "otel_train_gpu_memory_used_bytes",
    # the run's thresholds and identity (issue 9: thresholds travel with the run; stragglers)
    "otel_train_monitoring_critical_ratio",
    "otel_train_slow_step_factor",
    "otel_train_slow_operation_seconds",
    "otel_train_run_info",
    # device busy/idle, the steps' bound, memory (issue 27)
    "otel_train_phase_device_busy_seconds_total",
    "otel_train_device_idle_seconds_total",
    "otel_train_steps_by_bound_total",
    "otel_train_phase_memory_peak_bytes",
    "otel_train_host_rss_bytes",
    # efficiency (issue 28): goodput and the job envelope; MFU and FLOP/s of the throughput code
    # (tokens and samples per second are matched by name pattern: deploy/promql.py THROUGHPUT)
    "otel_train_goodput_ratio",
    "otel_train_job_seconds_total",
    "otel_train_mfu_ratio",
    "otel_train_achieved_flops_per_second",
    "otel_train_peak_flops_per_second",
    # communication per step and own work (issue 27: stragglers DDP can't hide)
    "otel_train_collectives_total",
    "otel_train_collective_seconds_total",
    "otel_train_collective_bytes_total",
    "otel_train_collective_exposed_seconds_total",
    "otel_train_own_work_seconds_total",
}


def datasources() -> dict[str, dict]:
    config = load_yaml(PROVISIONING / "datasources" / "datasources.yaml")
    assert config["apiVersion"] == 1
    return {ds["type"]: ds for ds in config["datasources"]}


def test_generated_files_equal_committed() -> None:
    gen = load_generator()
    for path, render in gen.OUTPUTS.items():
        assert path.exists(), f"{path} missing: run python deploy/grafana/dashboards_gen.py"
        assert path.read_text() == render(), (
            f"{path.name} differs from the generator: run python deploy/grafana/dashboards_gen.py"
        )
    assert gen.main(["--check"]) == 0


def test_datasources_have_fixed_uids_and_exemplar_link() -> None:
    ds = datasources()
    gen = load_generator()
    prom, tempo = ds["prometheus"], ds["tempo"]
    assert prom["uid"] == gen.PROMETHEUS_UID and tempo["uid"] == gen.TEMPO_UID
    links = prom["jsonData"]["exemplarTraceIdDestinations"]
    assert {"name": "trace_id", "datasourceUid": tempo["uid"]}.items() <= links[0].items()
    assert prom["url"].startswith("http://prometheus:") and tempo["url"].startswith("http://tempo:")


def test_dashboard_provider_points_at_mounted_dashboards() -> None:
    config = load_yaml(PROVISIONING / "dashboards" / "dashboards.yaml")
    (provider,) = config["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"].startswith("/var/lib/grafana/dashboards")


def test_dashboard_basics() -> None:
    dash = load_dashboard()
    assert dash["title"] == "Training overview"
    assert dash["uid"]
    names = [v["name"] for v in variables(dash)]
    assert "rank" in names
    ids = [p["id"] for p in iter_panels(dash)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in iter_panels(dash):
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24


def test_every_panel_has_a_query_on_a_provisioned_datasource() -> None:
    uids = {ds["uid"] for ds in datasources().values()}
    for dash_file in DASHBOARD_FILES:
        dash = load_dashboard(dash_file)
        for panel in iter_panels(dash):
            if panel["type"] == "row":
                continue
            targets = panel.get("targets") or []
            assert targets, f"panel {panel['title']!r} has no query"
            for tgt in targets:
                query = tgt.get("expr") or tgt.get("query")
                assert query and query.strip(), f"panel {panel['title']!r} has an empty query"
                ds = tgt.get("datasource") or panel.get("datasource")
                assert ds["uid"] in uids, f"panel {panel['title']!r} uses unknown uid {ds}"
        for var in variables(dash):
            assert var["datasource"]["uid"] in uids


def test_dashboard_covers_the_contract() -> None:
    dash = load_dashboard()
    exprs = " ".join(q for _, _, q in prometheus_queries(dash))
    used = {m for m in CONTRACT_METRICS if m in exprs}
    assert used == CONTRACT_METRICS, f"metrics without a panel: {CONTRACT_METRICS - used}"
    names = set(re.findall(r"\b(otel_train_[a-z_]+?)(?:_bucket|_sum|_count)?\b", exprs))
    assert names <= CONTRACT_METRICS, f"not in the telemetry contract: {names - CONTRACT_METRICS}"
    titles = {p["title"] for p in iter_panels(dash)}
    for needed in (
        "Step time p50 / p95 / max",
        "Where a step's time goes (per phase)",
        "Monitoring overhead vs budget",
        "Cost per monitoring operation (share of training time)",
        "Slow steps",
        "Stall: current step age",
        "GPU utilization",
        "GPU memory used",
        "Dropped telemetry",
        "Own work per rank vs run median",
        "Slowest rank: where its step time goes",
        "Communication",
        "Collective seconds per step",
        "Collectives per step",
        "Collective bytes per second",
        "Exposed communication share of step time",
    ):
        assert needed in titles


def test_step_time_panel_shows_exemplars_and_phase_panel_stacks() -> None:
    dash = load_dashboard()
    panels = {p["title"]: p for p in iter_panels(dash)}
    step = panels["Step time p50 / p95 / max"]
    assert step["type"] == "timeseries"
    assert any(t.get("exemplar") for t in step["targets"])
    assert any("otel_train_step_duration_seconds_bucket" in t["expr"] for t in step["targets"])
    phases = panels["Where a step's time goes (per phase)"]
    assert phases["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    overhead = panels["Monitoring overhead vs budget"]
    assert any("otel_train_monitoring_budget_ratio" in t["expr"] for t in overhead["targets"])


def test_grafana_alert_rules() -> None:
    config = load_yaml(PROVISIONING / "alerting" / "otel-train-alerts.yaml")
    assert config["apiVersion"] == 1
    dash = load_dashboard()
    panel_ids = {str(p["id"]) for p in iter_panels(dash)}
    anchors = {
        github_anchor(line.lstrip("#"))
        for line in RUNBOOK.read_text().splitlines()
        if line.startswith("#")
    }
    prom_uid = datasources()["prometheus"]["uid"]
    rules = [r for g in config["groups"] for r in g["rules"]]
    uids = [r["uid"] for r in rules]
    assert len(uids) == len(set(uids))
    text = json.dumps(rules)
    for topic in ("budget", "slow", "stall"):
        assert topic in text
    for rule in rules:
        refs = {d["refId"]: d for d in rule["data"]}
        assert rule["condition"] in refs
        assert refs["A"]["datasourceUid"] == prom_uid and refs["A"]["model"]["expr"].strip()
        assert rule["for"] and rule["labels"]["severity"] in {"warning", "critical"}
        ann = rule["annotations"]
        assert ann["__dashboardUid__"] == dash["uid"] and ann["__panelId__"] in panel_ids
        assert ann["runbook_url"].split("#")[1] in anchors
        assert ann["summary"] and ann["description"]


def test_the_generator_is_built_on_grafanas_sdk() -> None:
    text = GENERATOR.read_text()
    assert "from grafana_foundation_sdk.builders import" in text
    assert "json.dumps(model, cls=JSONEncoder)" in text  # the SDK's model is what is written


def test_overhead_panel_draws_the_runs_own_budget_and_critical_lines() -> None:
    panels = {p["title"]: p for p in iter_panels(load_dashboard())}
    overhead = panels["Monitoring overhead vs budget"]["targets"]
    exprs = {t["legendFormat"]: t["expr"] for t in overhead}
    assert "otel_train_monitoring_budget_ratio" in exprs["budget"]
    assert "otel_train_monitoring_critical_ratio" in exprs["critical"]
    call = {t["legendFormat"]: t["expr"] for t in panels["Seconds per monitoring call"]["targets"]}
    assert "otel_train_slow_operation_seconds" in call["limit"]


def test_straggler_panels_compare_each_rank_with_its_runs_median() -> None:
    gen = load_generator()
    panels = {p["title"]: p for p in iter_panels(load_dashboard())}
    (ratio,) = panels["Own work per rank vs run median"]["targets"]
    assert "quantile by (run_id) (0.5," in ratio["expr"] and "otel_train_run_info" in ratio["expr"]
    # own work (DDP evens out step times), training time where a process exports none
    assert "otel_train_own_work_seconds_total" in ratio["expr"]
    assert "otel_train_step_duration_seconds_sum" in ratio["expr"]
    steps = panels["Own work per rank vs run median"]["fieldConfig"]["defaults"]["thresholds"]
    assert steps["steps"][-1]["value"] == pytest.approx(1 + gen.T.deploy["straggler_slower_ratio"])
    slowest = panels["Slowest rank: where its step time goes"]["targets"]
    assert "topk by (run_id) (1," in slowest[0]["expr"] and 'kind="train"' in slowest[0]["expr"]
    assert "quantile by (run_id, phase) (0.5," in slowest[1]["expr"]


def test_grafana_alerts_run_exactly_the_prometheus_alerts() -> None:
    """Same expr, `for` and severity, and a condition true for every returned series."""
    config = load_yaml(PROVISIONING / "alerting" / "otel-train-alerts.yaml")
    grafana = [r for g in config["groups"] for r in g["rules"]]
    prom = alert_rules()
    assert len(grafana) == len(prom)
    by_runbook = {r["annotations"]["runbook_url"].split("#")[1]: r for r in grafana}
    for name, rule in prom.items():
        g = by_runbook[name.lower()]
        refs = {d["refId"]: d for d in g["data"]}
        assert refs["A"]["model"]["expr"].strip() == rule["expr"].strip(), name
        assert refs["A"]["model"]["instant"] is True
        cond = refs[g["condition"]]["model"]
        assert cond["type"] == "math" and cond["expression"] == (
            "is_number($A) || is_nan($A) || is_inf($A)")
        assert g["for"] == rule["for"], name
        assert g["labels"]["severity"] == rule["labels"]["severity"], name
        assert g["annotations"]["summary"] == rule["annotations"]["summary"], name
        assert g["annotations"]["description"].replace("$values.A.Value", "$value") == (
            rule["annotations"]["description"]), name
