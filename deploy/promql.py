"""PromQL building blocks and the alert definitions shared by both generators.

The Prometheus rules (deploy/prometheus/rules_gen.py) and the Grafana-managed alerts
(deploy/grafana/dashboards_gen.py) are both rendered from ``ALERTS`` below, so the two cannot
disagree: a Grafana rule runs exactly the Prometheus rule's ``expr`` and fires for every series
it returns. Every number comes from deploy/thresholds.yaml.

Run-level thresholds are the run's own gauges (``otel_train_monitoring_budget_ratio``,
``otel_train_monitoring_critical_ratio``, ``otel_train_slow_operation_seconds``), falling back to
the thresholds.yaml default for a process that does not export them.

Usage::

    from promql import ALERTS, T, own_work_seconds_per_step, training_seconds_per_step
    ALERTS[0].expr            # PromQL of OtelTrainMonitoringOverBudget
    T.deploy["straggler_slower_ratio"]
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parent
# Another file only to try other values (tests/test_deploy_rules.py does).
THRESHOLDS_PATH = Path(os.environ.get("OTEL_TRAIN_DEPLOY_THRESHOLDS", DEPLOY / "thresholds.yaml"))
RUNBOOK_URL = "https://github.com/otel-train/otel-train/blob/main/deploy/prometheus/runbook.md"


@dataclass(frozen=True)
class Thresholds:
    """deploy/thresholds.yaml: ``run`` (gauge fallbacks) and ``deploy`` (fixed) values."""

    run: dict[str, float]
    deploy: dict[str, float]


def load_thresholds(path: Path = THRESHOLDS_PATH) -> Thresholds:
    """Read thresholds.yaml (every value a number)."""
    data = yaml.safe_load(path.read_text())
    for section in ("run", "deploy"):
        for key, value in data[section].items():
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ValueError(f"{path}: {section}.{key} must be a number, got {value!r}")
    return Thresholds(run=dict(data["run"]), deploy=dict(data["deploy"]))


T = load_thresholds()


def num(value: float) -> str:
    """A threshold as PromQL writes it (30, not 30.0; 0.05)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def dur(seconds: float) -> str:
    """Seconds as a PromQL duration (900 -> 15m)."""
    s = int(seconds)
    return f"{s // 60}m" if s % 60 == 0 else f"{s}s"


def sel(*matchers: str) -> str:
    """``{a, b}`` for the non-empty matchers, or nothing."""
    parts = [m for m in matchers if m]
    return "{" + ", ".join(parts) + "}" if parts else ""


def indent(text: str, spaces: int) -> str:
    return textwrap.indent(text, " " * spaces)


# -- per-run thresholds: the run's gauge, else the default -------------------------------------
def run_gauge(gauge: str, default: float, compared: str) -> str:
    """The process's ``gauge``, or ``default`` for each process (job, instance) that exports
    the ``compared`` metric but not the gauge."""
    return (f"(\n  max by (job, instance) ({gauge})\n"
            f"  or on (job, instance) group by (job, instance) ({compared}) * {num(default)}\n)")


BUDGET = run_gauge("otel_train_monitoring_budget_ratio", T.run["monitoring_budget_ratio"],
                   "otel_train_monitoring_overhead_ratio")
# Without its own critical gauge a run is critical above the default, but never below its budget
# (a run configured with budget=0.2 is not critical at 15%).
CRITICAL = (
    "(\n  max by (job, instance) (otel_train_monitoring_critical_ratio)\n"
    f"  or on (job, instance)\n  clamp_min(\n{indent(BUDGET, 4)},\n"
    f"    {num(T.run['monitoring_critical_ratio'])}\n  )\n)"
)
# The run's operation limit as a bucket bound: count_values turns the gauge's value into an `le`
# label (30 -> "30"; the client writes bounds as "30.0", hence the label_replace). otel-train
# makes the limit one of its phase histogram's bounds, so that bucket always exists.
OPERATION_LIMIT_LE = (
    "(\n"
    '  label_replace(count_values by (job, instance) ("le", max by (job, instance) '
    '(otel_train_slow_operation_seconds)), "le", "$1.0", "le", "([0-9]+)")\n'
    "  or on (job, instance)\n"
    '  label_replace(group by (job, instance) (otel_train_phase_duration_seconds_count), '
    f'"le", "{num(T.run["slow_operation_seconds"])}.0", "", "")\n'
    ")"
)


