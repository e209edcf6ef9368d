"""Shared helpers for the tests of deploy/ (paths, YAML loading, dashboard query extraction)."""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
PROM_DIR = DEPLOY / "prometheus"
RULES_DIR = PROM_DIR / "rules"
RULE_FILES = sorted(RULES_DIR.glob("*.yml"))
RULE_TESTS = sorted((PROM_DIR / "tests").glob("*.yml"))
RUNBOOK = PROM_DIR / "runbook.md"
GRAFANA = DEPLOY / "grafana"
PROVISIONING = GRAFANA / "provisioning"
DASHBOARD_FILES = sorted((GRAFANA / "dashboards").glob("*.json"))
GENERATOR = GRAFANA / "dashboards_gen.py"
RULES_GENERATOR = PROM_DIR / "rules_gen.py"

# What the dashboard's template variables and Grafana's interval macros become when a panel
# query is sent to Prometheus directly.
MACROS = {
    "$__rate_interval": "1m",
    "$__interval": "15s",
    "$__range": "5m",
    "$__range_s": "300",
    "$__interval_ms": "15000",
}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_rules_generator() -> ModuleType:
    """deploy/prometheus/rules_gen.py as a module."""
    spec = importlib.util.spec_from_file_location("otel_train_rules_gen", RULES_GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("otel_train_dashboards_gen", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_dashboard(path: Path | None = None) -> dict[str, Any]:
    return json.loads((path or DASHBOARD_FILES[0]).read_text())


def iter_panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including panels nested in (collapsed) rows."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def panel_targets(dashboard: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(panel, target) for every query of every non-row panel."""
    for panel in iter_panels(dashboard):
        if panel.get("type") == "row":
            continue
        for tgt in panel.get("targets", []):
            yield panel, tgt


def datasource_type(panel: dict[str, Any], tgt: dict[str, Any]) -> str:
    ds = tgt.get("datasource") or panel.get("datasource") or {}
    return str(ds.get("type", ""))


def variables(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return list(dashboard.get("templating", {}).get("list", []))


def substitute(expr: str, dashboard: dict[str, Any]) -> str:
    """Replace Grafana macros and this dashboard's variables (as "All": the allValue regex)."""
    for macro in sorted(MACROS, key=len, reverse=True):
        expr = expr.replace(macro, MACROS[macro])
    for var in variables(dashboard):
        value = var.get("allValue") or ".*"
        name = re.escape(var["name"])
        expr = re.sub(r"\$\{" + name + r"(:[a-z]+)?\}|\$" + name + r"\b", value, expr)
    return expr


def prometheus_queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, refId, PromQL ready for Prometheus) for every Prometheus panel query."""
    out = []
    for panel, tgt in panel_targets(dashboard):
        if datasource_type(panel, tgt) == "prometheus":
            out.append((panel["title"], tgt.get("refId", "?"), substitute(tgt["expr"], dashboard)))
    return out


def variable_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(variable name, PromQL) for each `label_values(selector, label)` query variable."""
    out = []
    for var in variables(dashboard):
        if var.get("type") != "query":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", query)
        assert m, f"variable {var['name']}: unsupported query {query!r}"
        selector, label = m.groups()
        out.append((var["name"], f"count by ({label}) ({substitute(selector, dashboard)})"))
    return out


def alert_rules() -> dict[str, dict[str, Any]]:
    """Every Prometheus alerting rule in deploy/prometheus/rules, by alert name."""
    rules: dict[str, dict[str, Any]] = {}
    for path in RULE_FILES:
        for group in load_yaml(path)["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    rules[rule["alert"]] = rule
    return rules


def recording_rules() -> dict[str, dict[str, Any]]:
    rules: dict[str, dict[str, Any]] = {}
    for path in RULE_FILES:
        for group in load_yaml(path)["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    rules[rule["record"]] = rule
    return rules


def github_anchor(heading: str) -> str:
    """The anchor GitHub generates for a Markdown heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")
