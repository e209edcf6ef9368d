#!/usr/bin/env python3
"""The "Training overview" dashboard and the Grafana-managed alerts, built with Grafana's SDK.

Writes (the committed files must equal this module's output; tests/test_deploy_grafana.py checks):
  deploy/grafana/dashboards/training-overview.json            the dashboard
  deploy/grafana/provisioning/alerting/otel-train-alerts.yaml  Grafana-managed alert rules

Built on grafana-foundation-sdk (the `dev` extra): builders generated from Grafana's schemas.
Thresholds come from deploy/thresholds.yaml; the alerts are deploy/promql.py's ``ALERTS``, the
same definitions deploy/prometheus/rules_gen.py renders for Prometheus: each Grafana rule runs
the Prometheus rule's expr and fires for every series it returns, so the two cannot disagree.
Datasource uids are fixed and must match provisioning/datasources/datasources.yaml.

Usage:
  python deploy/grafana/dashboards_gen.py           # regenerate the files
  python deploy/grafana/dashboards_gen.py --check   # exit 1 if the committed files are stale
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import (
    alerting as alert_builders,
)
from grafana_foundation_sdk.builders import (
    bargauge,
    gauge,
    prometheus,
    stat,
    table,
    tempo,
    timeseries,
)
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import expr as ex
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models.alerting import RelativeTimeRange
from grafana_foundation_sdk.models.prometheus import QueryEditorMode

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # its row modules (rows_*.py), when loaded by path
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "prometheus"))
sys.path.insert(0, str(HERE))  # rows_<area>.py: a row per module
from promql import ALERTS, T, num, run_gauge, straggler_ratio  # noqa: E402
from rows_device import add_device_row  # noqa: E402
from rules_gen import dump, write_or_check  # noqa: E402
import rows_efficiency  # noqa: E402
from rows_comm import add_communication_row  # noqa: E402
from rows_scale import add_job_row  # noqa: E402

DASHBOARD_PATH = HERE / "dashboards" / "training-overview.json"
ALERTING_PATH = HERE / "provisioning" / "alerting" / "otel-train-alerts.yaml"

PROMETHEUS_UID = "otel-train-prometheus"
TEMPO_UID = "otel-train-tempo"
DASHBOARD_UID = "otel-train-overview"
PROM = dm.DataSourceRef(type_val="prometheus", uid=PROMETHEUS_UID)
TEMPO = dm.DataSourceRef(type_val="tempo", uid=TEMPO_UID)

# Label filters shared by every query. Metrics without `rank` (thresholds, GPU, dropped spans)
# use the process filter only; straggler panels filter by run (their median needs every rank).
RUN = 'job=~"$job", instance=~"$instance"'
RANK = RUN + ', rank=~"$rank"'
RUN_ID = 'run_id=~"$run_id"'

BUDGET = T.run["monitoring_budget_ratio"]
CRITICAL = T.run["monitoring_critical_ratio"]
OPERATION_LIMIT = T.run["slow_operation_seconds"]
STRAGGLER = 1 + T.deploy["straggler_slower_ratio"]


# -- building blocks ---------------------------------------------------------------------------
def q(expr: str, legend: str = "__auto", ref: str = "A", *, instant: bool = False,
      exemplar: bool = False) -> prometheus.Dataquery:
    """One PromQL target."""
    target = (prometheus.Dataquery().datasource(PROM).ref_id(ref).expr(expr)
              .legend_format(legend).editor_mode(QueryEditorMode.CODE))
    target = target.instant() if instant else target.range()
    return target.exemplar(True) if exemplar else target


def steps(*pairs: tuple[float | None, str]) -> db.ThresholdsConfig:
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=v, color=c) for v, c in pairs])


def dashed(width: int = 1) -> list[dm.DynamicConfigValue]:
    """Override properties: a dashed line without fill."""
    return [
        dm.DynamicConfigValue("custom.lineStyle", {"fill": "dash", "dash": [10, 10]}),
        dm.DynamicConfigValue("custom.lineWidth", width),
        dm.DynamicConfigValue("custom.fillOpacity", 0),
    ]


class Ids:
    """Panel ids in creation order, and a title -> id index for the alert links."""

    def __init__(self) -> None:
        self.by_title: dict[str, int] = {}

    def __call__(self, title: str) -> int:
        self.by_title[title] = len(self.by_title) + 1
        return self.by_title[title]


def series(ids: Ids, title: str, description: str, targets: list[prometheus.Dataquery],
           unit: str, *, w: int, h: int, stack: bool = False, bars: bool = False,
           red_from: float | None = None, red_below: float | None = None,
           maximum: float | None = None) -> timeseries.Panel:
    """A time series panel; ``red_from``/``red_below`` shade the alerting region."""
    panel = (timeseries.Panel().id(ids(title)).title(title).description(description)
             .datasource(PROM).unit(unit).min(0).span(w).height(h)
             .color_scheme(db.FieldColor().mode(dm.FieldColorModeId.PALETTE_CLASSIC))
             .draw_style(cm.GraphDrawStyle.BARS if bars else cm.GraphDrawStyle.LINE)
             .line_width(1).fill_opacity(60 if stack else 80 if bars else 10)
             .show_points(cm.VisibilityMode.NEVER).span_nulls(True)
             .legend(cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.TABLE)
                     .placement(cm.LegendPlacement.BOTTOM).show_legend(True)
                     .calcs(["lastNotNull", "max"]))
             .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI)
                      .sort(cm.SortOrder.DESCENDING)))
    if stack:
        panel = panel.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL).group("A"))
    if red_from is not None:
        panel = panel.thresholds(steps((None, "transparent"), (red_from, "red")))
    elif red_below is not None:
        panel = panel.thresholds(steps((None, "red"), (red_below, "transparent")))
    if red_from is not None or red_below is not None:
        panel = panel.thresholds_style(
            cb.GraphThresholdsStyleConfig().mode(cm.GraphTresholdsStyleMode.LINE_AND_AREA))
    if maximum is not None:
        panel = panel.max(maximum)
    for target in targets:
        panel = panel.with_target(target)
    return panel


def single(ids: Ids, kind: str, title: str, description: str, targets: list[prometheus.Dataquery],
           unit: str, colors: tuple[tuple[float | None, str], ...], *, w: int, h: int,
           maximum: float | None = None) -> Any:
    """A stat, gauge or bar gauge showing the last value of instant queries."""
    reduce = cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False)
    if kind == "stat":
        panel: Any = (stat.Panel().reduce_options(reduce)
                      .color_mode(cm.BigValueColorMode.BACKGROUND)
                      .graph_mode(cm.BigValueGraphMode.AREA).text_mode(cm.BigValueTextMode.AUTO))
    elif kind == "gauge":
        panel = gauge.Panel().reduce_options(reduce).show_threshold_markers(True)
    else:
        panel = (bargauge.Panel().reduce_options(reduce)
                 .display_mode(cm.BarGaugeDisplayMode.GRADIENT)
                 .orientation(cm.VizOrientation.HORIZONTAL).show_unfilled(True))
    panel = (panel.id(ids(title)).title(title).description(description).datasource(PROM)
             .unit(unit).min(0).thresholds(steps(*colors)).span(w).height(h)
             .color_scheme(db.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS)))
    if maximum is not None:
        panel = panel.max(maximum)
    for target in targets:
        panel = panel.with_target(target)
    return panel


def variable(name: str, label: str, query: str) -> db.QueryVariable:
    return (db.QueryVariable(name).label(label).datasource(PROM).query(query)
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).include_all(True)
            .all_value(".*").multi(True).sort(dm.VariableSort.NUMERICAL_ASC))


def step_quantile(quantile: float) -> str:
    return (f"histogram_quantile({quantile}, sum by (le, rank) "
            f"(rate(otel_train_step_duration_seconds_bucket{{{RANK}}}[$__rate_interval])))")


def per_step(numerator: str) -> str:
    """``numerator`` (a rate by job, instance, rank, ...) per step of the same rank."""
    return (f"{numerator}\n/ on (job, instance, rank) group_left ()\n"
            f"(sum by (job, instance, rank) (rate(otel_train_steps_total[$__rate_interval])) > 0)")


def run_threshold(gauge_name: str, default: float, compared: str) -> str:
    """The selected processes' own threshold (the alerts' value), else the default."""
    return f"max({run_gauge(gauge_name, default, compared)})"


# -- the dashboard -----------------------------------------------------------------------------
def build_dashboard() -> tuple[dm.Dashboard, dict[str, int]]:
    """The dashboard model, and panel ids by title."""
    ids = Ids()
    overhead = f'otel_train_monitoring_overhead_ratio{{window="cumulative", {RANK}}}'
    d = (db.Dashboard("Training overview").uid(DASHBOARD_UID)
         .description("otel-train: step time, where it goes, what monitoring costs, "
                      "stragglers, stalls, GPUs.")
         .tags(["otel-train", "training"]).timezone("browser").editable()
         .tooltip(dm.DashboardCursorSync.CROSSHAIR).refresh("10s").time("now-1h", "now")
         .with_variable(variable("job", "Job", "label_values(otel_train_steps_total, job)"))
         .with_variable(variable("instance", "Instance",
                                 'label_values(otel_train_steps_total{job=~"$job"}, instance)'))
         .with_variable(variable("rank", "Rank",
                                 f"label_values(otel_train_steps_total{{{RUN}}}, rank)"))
         .with_variable(variable("run_id", "Run", "label_values(otel_train_run_info, run_id)")))

    d = d.with_row(db.Row("At a glance").id(ids("At a glance")))
    d = d.with_panel(single(
        ids, "stat", "Steps / s", "Training steps completed per second, all selected ranks.",
        [q(f"sum(rate(otel_train_steps_total{{{RANK}}}[$__rate_interval]))", instant=True)],
        "none", ((None, "blue"),), w=4, h=5))
    d = d.with_panel(single(
        ids, "stat", "Monitoring overhead (run so far)",
        "Monitoring time / training time (monitoring excluded) since the run started "
        "(window=cumulative), worst selected rank. Colours: the default budget "
        f"{num(BUDGET * 100)}% and critical {num(CRITICAL * 100)}%; the alerts use each run's own.",
        [q(f"max({overhead})", instant=True)], "percentunit",
        ((None, "green"), (BUDGET, "orange"), (CRITICAL, "red")), w=4, h=5))
    thresholds = single(
        ids, "stat", "Run thresholds",
        "The thresholds the run was started with (its options, exported as gauges); the "
        "alerts compare against these. Defaults where a run does not export them.",
        [q(run_threshold("otel_train_monitoring_budget_ratio", BUDGET,
                         "otel_train_monitoring_overhead_ratio{" + RUN + "}"),
           "budget", "A", instant=True),
         q(run_threshold("otel_train_monitoring_critical_ratio", CRITICAL,
                         "otel_train_monitoring_overhead_ratio{" + RUN + "}"),
           "critical", "B", instant=True),
         q(f"max(otel_train_slow_step_factor{{{RUN}}})", "slow step x", "C", instant=True),
         q(f"max(otel_train_slow_operation_seconds{{{RUN}}})", "one call", "D", instant=True)],
        "percentunit", ((None, "text"),), w=4, h=5)
    thresholds = (thresholds.override_by_query("C", [dm.DynamicConfigValue("unit", "none")])
                  .override_by_query("D", [dm.DynamicConfigValue("unit", "s")]))
    d = d.with_panel(thresholds)
    d = d.with_panel(single(
        ids, "gauge", "Stall: current step age",
        "Age of the step running now (0 between steps), oldest selected rank. The stall alert "
        f"fires above {num(T.deploy['stall_step_factor'])}x the mean step time (at least "
        f"{num(T.deploy['stall_min_seconds'])} s).",
        [q(f"max(otel_train_step_in_progress_seconds{{{RANK}}})", instant=True)], "s",
        ((None, "green"), (60, "orange"), (T.deploy["stall_min_seconds"], "red")),
        w=4, h=5, maximum=2 * T.deploy["stall_min_seconds"]))
    d = d.with_panel(single(
        ids, "stat", "Time since last step",
        "Seconds since the last completed step, most idle selected rank.",
        [q(f"max(time() - otel_train_last_step_timestamp_seconds{{{RANK}}})", instant=True)],
        "s", ((None, "green"), (60, "orange"), (T.deploy["no_step_min_seconds"], "red")),
        w=4, h=5))
    d = d.with_panel(single(
        ids, "stat", "otel-train's own cost",
        "Share of training time the instrumentation itself costs "
        "(otel_train_instrumentation_overhead_ratio), worst selected rank.",
        [q(f"max(otel_train_instrumentation_overhead_ratio{{{RANK}}})", instant=True)],
        "percentunit", ((None, "green"), (0.01, "orange"), (0.02, "red")), w=4, h=5))

    d = d.with_row(db.Row("Step time").id(ids("Step time")))
    d = d.with_panel(series(
        ids, "Step time p50 / p95 / max",
        "Step duration quantiles from the otel_train_step_duration_seconds histogram (max = "
        "upper bound of the highest non-empty bucket). The dots are exemplars: click one to "
        "open that step's trace in Tempo.",
        [q(step_quantile(0.5), "p50 rank {{rank}}", "A"),
         q(step_quantile(0.95), "p95 rank {{rank}}", "B", exemplar=True),
         q(step_quantile(1), "max rank {{rank}}", "C")], "s", w=12, h=9))
    d = d.with_panel(series(
        ids, "Where a step's time goes (per phase)",
        "Mean seconds per step spent in each phase, stacked: training phases and monitoring "
        "phases (kind=monitor; amortised over all steps, so the stack adds up to the mean "
        "step time).",
        [q(f"sum by (phase, kind) (rate(otel_train_phase_duration_seconds_sum{{{RANK}}}"
           f"[$__rate_interval]))\n/ on () group_left ()\n"
           f"sum(rate(otel_train_steps_total{{{RANK}}}[$__rate_interval]))",
           "{{phase}} ({{kind}})")], "s", w=12, h=9, stack=True))
    d = d.with_panel(series(
        ids, "Phase p95 per dataloader",
        "p95 duration of each training phase, per dataloader (the data phase is the time "
        "spent fetching the batch).",
        [q("histogram_quantile(0.95, sum by (le, loader, phase) "
           f'(rate(otel_train_phase_duration_seconds_bucket{{kind="train", {RANK}}}'
           "[$__rate_interval])))", "{{loader}} / {{phase}}")], "s", w=12, h=8))
    slow = series(
        ids, "Slow steps",
        "Steps the library flagged slow (training time above the run's slow-step factor x "
        "the rank's baseline), per rank; the dashed line is the share of slow steps (the "
        f"alert fires above {num(T.deploy['slow_step_share_ratio'] * 100)}% for 10 minutes).",
        [q(f"sum by (rank) (increase(otel_train_slow_steps_total{{{RANK}}}[$__rate_interval]))",
           "slow steps rank {{rank}}", "A"),
         q(f"sum by (rank) (rate(otel_train_slow_steps_total{{{RANK}}}[$__rate_interval]))\n"
           f"/ sum by (rank) (rate(otel_train_steps_total{{{RANK}}}[$__rate_interval]))",
           "slow share rank {{rank}}", "B")], "none", w=12, h=8, bars=True)
    d = d.with_panel(slow.override_by_query("B", [
        dm.DynamicConfigValue("unit", "percentunit"),
        dm.DynamicConfigValue("custom.drawStyle", "line"),
        dm.DynamicConfigValue("custom.axisPlacement", "right"), *dashed()]))

    d = d.with_row(db.Row("Monitoring cost").id(ids("Monitoring cost")))
    budget_line = q(run_threshold("otel_train_monitoring_budget_ratio", BUDGET,
                                  "otel_train_monitoring_overhead_ratio{" + RUN + "}"),
                    "budget", "B")
    critical_line = q(run_threshold("otel_train_monitoring_critical_ratio", CRITICAL,
                                    "otel_train_monitoring_overhead_ratio{" + RUN + "}"),
                      "critical", "C")
    d = d.with_panel(series(
        ids, "Monitoring overhead vs budget",
        "Monitoring time / training time (monitoring excluded): over the whole run "
        "(cumulative) and over the recent steps (recent). The dashed lines are the run's own "
        "budget (warning) and critical level, as the alerts use them.",
        [q(f"max by (rank, window) (otel_train_monitoring_overhead_ratio{{{RANK}}})",
           "{{window}} rank {{rank}}", "A"), budget_line, critical_line],
        "percentunit", w=12, h=9)
        .override_by_name("budget", [
            dm.DynamicConfigValue("color", {"mode": "fixed", "fixedColor": "orange"}),
            *dashed(2)])
        .override_by_name("critical", [
            dm.DynamicConfigValue("color", {"mode": "fixed", "fixedColor": "red"}),
            *dashed(2)]))
    d = d.with_panel(single(
        ids, "bargauge", "Cost per monitoring operation (share of training time)",
        "Time each monitoring operation has taken / training time "
        "(otel_train_operation_overhead_ratio), worst selected rank.",
        [q(f"max by (operation) (otel_train_operation_overhead_ratio{{{RANK}}})",
           "{{operation}}", instant=True)], "percentunit",
        ((None, "green"), (BUDGET / 2, "orange"), (BUDGET, "red")), w=6, h=9, maximum=CRITICAL))
    d = d.with_panel(series(
        ids, "Seconds per monitoring call",
        "Mean duration of one call of each monitoring operation since the run started. The "
        "dashed line is the run's limit for a single call (slow_operation_seconds, default "
        f"{num(OPERATION_LIMIT)} s): one call above it raises an alert.",
        [q('sum by (phase) (otel_train_phase_duration_seconds_sum'
           f'{{kind="monitor", {RANK}}})\n/ sum by (phase) '
           f'(otel_train_phase_duration_seconds_count{{kind="monitor", {RANK}}})', "{{phase}}"),
         q(run_threshold("otel_train_slow_operation_seconds", OPERATION_LIMIT,
                         "otel_train_phase_duration_seconds_count{" + RUN + "}"), "limit", "B")],
        "s", w=6, h=9)
        .override_by_name("limit", [
            dm.DynamicConfigValue("color", {"mode": "fixed", "fixedColor": "red"}), *dashed(2)]))

    d = d.with_row(db.Row("Stragglers").id(ids("Stragglers")))
    ratio = straggler_ratio("$__rate_interval", run=RUN_ID)
    d = d.with_panel(series(
        ids, "Own work per rank vs run median",
        "Each rank's own work per step (training time minus the time it waited in collectives; "
        "step time minus monitoring where no collective is timed) / the median over all ranks "
        "of its run (1 = the median rank). Own work, since under DDP every rank's step lasts "
        "as long as the slowest rank's. The red area starts at the straggler "
        f"alert's {num(STRAGGLER)} (a rank {num(T.deploy['straggler_slower_ratio'] * 100)}% "
        "slower for 10 minutes). Filter: the Run variable (the median needs every rank).",
        [q(ratio, "run {{run_id}} rank {{rank}}")], "none", w=12, h=9, red_from=STRAGGLER))
    phase = ("sum by (job, instance, rank, phase) (rate(otel_train_phase_duration_seconds_sum"
             '{kind="train"}[$__rate_interval]))')
    phase_per_step = (f"(\n{per_step(phase)}\n)\n* on (job, instance, rank) group_left (run_id) "
                      f"otel_train_run_info{{{RUN_ID}}}")
    d = d.with_panel(series(
        ids, "Slowest rank: where its step time goes",
        "Seconds per step in each training phase of the slowest rank of each run (highest "
        "ratio on the left), against the median over the run's ranks of the same phase "
        "(dashed): the phase far above its median is what makes the rank slow. With "
        "synchronous collectives the other ranks' wait shows up in the phase holding the "
        "collective (usually backward).",
        [q(f"{phase_per_step}\nand on (run_id, rank)\ntopk by (run_id) (1,\n{ratio}\n)",
           "slowest: run {{run_id}} rank {{rank}} {{phase}}", "A"),
         q(f"quantile by (run_id, phase) (0.5,\n{phase_per_step}\n)",
           "median: run {{run_id}} {{phase}}", "B")], "s", w=12, h=9)
        .override_by_query("B", dashed()))

    d = add_communication_row(d, ids, series, q, per_step, RANK)
    d = d.with_row(db.Row("GPUs and telemetry").id(ids("GPUs and telemetry")))
    d = d.with_panel(series(
        ids, "GPU utilization",
        f"NVML utilization per GPU. Healthy training keeps it above "
        f"{num(T.deploy['gpu_healthy_ratio'] * 100)}%; below "
        f"{num(T.deploy['gpu_underused_ratio'] * 100)}% (red) usually means the input pipeline "
        "or monitoring blocks the GPU.",
        [q(f"avg by (instance, gpu) (otel_train_gpu_utilization_ratio{{{RUN}}})",
           "{{instance}} gpu {{gpu}}")], "percentunit", w=8, h=8,
        red_below=T.deploy["gpu_underused_ratio"], maximum=1))
    d = d.with_panel(series(
        ids, "GPU memory used", "NVML memory used per GPU.",
        [q(f"max by (instance, gpu) (otel_train_gpu_memory_used_bytes{{{RUN}}})",
           "{{instance}} gpu {{gpu}}")], "bytes", w=8, h=8))
    d = d.with_panel(series(
        ids, "Dropped telemetry",
        "Spans the library dropped instead of blocking training, per reason (traces of some "
        "steps are incomplete; metrics are unaffected).",
        [q(f"sum by (reason) (rate(otel_train_spans_dropped_total{{{RUN}}}[$__rate_interval]))",
           "{{reason}}")], "cps", w=8, h=8, bars=True))

    d = add_device_row(d, ids, series, q, RUN, RANK)
    d = rows_efficiency.add_efficiency_row(
        d, ids, rows_efficiency.Blocks(q, series, single, dashed, RANK))
    d = add_job_row(d, ids, series=series, single=single, q=q, db=db)
    d = d.with_row(db.Row("Traces").id(ids("Traces")))
    title = "Slow steps (traces)"
    d = d.with_panel(
        table.Panel().id(ids(title)).title(title)
        .description("Recent train.step traces flagged slow (span attribute train.slow). "
                     "Click a trace id to open it in Tempo.")
        .datasource(TEMPO).span(24).height(8).show_header(True)
        .with_target(tempo.TempoQuery().datasource(TEMPO).ref_id("A").query_type("traceql")
                     .query('{ name = "train.step" && span.train.slow = true }').limit(20)))
    return d.build(), ids.by_title


def dashboard() -> dict[str, Any]:
    """The dashboard as JSON data."""
    model, _ = build_dashboard()
    return json.loads(json.dumps(model, cls=JSONEncoder))


# -- Grafana-managed alerts: the Prometheus alerts' own expressions ----------------------------
def alerting_rules() -> list[dict[str, Any]]:
    """One Grafana rule per Prometheus alert: A = its expr (instant), C = "A returned a series"."""
    _, panel_ids = build_dashboard()
    rules = []
    for a in ALERTS:
        rule = (
            alert_builders.Rule(a.title).uid(a.uid).condition("C")
            .with_query(alert_builders.Query("A").datasource_uid(PROMETHEUS_UID)
                        .relative_time_range(RelativeTimeRange(from_val=600, to=0))
                        .model(prometheus.Dataquery().datasource(PROM).ref_id("A")
                               .expr(a.expr).instant()))
            # Prometheus fires for every series the expr returns; so does this condition.
            .with_query(alert_builders.Query("C").datasource_uid("__expr__")
                        .model(ex.TypeMath().ref_id("C").expression(
                            "is_number($A) || is_nan($A) || is_inf($A)")))
            .no_data_state("OK").exec_err_state("Error").for_val(a.for_)
            .labels({"severity": a.severity, "service": "otel-train"})
            .annotations({
                "summary": a.summary,
                "description": a.description_for("$values.A.Value"),
                "runbook_url": a.runbook_url,
                "__dashboardUid__": DASHBOARD_UID,
                "__panelId__": str(panel_ids[a.panel]),
            })
            .is_paused(False)
        )
        data = json.loads(json.dumps(rule.build(), cls=JSONEncoder))
        # The SDK models the HTTP API; file provisioning names folder and group on the group.
        for api_only in ("folderUID", "ruleGroup", "orgID"):
            data.pop(api_only, None)
        rules.append(data)
    return rules


def alerting() -> dict[str, Any]:
    """The provisioning file's content."""
    return {"apiVersion": 1, "groups": [{"orgId": 1, "name": "otel-train", "folder": "otel-train",
                                         "interval": "1m", "rules": alerting_rules()}]}


def render_dashboard() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def render_alerting() -> str:
    header = (
        "# Generated by deploy/grafana/dashboards_gen.py from deploy/promql.py and\n"
        "# deploy/thresholds.yaml -- edit those, then run it. Grafana-managed alert rules for\n"
        "# otel-train (file provisioning, Grafana >= 9.1): the Prometheus rules' own exprs.\n"
    )
    return header + dump(alerting())


OUTPUTS = {DASHBOARD_PATH: render_dashboard, ALERTING_PATH: render_alerting}


def main(argv: list[str] | None = None) -> int:
    return write_or_check(OUTPUTS, argv, "deploy/grafana/dashboards_gen.py")


if __name__ == "__main__":
    sys.exit(main())
