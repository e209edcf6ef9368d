#!/usr/bin/env python3
"""Dashboards and Grafana-managed alert rules for otel-train, as code.

Writes (the committed files must equal this module's output; tests/test_deploy_grafana.py checks):
  deploy/grafana/dashboards/training-overview.json            the "Training overview" dashboard
  deploy/grafana/provisioning/alerting/otel-train-alerts.yaml  Grafana-managed alert rules

Usage:
  python deploy/grafana/dashboards_gen.py           # regenerate the files
  python deploy/grafana/dashboards_gen.py --check   # exit 1 if the committed files are stale

Plain Python (standard library, plus PyYAML for the alerting file); no Grafana SDK needed.
Metric names and labels follow the telemetry contract in DESIGN.md. Datasource uids are fixed
and must match provisioning/datasources/datasources.yaml.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DASHBOARD_PATH = HERE / "dashboards" / "training-overview.json"
ALERTING_PATH = HERE / "provisioning" / "alerting" / "otel-train-alerts.yaml"

PROMETHEUS_UID = "otel-train-prometheus"
TEMPO_UID = "otel-train-tempo"
DASHBOARD_UID = "otel-train-overview"
RUNBOOK = "https://github.com/otel-train/otel-train/blob/main/deploy/prometheus/runbook.md"

PROM = {"type": "prometheus", "uid": PROMETHEUS_UID}
TEMPO = {"type": "tempo", "uid": TEMPO_UID}

BUDGET_DEFAULT = 0.05
CRITICAL = 0.10

# Label filters shared by every query. Metrics without `rank` (budget, GPU, dropped spans) use
# the run filter only.
RUN = 'job=~"$job", instance=~"$instance"'
RANK = RUN + ', rank=~"$rank"'


# --------------------------------------------------------------------------------------------
# dashboard building blocks
# --------------------------------------------------------------------------------------------
def target(expr: str, legend: str = "", ref: str = "A", **extra: Any) -> dict[str, Any]:
    t: dict[str, Any] = {
        "datasource": PROM,
        "refId": ref,
        "expr": expr,
        "legendFormat": legend or "__auto",
        "range": True,
        "instant": False,
        "editorMode": "code",
    }
    t.update(extra)
    return t


def thresholds(*steps: tuple[float | None, str]) -> dict[str, Any]:
    return {
        "mode": "absolute",
        "steps": [{"color": color, "value": value} for value, color in steps],
    }


class Layout:
    """Places panels left to right on Grafana's 24-column grid, wrapping rows."""

    def __init__(self) -> None:
        self.x = 0
        self.y = 0
        self.row_h = 0
        self.next_id = 1
        self.panels: list[dict[str, Any]] = []

    def row(self, title: str) -> None:
        self._newline()
        self.panels.append(
            {
                "id": self._id(),
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y},
                "panels": [],
            }
        )
        self.y += 1

    def add(self, panel: dict[str, Any], w: int, h: int) -> dict[str, Any]:
        if self.x + w > 24:
            self._newline()
        panel = {"id": self._id(), **panel, "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y}}
        self.x += w
        self.row_h = max(self.row_h, h)
        self.panels.append(panel)
        return panel

    def _newline(self) -> None:
        self.y += self.row_h
        self.x = 0
        self.row_h = 0

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id - 1


def timeseries(
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    unit: str,
    *,
    stack: bool = False,
    draw: str = "line",
    steps: tuple[tuple[float | None, str], ...] = ((None, "green"),),
    threshold_lines: bool = False,
    minimum: float | None = 0,
    maximum: float | None = None,
    overrides: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "unit": unit,
        "color": {"mode": "palette-classic"},
        "thresholds": thresholds(*steps),
        "custom": {
            "drawStyle": draw,
            "lineWidth": 1,
            "fillOpacity": 60 if stack else (80 if draw == "bars" else 10),
            "showPoints": "never",
            "spanNulls": True,
            "stacking": {"mode": "normal" if stack else "none", "group": "A"},
            "thresholdsStyle": {"mode": "line+area" if threshold_lines else "off"},
        },
    }
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": PROM,
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def single(
    kind: str,
    title: str,
    description: str,
    expr: str,
    unit: str,
    steps: tuple[tuple[float | None, str], ...],
    *,
    legend: str = "",
    maximum: float | None = None,
) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit, "thresholds": thresholds(*steps), "min": 0}
    if maximum is not None:
        defaults["max"] = maximum
    defaults["color"] = {"mode": "thresholds"}
    options: dict[str, Any] = {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "orientation": "auto",
    }
    if kind == "stat":
        options.update({"colorMode": "background", "graphMode": "area", "textMode": "auto"})
    elif kind == "gauge":
        options.update({"showThresholdMarkers": True, "showThresholdLabels": False})
    elif kind == "bargauge":
        options.update({"displayMode": "gradient", "orientation": "horizontal", "showUnfilled": True})
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": PROM,
        "targets": [target(expr, legend, instant=True, range=False)],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
    }


def variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": PROM,
        "query": query,
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "sort": 3,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "hide": 0,
    }


# --------------------------------------------------------------------------------------------
# the "Training overview" dashboard
# --------------------------------------------------------------------------------------------
def step_quantile(q: float) -> str:
    return (
        f"histogram_quantile({q}, sum by (le, rank) "
        f"(rate(otel_train_step_duration_seconds_bucket{{{RANK}}}[$__rate_interval])))"
    )


def dashboard() -> dict[str, Any]:
    lay = Layout()

    # ---- at a glance ----
    lay.row("At a glance")
    lay.add(
        single(
            "stat",
            "Steps / s",
            "Training steps completed per second, all selected ranks.",
            f"sum(rate(otel_train_steps_total{{{RANK}}}[$__rate_interval]))",
            "none",
            ((None, "blue"),),
        ),
        w=4,
        h=5,
    )
    lay.add(
        single(
            "stat",
            "Monitoring overhead (run so far)",
            "Share of training wall time spent on monitoring since the run started "
            "(window=cumulative), worst selected rank. Budget 5% (warning), critical 10%.",
            f'max(otel_train_monitoring_overhead_ratio{{window="cumulative", {RANK}}})',
            "percentunit",
            ((None, "green"), (BUDGET_DEFAULT, "orange"), (CRITICAL, "red")),
        ),
        w=4,
        h=5,
    )
    lay.add(
        single(
            "stat",
            "Monitoring budget",
            "The budget the run was configured with (otel_train_monitoring_budget_ratio).",
            f"max(otel_train_monitoring_budget_ratio{{{RUN}}})",
            "percentunit",
            ((None, "text"),),
        ),
        w=4,
        h=5,
    )
    lay.add(
        single(
            "gauge",
            "Stall: current step age",
            "Age of the step running now (0 between steps), oldest selected rank. The stall "
            "alert fires above 10x the mean step time (at least 5 minutes).",
            f"max(otel_train_step_in_progress_seconds{{{RANK}}})",
            "s",
            ((None, "green"), (60, "orange"), (300, "red")),
            maximum=600,
        ),
        w=4,
        h=5,
    )
    lay.add(
        single(
            "stat",
            "Time since last step",
            "Seconds since the last completed step, most idle selected rank.",
            f"max(time() - otel_train_last_step_timestamp_seconds{{{RANK}}})",
            "s",
            ((None, "green"), (60, "orange"), (600, "red")),
        ),
        w=4,
        h=5,
    )
    lay.add(
        single(
            "stat",
            "otel-train's own cost",
            "Share of training time the instrumentation itself costs "
            "(otel_train_instrumentation_overhead_ratio), worst selected rank.",
            f"max(otel_train_instrumentation_overhead_ratio{{{RANK}}})",
            "percentunit",
            ((None, "green"), (0.01, "orange"), (0.02, "red")),
        ),
        w=4,
        h=5,
    )

    # ---- step time ----
    lay.row("Step time")
    lay.add(
        timeseries(
            "Step time p50 / p95 / max",
            "Step duration quantiles from the otel_train_step_duration_seconds histogram "
            "(max = upper bound of the highest non-empty bucket). The dots are exemplars: "
            "click one to open that step's trace in Tempo.",
            [
                target(step_quantile(0.5), "p50 rank {{rank}}", "A"),
                target(step_quantile(0.95), "p95 rank {{rank}}", "B", exemplar=True),
                target(step_quantile(1), "max rank {{rank}}", "C"),
            ],
            "s",
        ),
        w=12,
        h=9,
    )
    lay.add(
        timeseries(
            "Where a step's time goes (per phase)",
            "Mean seconds per step spent in each phase, stacked: training phases and "
            "monitoring phases (kind=monitor; amortised over all steps, so the stack adds up "
            "to the mean step time).",
            [
                target(
                    f"sum by (phase, kind) (rate(otel_train_phase_duration_seconds_sum{{{RANK}}}"
                    f"[$__rate_interval]))\n/ on () group_left ()\n"
                    f"sum(rate(otel_train_steps_total{{{RANK}}}[$__rate_interval]))",
                    "{{phase}} ({{kind}})",
                )
            ],
            "s",
            stack=True,
        ),
        w=12,
        h=9,
    )
    lay.add(
        timeseries(
            "Phase p95 per dataloader",
            "p95 duration of each training phase, per dataloader (the data phase is the time "
            "spent fetching the batch).",
            [
                target(
                    "histogram_quantile(0.95, sum by (le, loader, phase) "
                    f'(rate(otel_train_phase_duration_seconds_bucket{{kind="train", {RANK}}}'
                    "[$__rate_interval])))",
                    "{{loader}} / {{phase}}",
                )
            ],
            "s",
        ),
        w=12,
        h=8,
    )
    lay.add(
        timeseries(
            "Slow steps",
            "Steps the library flagged slow (far above the typical step time), per rank; the "
            "dashed line is the share of slow steps (the alert fires above 5% for 10 minutes).",
            [
                target(
                    f"sum by (rank) (increase(otel_train_slow_steps_total{{{RANK}}}[$__rate_interval]))",
                    "slow steps rank {{rank}}",
                    "A",
                ),
                target(
                    f"sum by (rank) (rate(otel_train_slow_steps_total{{{RANK}}}[$__rate_interval]))\n"
                    f"/ sum by (rank) (rate(otel_train_steps_total{{{RANK}}}[$__rate_interval]))",
                    "slow share rank {{rank}}",
                    "B",
                ),
            ],
            "none",
            draw="bars",
            overrides=[
                {
                    "matcher": {"id": "byFrameRefID", "options": "B"},
                    "properties": [
                        {"id": "unit", "value": "percentunit"},
                        {"id": "custom.drawStyle", "value": "line"},
                        {"id": "custom.axisPlacement", "value": "right"},
                        {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                        {"id": "custom.fillOpacity", "value": 0},
                    ],
                }
            ],
        ),
        w=12,
        h=8,
    )

    # ---- monitoring cost ----
    lay.row("Monitoring cost")
    lay.add(
        timeseries(
            "Monitoring overhead vs budget",
            "Share of training wall time spent on monitoring: over the whole run (cumulative) "
            "and over the recent steps (recent). The dashed line is the run's budget; the red "
            "area starts at the 10% critical level.",
            [
                target(
                    f"max by (rank, window) (otel_train_monitoring_overhead_ratio{{{RANK}}})",
                    "{{window}} rank {{rank}}",
                    "A",
                ),
                target(f"max(otel_train_monitoring_budget_ratio{{{RUN}}})", "budget", "B"),
            ],
            "percentunit",
            steps=((None, "transparent"), (CRITICAL, "red")),
            threshold_lines=True,
            overrides=[
                {
                    "matcher": {"id": "byName", "options": "budget"},
                    "properties": [
                        {"id": "color", "value": {"mode": "fixed", "fixedColor": "orange"}},
                        {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
                        {"id": "custom.lineWidth", "value": 2},
                        {"id": "custom.fillOpacity", "value": 0},
                    ],
                }
            ],
        ),
        w=12,
        h=9,
    )
    lay.add(
        single(
            "bargauge",
            "Cost per monitoring operation (share of training time)",
            "Share of training wall time each monitoring operation has taken "
            "(otel_train_operation_overhead_ratio), worst selected rank.",
            f"max by (operation) (otel_train_operation_overhead_ratio{{{RANK}}})",
            "percentunit",
            ((None, "green"), (BUDGET_DEFAULT / 2, "orange"), (BUDGET_DEFAULT, "red")),
            legend="{{operation}}",
            maximum=CRITICAL,
        ),
        w=6,
        h=9,
    )
    lay.add(
        timeseries(
            "Seconds per monitoring call",
            "Mean duration of one call of each monitoring operation since the run started. "
            "The red line is 30 s: a single call above it raises an alert.",
            [
                target(
                    "sum by (phase) (otel_train_phase_duration_seconds_sum"
                    f'{{kind="monitor", {RANK}}})\n/ sum by (phase) '
                    f'(otel_train_phase_duration_seconds_count{{kind="monitor", {RANK}}})',
                    "{{phase}}",
                )
            ],
            "s",
            steps=((None, "transparent"), (30, "red")),
            threshold_lines=True,
        ),
        w=6,
        h=9,
    )

    # ---- GPUs and telemetry health ----
    lay.row("GPUs and telemetry")
    lay.add(
        timeseries(
            "GPU utilization",
            "NVML utilization per GPU. Healthy training keeps it above 90%; below 70% "
            "(red) usually means the input pipeline or monitoring blocks the GPU.",
            [
                target(
                    f"avg by (instance, gpu) (otel_train_gpu_utilization_ratio{{{RUN}}})",
                    "{{instance}} gpu {{gpu}}",
                )
            ],
            "percentunit",
            steps=((None, "red"), (0.7, "transparent")),
            threshold_lines=True,
            maximum=1,
        ),
        w=8,
        h=8,
    )
    lay.add(
        timeseries(
            "GPU memory used",
            "NVML memory used per GPU.",
            [
                target(
                    f"max by (instance, gpu) (otel_train_gpu_memory_used_bytes{{{RUN}}})",
                    "{{instance}} gpu {{gpu}}",
                )
            ],
            "bytes",
        ),
        w=8,
        h=8,
    )
    lay.add(
        timeseries(
            "Dropped telemetry",
            "Spans the library dropped instead of blocking training, per reason (traces of "
            "some steps are incomplete; metrics are unaffected).",
            [
                target(
                    f"sum by (reason) (rate(otel_train_spans_dropped_total{{{RUN}}}[$__rate_interval]))",
                    "{{reason}}",
                )
            ],
            "cps",
            draw="bars",
        ),
        w=8,
        h=8,
    )

    # ---- traces ----
    lay.row("Traces")
    lay.add(
        {
            "type": "table",
            "title": "Slow steps (traces)",
            "description": "Recent train.step traces flagged slow (span attribute train.slow). "
            "Click a trace id to open it in Tempo.",
            "datasource": TEMPO,
            "targets": [
                {
                    "datasource": TEMPO,
                    "refId": "A",
                    "queryType": "traceql",
                    "query": '{ name = "train.step" && span.train.slow = true }',
                    "limit": 20,
                    "tableType": "traces",
                }
            ],
            "fieldConfig": {"defaults": {}, "overrides": []},
            "options": {"showHeader": True},
        },
        w=24,
        h=8,
    )

    return {
        "uid": DASHBOARD_UID,
        "title": "Training overview",
        "description": "otel-train: step time, where it goes, what monitoring costs, stalls, GPUs.",
        "tags": ["otel-train", "training"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "links": [],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": {
            "list": [
                variable("job", "Job", "label_values(otel_train_steps_total, job)"),
                variable(
                    "instance",
                    "Instance",
                    'label_values(otel_train_steps_total{job=~"$job"}, instance)',
                ),
                variable("rank", "Rank", f"label_values(otel_train_steps_total{{{RUN}}}, rank)"),
            ]
        },
        "panels": lay.panels,
    }


# --------------------------------------------------------------------------------------------
# Grafana-managed alert rules (same conditions as deploy/prometheus/rules/otel-train-alerts.yml,
# for teams that alert from Grafana instead of Prometheus/Alertmanager)
# --------------------------------------------------------------------------------------------
ACTIVE = "and on (job, instance, rank) increase(otel_train_steps_total[10m]) > 0"
MEAN_STEP = "(otel_train_step_duration_seconds_sum / (otel_train_step_duration_seconds_count > 0))"

GRAFANA_ALERTS: list[dict[str, Any]] = [
    {
        "uid": "otel-train-budget-warning",
        "title": "otel-train: monitoring over budget",
        "expr": (
            'otel_train_monitoring_overhead_ratio{window="cumulative"}\n'
            "  / on (job, instance) group_left () (otel_train_monitoring_budget_ratio > 0)\n"
            + ACTIVE
        ),
        "threshold": 1,
        "for": "10m",
        "severity": "warning",
        "summary": "Monitoring is using more of the training time than its budget.",
        "description": (
            "Monitoring on {{ $labels.job }}/{{ $labels.instance }} rank {{ $labels.rank }} has "
            "used {{ humanizePercentage $values.B.Value }} of the run's monitoring budget."
        ),
        "runbook": "oteltrainmonitoringoverbudget",
        "panel": "Monitoring overhead vs budget",
    },
    {
        "uid": "otel-train-budget-critical",
        "title": "otel-train: monitoring above 10% of training time",
        "expr": (
            'otel_train_monitoring_overhead_ratio{window="cumulative"}\n'
            "and on (job, instance, rank) (\n"
            '  otel_train_monitoring_overhead_ratio{window="cumulative"}\n'
            "    > on (job, instance) group_left () otel_train_monitoring_budget_ratio\n"
            ")\n" + ACTIVE
        ),
        "threshold": CRITICAL,
        "for": "10m",
        "severity": "critical",
        "summary": "Monitoring is using more than 10% of the training time.",
        "description": (
            "Monitoring has taken {{ humanizePercentage $values.B.Value }} of the training wall "
            "time of {{ $labels.job }}/{{ $labels.instance }} rank {{ $labels.rank }}."
        ),
        "runbook": "oteltrainmonitoringovercritical",
        "panel": "Monitoring overhead vs budget",
    },
    {
        "uid": "otel-train-slow-steps",
        "title": "otel-train: slow steps",
        "expr": (
            "sum by (job, instance, rank) (rate(otel_train_slow_steps_total[10m]))\n"
            "  / sum by (job, instance, rank) (rate(otel_train_steps_total[10m]))"
        ),
        "threshold": 0.05,
        "for": "10m",
        "severity": "warning",
        "summary": "More than 5% of training steps are slow.",
        "description": (
            "{{ humanizePercentage $values.B.Value }} of the steps of {{ $labels.job }}/"
            "{{ $labels.instance }} rank {{ $labels.rank }} in the last 10 minutes were slow."
        ),
        "runbook": "oteltrainslowsteps",
        "panel": "Slow steps",
    },
    {
        "uid": "otel-train-stalled",
        "title": "otel-train: training step stalled",
        # > 1 when the running step is older than max(10 x mean step time, 5 min), or than
        # 15 min before any step completed.
        "expr": (
            "otel_train_step_in_progress_seconds\n"
            f"  / on (job, instance, rank) clamp_min(10 * {MEAN_STEP}, 300)\n"
            "or\n"
            "(\n"
            "  otel_train_step_in_progress_seconds / 900\n"
            "  unless on (job, instance, rank) (otel_train_step_duration_seconds_count > 0)\n"
            ")"
        ),
        "threshold": 1,
        "for": "1m",
        "severity": "critical",
        "summary": "A training step has been running far longer than usual.",
        "description": (
            "Rank {{ $labels.rank }} of {{ $labels.job }}/{{ $labels.instance }} has been in the "
            "same step for {{ humanize $values.B.Value }}x its stall threshold "
            "(10x the mean step time, at least 5 minutes)."
        ),
        "runbook": "oteltrainstepstalled",
        "panel": "Stall: current step age",
    },
]


def _panel_id(dash: dict[str, Any], title: str) -> int:
    for panel in dash["panels"]:
        if panel["title"] == title:
            return int(panel["id"])
    raise KeyError(title)


def alerting() -> dict[str, Any]:
    dash = dashboard()
    rules = []
    for a in GRAFANA_ALERTS:
        rules.append(
            {
                "uid": a["uid"],
                "title": a["title"],
                "condition": "C",
                "data": [
                    {
                        "refId": "A",
                        "relativeTimeRange": {"from": 600, "to": 0},
                        "datasourceUid": PROMETHEUS_UID,
                        "model": {
                            "refId": "A",
                            "datasource": PROM,
                            "expr": a["expr"],
                            "instant": True,
                            "range": False,
                            "intervalMs": 15000,
                            "maxDataPoints": 43200,
                        },
                    },
                    {
                        "refId": "B",
                        "datasourceUid": "__expr__",
                        "model": {
                            "refId": "B",
                            "datasource": {"type": "__expr__", "uid": "__expr__"},
                            "type": "reduce",
                            "expression": "A",
                            "reducer": "last",
                            "settings": {"mode": "dropNN"},
                        },
                    },
                    {
                        "refId": "C",
                        "datasourceUid": "__expr__",
                        "model": {
                            "refId": "C",
                            "datasource": {"type": "__expr__", "uid": "__expr__"},
                            "type": "threshold",
                            "expression": "B",
                            "conditions": [
                                {"evaluator": {"type": "gt", "params": [a["threshold"]]}}
                            ],
                        },
                    },
                ],
                "noDataState": "OK",
                "execErrState": "Error",
                "for": a["for"],
                "annotations": {
                    "summary": a["summary"],
                    "description": a["description"],
                    "runbook_url": f"{RUNBOOK}#{a['runbook']}",
                    "__dashboardUid__": DASHBOARD_UID,
                    "__panelId__": str(_panel_id(dash, a["panel"])),
                },
                "labels": {"severity": a["severity"], "service": "otel-train"},
                "isPaused": False,
            }
        )
    return {
        "apiVersion": 1,
        "groups": [
            {"orgId": 1, "name": "otel-train", "folder": "otel-train", "interval": "1m", "rules": rules}
        ],
    }


# --------------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------------
def render_dashboard() -> str:
    return json.dumps(dashboard(), indent=2, sort_keys=False) + "\n"


def render_alerting() -> str:
    import yaml  # PyYAML (dev extra)

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: Any) -> bool:  # no &id001 anchors: plain, diffable YAML
            return True

    def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, _str)
    header = (
        "# Generated by deploy/grafana/dashboards_gen.py -- edit that file, then run it.\n"
        "# Grafana-managed alert rules for otel-train (file provisioning, Grafana >= 9.1).\n"
    )
    return header + yaml.dump(alerting(), Dumper=Dumper, sort_keys=False, width=100)


OUTPUTS = {DASHBOARD_PATH: render_dashboard, ALERTING_PATH: render_alerting}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if committed files are stale")
    args = parser.parse_args(argv)
    stale = []
    for path, render in OUTPUTS.items():
        text = render()
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("stale (run deploy/grafana/dashboards_gen.py):", *map(str, stale), sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
