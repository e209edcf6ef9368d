"""deploy/prometheus: promtool check config, check rules, test rules, and the rules' conventions."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml
from deploy_support import (
    DEPLOY,
    PROM_DIR,
    RULE_FILES,
    RULE_TESTS,
    RUNBOOK,
    alert_rules,
    github_anchor,
    load_rules_generator,
    load_yaml,
    recording_rules,
)
from prometheus_server import require_binary

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(120)]

RUNBOOK_URL = re.compile(r"^https://\S+/deploy/prometheus/runbook\.md#([a-z0-9\-_]+)$")
# Alerts the issue asks for (GitHub issue 4); each must exist and be unit-tested.
REQUIRED_ALERTS = {
    "OtelTrainMonitoringOverBudget",
    "OtelTrainMonitoringOverCritical",
    "OtelTrainMonitoringOperationTooLong",
    "OtelTrainSlowSteps",
    "OtelTrainStepStalled",
    "OtelTrainNoStepCompleted",
    "OtelTrainGPUUnderutilized",
    "OtelTrainTelemetryDropped",
    "OtelTrainTargetDown",
    "OtelTrainStraggler",  # issue 9
}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = require_binary("promtool")
    return subprocess.run(
        [binary, *args], cwd=PROM_DIR, capture_output=True, text=True, timeout=60, check=False
    )


def test_promtool_check_config() -> None:
    result = promtool("check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    # the config loads every rule file shipped in rules/
    for path in RULE_FILES:
        assert f"rules/{path.name}" in result.stdout + result.stderr


def test_promtool_check_rules() -> None:
    assert RULE_FILES, "no rule files in deploy/prometheus/rules"
    result = promtool("check", "rules", *map(str, RULE_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules() -> None:
    assert RULE_TESTS, "no promtool unit tests in deploy/prometheus/tests"
    result = promtool("test", "rules", *map(str, RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAILED" not in result.stdout + result.stderr


def test_required_alerts_exist() -> None:
    assert REQUIRED_ALERTS <= set(alert_rules())


@pytest.mark.parametrize("name", sorted(alert_rules()))
def test_alert_conventions(name: str) -> None:
    rule = alert_rules()[name]
    assert rule.get("for"), f"{name}: needs a `for`"
    assert rule["labels"]["severity"] in {"warning", "critical"}
    ann = rule["annotations"]
    assert set(ann) >= {"summary", "description", "runbook_url"}
    assert "{{" not in ann["summary"], f"{name}: summary must be static"
    assert "$labels" in ann["description"] or "$value" in ann["description"]
    m = RUNBOOK_URL.match(ann["runbook_url"])
    assert m, f"{name}: runbook_url {ann['runbook_url']!r} must point into runbook.md"
    anchors = {
        github_anchor(line.lstrip("#"))
        for line in RUNBOOK.read_text().splitlines()
        if line.startswith("#")
    }
    assert m.group(1) in anchors, f"{name}: runbook.md has no section #{m.group(1)}"
    assert m.group(1) == name.lower(), "one runbook section per alert, named after it"


def test_every_alert_is_unit_tested_before_and_at_its_for() -> None:
    """Each alert has a promtool case at `for` (firing, full labels+annotations) and one before."""
    rules = alert_rules()
    checked: dict[str, set[str]] = {name: set() for name in rules}
    for path in RULE_TESTS:
        for case in load_yaml(path)["tests"]:
            for t in case.get("alert_rule_test", []):
                name = t["alertname"]
                kind = "firing" if t.get("exp_alerts") else "quiet"
                checked.setdefault(name, set()).add(kind)
                for alert in t.get("exp_alerts") or []:
                    assert alert["exp_labels"]["severity"] == rules[name]["labels"]["severity"]
                    assert set(alert["exp_annotations"]) == set(rules[name]["annotations"])
    missing = {n: {"firing", "quiet"} - k for n, k in checked.items() if {"firing", "quiet"} - k}
    assert not missing, f"alerts without a firing and a quiet promtool case: {missing}"


def test_recording_rule_names_follow_convention() -> None:
    names = recording_rules()
    assert names
    for name in names:
        assert re.fullmatch(r"otel_train:[a-z0-9_]+:[a-z0-9_]+", name), name
    assert "otel_train:step_duration_seconds:p95_5m" in names


def test_prometheus_yml_structure() -> None:
    config = load_yaml(PROM_DIR / "prometheus.yml")
    assert config["rule_files"] == ["rules/*.yml"]
    assert config["storage"]["exemplars"]["max_exemplars"] > 0
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    train = jobs["otel-train"]
    assert train.get("metrics_path", "/metrics") == "/metrics"
    ports = []
    for sd in train["file_sd_configs"]:
        for pattern in sd["files"]:
            files = sorted(PROM_DIR.glob(pattern))
            assert files, f"file_sd pattern {pattern} matches nothing"
            for f in files:
                for group in load_yaml(f):
                    ports += [int(t.rsplit(":", 1)[1]) for t in group["targets"]]
    # one port per local rank: 9464 + local rank
    assert sorted(ports) == list(range(9464, 9464 + len(ports))) and len(ports) >= 1


def test_generated_rules_equal_committed() -> None:
    gen = load_rules_generator()
    for path, render in gen.OUTPUTS.items():
        assert path.read_text() == render(), (
            f"{path.name} differs from the generator: run python deploy/prometheus/rules_gen.py")
    assert gen.main(["--check"]) == 0


def test_threshold_defaults_are_the_libraries_option_defaults() -> None:
    """The alerts' fallback for a run without threshold gauges is what such a run would use."""
    from otel_train.common.options import RunOptions

    run = load_yaml(DEPLOY / "thresholds.yaml")["run"]
    defaults = RunOptions()
    assert run["monitoring_budget_ratio"] == defaults.budget
    assert run["monitoring_critical_ratio"] == defaults.critical
    assert run["slow_operation_seconds"] == defaults.slow_operation_seconds
    assert run["slow_step_factor"] == defaults.slow_step_factor


def test_every_threshold_number_comes_from_thresholds_yaml(tmp_path) -> None:
    """No alert hard-codes a threshold: other values in thresholds.yaml reach every alert,
    the Grafana-managed ones included."""
    data = load_yaml(DEPLOY / "thresholds.yaml")
    odd = {"run": {}, "deploy": {}}
    for section in odd:
        for i, key in enumerate(data[section]):
            odd[section][key] = 1000 + i if key.endswith("seconds") or "factor" in key else (
                round(0.0101 + i / 1000, 4))
    path = tmp_path / "thresholds.yaml"
    path.write_text(yaml.safe_dump(odd))
    code = ("import sys; sys.path[:0] = ['deploy/prometheus', 'deploy/grafana']\n"
            "import rules_gen, dashboards_gen\n"
            "print(rules_gen.render_alerts()); print('=====')\n"
            "print(dashboards_gen.render_alerting())")
    out = subprocess.run([sys.executable, "-c", code], cwd=DEPLOY.parent, capture_output=True,
                         text=True, timeout=60, env={**os.environ,
                                                     "OTEL_TRAIN_DEPLOY_THRESHOLDS": str(path)})
    assert out.returncode == 0, out.stderr
    prometheus_rules, grafana_rules = out.stdout.split("=====")
    shown_only = {"slow_step_factor", "gpu_healthy_ratio"}  # dashboard text, not alerted on
    for section in odd.values():
        for key, value in section.items():
            if key in shown_only:
                continue
            literal = f"offset {value}s" if key == "operation_lookback_seconds" else str(value)
            for text in (prometheus_rules, grafana_rules):
                assert literal in text, f"{key}={value} does not reach the alerts"