# -- training time per step, per rank, and relative to its run's median ------------------------
def _rate_sum(metric: str, window: str, by: str, *matchers: str) -> str:
    return f"sum by ({by}) (rate({metric}{sel(*matchers)}[{window}]))"


def _ranked_rate_sum(metric: str, window: str, *matchers: str) -> str:
    """Per rank, from a histogram that may lack ``rank`` (metrics_rank_label="gauges"): each
    (job, instance) is one rank, named by its otel_train_steps_total (always rank-labelled)."""
    return (f"sum by (job, instance, rank) (\n  rate({metric}{sel(*matchers)}[{window}])\n"
            "  * on (job, instance) group_left (rank)\n"
            "    group by (job, instance, rank) (otel_train_steps_total)\n)")


def monitoring_seconds_rate(window: str, *matchers: str) -> str:
    """Monitoring seconds per second. A validation loader's `data` phase nests inside a
    monitoring phase (kind="monitor") and is left out so it is not counted twice."""
    return _ranked_rate_sum("otel_train_phase_duration_seconds_sum", window,
                            'kind="monitor"', 'phase!="data"', *matchers)


def training_seconds_rate(window: str, *matchers: str) -> str:
    """Training seconds per second: step time minus monitoring (0 when a rank has none)."""
    step = _ranked_rate_sum("otel_train_step_duration_seconds_sum", window, *matchers)
    mon = monitoring_seconds_rate(window, *matchers)
    return f"(\n  {step}\n  - ({mon} or {step} * 0)\n)"


def training_seconds_per_step(window: str, *matchers: str, run: str = "") -> str:
    """Per rank, labelled with its run_id (joined from otel_train_run_info)."""
    steps = _rate_sum("otel_train_steps_total", window, "job, instance, rank", *matchers)
    return (f"(\n{indent(training_seconds_rate(window, *matchers), 2)}\n"
            f"  / ({steps} > 0)\n)\n"
            f"* on (job, instance, rank) group_left (run_id) otel_train_run_info{sel(run)}")


def own_work_seconds_per_step(window: str, *matchers: str, run: str = "") -> str:
    """Per rank, labelled with its run_id: own work per step (training time minus the time
    waited in collectives, otel_train_own_work_seconds_total); training time per step for a
    process that does not export own work."""
    steps = _rate_sum("otel_train_steps_total", window, "job, instance, rank", *matchers)
    own = _rate_sum("otel_train_own_work_seconds_total", window, "job, instance, rank",
                    *matchers)
    return (f"(\n  {own}\n  / ({steps} > 0)\n"
            f"  or\n{indent(training_seconds_rate(window, *matchers), 2)}\n"
            f"  / ({steps} > 0)\n)\n"
            f"* on (job, instance, rank) group_left (run_id) otel_train_run_info{sel(run)}")


def straggler_ratio(window: str, run: str = "") -> str:
    """Each rank's own work per step / the median over all ranks of its run. Own work, not
    step time: under DDP every rank's step lasts as long as the slowest rank's (the gradient
    all-reduce waits for it), so step times are even and only own work tells ranks apart."""
    return ratio_to_run_median(own_work_seconds_per_step(window, run=run))


def ratio_to_run_median(per_rank: str) -> str:
    """A per-rank series labelled with run_id / its median over all ranks of the run."""
    return (f"(\n{indent(per_rank, 2)}\n)\n/ on (run_id) group_left ()\n"
            f"quantile by (run_id) (0.5,\n{indent(per_rank, 2)}\n)")


def overhead_ratio(window: str, *matchers: str) -> str:
    """Monitoring seconds / training seconds (monitoring excluded), from the histograms."""
    mon = monitoring_seconds_rate(window, *matchers)
    step = _ranked_rate_sum("otel_train_step_duration_seconds_sum", window, *matchers)
    return f"{mon}\n  / (({step} - {mon}) > 0)"


