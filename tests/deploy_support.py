"""Shared helpers for the tests of deploy/ (paths, YAML loading, dashboard query extraction)."""

from __future__ import annotations

import importlib.util
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
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


def child_env(*first_paths: str) -> dict[str, str]:
    """The environment of a ``Child``: this repository importable (after ``first_paths``),
    the SDK on, and no OTLP endpoint of the caller's."""
    env = dict(os.environ)
    paths = (*first_paths, os.environ.get("PYTHONPATH", ""), str(REPO))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["OTEL_SDK_DISABLED"] = "false"
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    return env


class Child:
    """One training subprocess running ``workdir/child.py <stop_file> <status_dir> *args``.

    The script prints one JSON line with ``prometheus_url`` and steps until ``stop_file``
    exists; ``hostport`` is its metrics endpoint as Prometheus scrapes it.
    """

    def __init__(self, name: str, workdir: Path, env: dict[str, str], args: list[str]) -> None:
        self.name = name
        self.stop_file = workdir / f"stop-{name}"
        status_dir = workdir / f"status-{name}"
        status_dir.mkdir()
        self.stderr_path = workdir / f"{name}.stderr"
        self._stderr = open(self.stderr_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, str(workdir / "child.py"), str(self.stop_file), str(status_dir),
             *args],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=workdir,
            text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self.hostport = ""

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)

    def wait_url(self, timeout: float) -> str:
        """Wait for the child's metrics URL; return its ``host:port``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if line.startswith("{"):
                url = json.loads(line)["prometheus_url"]
                assert url and url.startswith("http://127.0.0.1:"), url
                self.hostport = url.removeprefix("http://").rstrip("/")
                return self.hostport
        raise AssertionError(
            f"{self.name} run did not report run.prometheus_url within {timeout}s "
            f"(exit code {self.proc.poll()}); stderr:\n{self.stderr()[-4000:]}"
        )

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def stop(self) -> None:
        """Ask the loop to end (stop file), then wait; kill after 20 s."""
        self.stop_file.touch()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self._stderr.close()


COMPOSE = DEPLOY / "docker-compose.yaml"


def compose() -> dict:
    return load_yaml(COMPOSE)


def services() -> dict[str, dict]:
    return compose()["services"]


def published(service: dict) -> dict[int, str]:
    """container port -> host binding ("127.0.0.1:3000")."""
    out = {}
    for spec in service.get("ports", []):
        host_ip, host_port, container_port = str(spec).split(":")
        out[int(container_port)] = f"{host_ip}:{host_port}"
    return out


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1].split("/")[0])