# -- the alerts ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Alert:
    """One alert, rendered both as a Prometheus rule and as a Grafana-managed rule."""

    name: str           # Prometheus alertname; runbook section
    uid: str            # Grafana rule uid
    title: str          # Grafana rule title
    comment: str        # why, above the Prometheus rule
    expr: str           # the condition: every series it returns is an alert
    for_: str
    severity: str
    summary: str
    description: str    # Go template; VALUE stands for the alert's value
    panel: str          # dashboard panel the Grafana rule links to

    def description_for(self, value: str) -> str:
        """``$value`` (Prometheus) or ``$values.A.Value`` (Grafana)."""
        return self.description.replace("VALUE", value)

    @property
    def runbook_url(self) -> str:
        return f"{RUNBOOK_URL}#{self.name.lower()}"


_D = T.deploy
_STEPPING = "and on (job, instance, rank)\n  increase(otel_train_steps_total[10m]) > 0"
_MEAN_STEP = ("(otel_train_step_duration_seconds_sum / "
              "(otel_train_step_duration_seconds_count > 0))")
_WHO = "{{ $labels.job }}/{{ $labels.instance }} rank {{ $labels.rank }}"

# A step in progress far older than usual (OtelTrainStepStalled, before the phase is joined).
_STALLED = (
    "otel_train_step_in_progress_seconds\n  > on (job, instance) group_left ()\n"
    f"    clamp_min({num(_D['stall_step_factor'])} * {_MEAN_STEP}, "
    f"{num(_D['stall_min_seconds'])})\nor\n(\n"
    f"  otel_train_step_in_progress_seconds > {num(_D['stall_first_step_seconds'])}\n"
    "  unless on (job, instance) (otel_train_step_duration_seconds_count > 0)\n)")

def _op_over_limit(offset: str = "") -> str:
    count = ('sum by (job, instance, rank, phase) '
             f'(otel_train_phase_duration_seconds_count{{kind="monitor"}}{offset})')
    under = ('sum by (job, instance, rank, phase) (\n'
             f'  otel_train_phase_duration_seconds_bucket{{kind="monitor"}}{offset}\n'
             f'  and on (job, instance, le)\n{indent(OPERATION_LIMIT_LE, 2)}\n)')
    return f"{count}\n- {under}"


_LOOKBACK = f" offset {dur(_D['operation_lookback_seconds'])}"


# -- efficiency (throughput, MFU, goodput): each run against its own recent past -----------------
_EFFICIENCY_OFFSET = "10m"  # the baseline ends here: a drop stays out of its own baseline
# tokens and samples per second, one series each, told apart by the `throughput` label
THROUGHPUT = ('label_replace({__name__=~"otel_train_(tokens|samples)_per_second"}, '
              '"throughput", "$1", "__name__", "otel_train_(tokens|samples)_per_second")')
MFU_STEP = 'otel_train_mfu_ratio{basis="step"}'


def efficiency_baseline(expr: str) -> str:
    """``expr``'s mean over the baseline window, ending 10 minutes ago, per series."""
    return (f"avg_over_time(({expr})[{dur(_D['efficiency_baseline_seconds'])}:1m] "
            f"offset {_EFFICIENCY_OFFSET})")


def below_baseline(expr: str, drop_key: str) -> str:
    """Series of ``expr`` more than the threshold's share below their own baseline."""
    return (f"{expr}\n  < (1 - {num(_D[drop_key])}) * {efficiency_baseline(expr)}\n"
            f"{_STEPPING}")


def job_seconds(*matchers: str) -> str:
    """The job's wall time so far per rank (every part of otel_train_job_seconds_total)."""
    return f"sum by (job, instance, rank) (otel_train_job_seconds_total{sel(*matchers)})"

ALERTS: list[Alert] = [
    Alert(
        "OtelTrainMonitoringOverBudget", "otel-train-budget-warning",
        "otel-train: monitoring over budget",
        "Overhead = monitoring time / training time (monitoring excluded), over the whole run so\n"
        "far (window=cumulative: smooth, periodic evaluations do not make it flap), against the\n"
        "run's own budget gauge. Only while the run is stepping: an idle process keeps its ratio.",
        f'otel_train_monitoring_overhead_ratio{{window="cumulative"}}\n'
        f"  > on (job, instance) group_left ()\n{indent(BUDGET, 4)}\n{_STEPPING}",
        "10m", "warning",
        "Monitoring is using more of the training time than its budget.",
        "Monitoring has cost {{ humanizePercentage VALUE }} of the training time (monitoring "
        f"excluded) of {_WHO} so far, above the run's budget.",
        "Monitoring overhead vs budget",
    ),
    Alert(
        "OtelTrainMonitoringOverCritical", "otel-train-budget-critical",
        "otel-train: monitoring above the critical level",
        "As above, against the run's critical gauge (default 10%, never below the budget).",
        f'otel_train_monitoring_overhead_ratio{{window="cumulative"}}\n'
        f"  > on (job, instance) group_left ()\n{indent(CRITICAL, 4)}\n{_STEPPING}",
        "10m", "critical",
        "Monitoring is using more of the training time than the run's critical level.",
        "Monitoring has cost {{ humanizePercentage VALUE }} of the training time (monitoring "
        f"excluded) of {_WHO} so far, above the run's critical level. Training is paying "
        "heavily for evaluation hooks.",
        "Monitoring overhead vs budget",
    ),
    Alert(
        "OtelTrainMonitoringOperationTooLong", "otel-train-operation-too-long",
        "otel-train: one monitoring call too long",
        "A single monitoring call (phase of kind \"monitor\") longer than the run's limit, in the\n"
        "last 15 minutes: calls above the limit's bucket now, compared with 15 minutes ago (or 0\n"
        "for a younger series, so the very first call counts too).",
        f"(\n{indent(_op_over_limit(), 2)}\n)\n>\n(\n"
        f"  (\n{indent(_op_over_limit(_LOOKBACK), 4)}\n  )\n  or\n"
        '  sum by (job, instance, rank, phase) (otel_train_phase_duration_seconds_count'
        '{kind="monitor"}) * 0\n)',
        "1m", "warning",
        "A single monitoring operation took longer than the run's limit.",
        'Monitoring operation "{{ $labels.phase }}" on ' + _WHO + " ran longer than the run's "
        "slow_operation_seconds in the last 15 minutes; training waits for it "
        "({{ VALUE }} such calls in this run so far).",
        "Seconds per monitoring call",
    ),
    Alert(
        "OtelTrainSlowSteps", "otel-train-slow-steps", "otel-train: slow steps",
        "The library flags a step slow when its training time is far above the rank's baseline\n"
        "(the run's slow_step_factor); a sustained share of them is the alert.",
        "sum by (job, instance, rank) (rate(otel_train_slow_steps_total[10m]))\n"
        "  / sum by (job, instance, rank) (rate(otel_train_steps_total[10m]))\n"
        f"> {num(_D['slow_step_share_ratio'])}",
        "10m", "warning",
        f"More than {num(_D['slow_step_share_ratio'] * 100)}% of training steps are slow.",
        "{{ humanizePercentage VALUE }} of the steps of " + _WHO + " in the last 10 minutes "
        "were flagged slow (training time far above the rank's typical step).",
        "Slow steps",
    ),
    Alert(
        "OtelTrainStraggler", "otel-train-straggler", "otel-train: straggler rank",
        "Own work per step of each rank (training time minus the time waited in collectives;\n"
        "training time where a process exports no own work) against the median over all ranks\n"
        "of the same run (run_id from otel_train_run_info), 5-minute rates. Not step time: under\n"
        "DDP the all-reduce makes every rank's step as long as the slowest rank's.\n"
        "Computed here from every rank's series: no collective in training.",
        f"(\n{indent(straggler_ratio('5m'), 2)}\n) - 1\n"
        f"> {num(_D['straggler_slower_ratio'])}",
        "10m", "warning",
        "One rank trains slower than the other ranks of its run.",
        "Rank {{ $labels.rank }} ({{ $labels.job }}/{{ $labels.instance }}) of run "
        "{{ $labels.run_id }} needs {{ humanizePercentage VALUE }} more own work per step "
        "(training time minus waits in collectives) than the run's median rank; every rank "
        "waits for it at the next collective.",
        "Own work per rank vs run median",
    ),
    Alert(
        "OtelTrainStepStalled", "otel-train-stalled", "otel-train: training step stalled",
        f"The step running now is far older than usual: {num(_D['stall_step_factor'])}x the mean "
        f"step time and at least\n{num(_D['stall_min_seconds'])} s; before any step completed "
        f"(compilation, first batch), {num(_D['stall_first_step_seconds'])} s. Labelled with\n"
        "the phase running (otel_train_step_phase_in_progress_seconds), when the run exports it.",
        f"(\n{indent(_STALLED, 2)}\n)\n"
        "+ on (job, instance, rank) group_left (phase)\n"
        "  (0 * otel_train_step_phase_in_progress_seconds)\n"
        f"or\n(\n{indent(_STALLED, 2)}\n)\n"
        "unless on (job, instance, rank) otel_train_step_phase_in_progress_seconds",
        "1m", "critical",
        "A training step has been running far longer than usual.",
        "Rank {{ $labels.rank }} of {{ $labels.job }}/{{ $labels.instance }} has been inside "
        "the same training step for {{ humanizeDuration VALUE }}"
        '{{ if $labels.phase }}, in phase "{{ $labels.phase }}"{{ end }}, far longer than its '
        "usual step time. The run looks stalled; each rank's stacks are in its run "
        "directory's stalls/ folder.",
        "Stall: current step age",
    ),
    Alert(
        "OtelTrainNoStepCompleted", "otel-train-no-step", "otel-train: no step completed",
        "No step completed for a long time while no step is in progress: stuck between steps\n"
        "(checkpointing, evaluation outside the loop) or the loop ended but the process lives on.",
        "(\n  time() - otel_train_last_step_timestamp_seconds\n"
        "    > on (job, instance, rank)\n"
        f"      clamp_min({num(_D['no_step_factor'])} * {_MEAN_STEP}, "
        f"{num(_D['no_step_min_seconds'])})\n)\n"
        "and on (job, instance, rank) (otel_train_last_step_timestamp_seconds > 0)\n"
        "unless on (job, instance, rank) (otel_train_step_in_progress_seconds > 0)",
        "5m", "critical",
        "No training step has completed for a long time.",
        "Rank {{ $labels.rank }} of {{ $labels.job }}/{{ $labels.instance }} completed its last "
        "step {{ humanizeDuration VALUE }} ago and is not inside a step now.",
        "Time since last step",
    ),
    Alert(
        "OtelTrainGPUUnderutilized", "otel-train-gpu-underutilized",
        "otel-train: GPU under-utilized",
        "Mean NVML utilization over 10 minutes while the process trains.",
        f"avg_over_time(otel_train_gpu_utilization_ratio[10m]) < {num(_D['gpu_underused_ratio'])}\n"
        "and on (job, instance)\n"
        "  sum by (job, instance) (rate(otel_train_steps_total[5m])) > 0",
        "15m", "warning",
        "A GPU is under-utilized while the model trains.",
        "GPU {{ $labels.gpu }} of {{ $labels.job }}/{{ $labels.instance }} averaged "
        "{{ humanizePercentage VALUE }} utilization over the last 10 minutes while training "
        f"(healthy is above {num(_D['gpu_healthy_ratio'] * 100)}%; below "
        f"{num(_D['gpu_underused_ratio'] * 100)}% usually means the input pipeline or "
        "monitoring blocks the GPU).",
        "GPU utilization",
    ),
    Alert(
        "OtelTrainTelemetryDropped", "otel-train-telemetry-dropped",
        "otel-train: spans dropped",
        "The library drops spans instead of blocking training; traces of some steps are\n"
        "incomplete.",
        "sum by (job, instance, reason) (increase(otel_train_spans_dropped_total[10m])) > 0",
        "5m", "warning",
        "otel-train is dropping spans.",
        "{{ $labels.job }}/{{ $labels.instance }} dropped {{ humanize VALUE }} spans in the last "
        "10 minutes (reason: {{ $labels.reason }}); traces of some steps are incomplete or "
        "missing. Metrics are not affected.",
        "Dropped telemetry",
    ),
    Alert(
        "OtelTrainTargetDown", "otel-train-target-down", "otel-train: metrics endpoint down",
        "Only targets that were up in the last 30 minutes: ports of ranks that never ran stay\n"
        "quiet. A run that ends normally also takes its endpoint down (see the runbook).",
        'up{job=~"otel-train.*"} == 0\nand on (job, instance)\n'
        '  max_over_time(up{job=~"otel-train.*"}[30m]) == 1',
        "2m", "warning",
        "A training process's metrics endpoint is down.",
        "Prometheus cannot scrape {{ $labels.job }}/{{ $labels.instance }}, which was up in the "
        "last 30 minutes: the training process crashed, hangs hard, or ended.",
        "Time since last step",
    ),
    Alert(
        "OtelTrainThroughputBelowBaseline", "otel-train-throughput-drop",
        "otel-train: throughput below the run's baseline",
        "Tokens or samples per second of a rank more than the threshold's share below the same\n"
        "series' mean over the baseline window (ending 10 minutes ago), while the rank steps.",
        below_baseline(THROUGHPUT, "throughput_drop_ratio"),
        "10m", "warning",
        "A rank's throughput dropped well below its own recent baseline.",
        "{{ $labels.throughput }} per second of " + _WHO + " is {{ humanize VALUE }}, more "
        f"than {num(_D['throughput_drop_ratio'] * 100)}% below its mean over the "
        f"{dur(_D['efficiency_baseline_seconds'])} before the last 10 minutes.",
        "Throughput per rank",
    ),
    Alert(
        "OtelTrainMFUBelowBaseline", "otel-train-mfu-drop",
        "otel-train: MFU below the run's baseline",
        "Model FLOPs utilization over the whole step (basis=\"step\") more than the threshold's\n"
        "share below its own mean over the baseline window (ending 10 minutes ago).",
        below_baseline(MFU_STEP, "mfu_drop_ratio"),
        "10m", "warning",
        "A rank's MFU dropped well below its own recent baseline.",
        "MFU of " + _WHO + " is {{ humanizePercentage VALUE }}, more than "
        f"{num(_D['mfu_drop_ratio'] * 100)}% below its mean over the "
        f"{dur(_D['efficiency_baseline_seconds'])} before the last 10 minutes.",
        "MFU per rank",
    ),
    Alert(
        "OtelTrainGoodputLow", "otel-train-goodput-low", "otel-train: goodput under its floor",
        "Time in training steps / the job's wall time (every attempt so far) under the floor,\n"
        "once the job has run long enough for its start-up not to dominate the figure.",
        f"otel_train_goodput_ratio < {num(_D['goodput_floor_ratio'])}\n"
        f"and on (job, instance, rank)\n  {job_seconds()} > "
        f"{num(_D['goodput_min_job_seconds'])}",
        "10m", "warning",
        "Too little of the job's wall time goes into training steps.",
        "Only {{ humanizePercentage VALUE }} of the job's wall time on " + _WHO + " went into "
        "training steps; otel_train_job_seconds_total by part says where the rest went "
        "(start-up, checkpoints, evaluation, restarts).",
        "Where the job's time went",
    ),
]


def alert(name: str) -> Alert:
    """The alert called ``name``."""
    for a in ALERTS:
        if a.name == name:
            return a
    raise KeyError(name)


def as_dict(a: Alert) -> dict[str, Any]:
    """The Prometheus rule."""
    return {
        "alert": a.name,
        "expr": a.expr + "\n",
        "for": a.for_,
        "labels": {"severity": a.severity},
        "annotations": {
            "summary": a.summary,
            "description": a.description_for("$value"),
            "runbook_url": a.runbook_url,
        },
    }
