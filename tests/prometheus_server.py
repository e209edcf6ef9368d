"""A real Prometheus server for tests, started on 127.0.0.1 and torn down afterwards.

Usage::

    from prometheus_server import PrometheusServer

    with PrometheusServer(["127.0.0.1:9464"], rule_files=[RULES_DIR / "alerts.yml"]) as prom:
        prom.wait_for("otel_train_steps_total", timeout=20)          # until the query has data
        value = prom.query_value('sum(otel_train_steps_total)')       # a single float (or None)
        series = prom.query('rate(otel_train_steps_total[1m])')       # the API's `result` list
        prom.targets()                                                # active scrape targets

API (kept small on purpose, other test files reuse it):

- ``PrometheusServer(targets, *, rule_files=(), scrape_interval="1s", evaluation_interval="1s",
  job="otel-train", startup_timeout=30.0)``: ``targets`` is a list of ``host:port`` strings
  (scraped at ``/metrics``, all in job ``job``) or a mapping ``{job: [host:port, ...]}``.
  The server runs with ``--enable-feature=exemplar-storage`` on a free 127.0.0.1 port, with a
  temporary config file and data dir, both removed by :meth:`stop`.
- ``url``: base URL such as ``http://127.0.0.1:40123``.
- ``query(promql, time=None) -> list``: instant query; returns ``data.result`` (list of
  ``{"metric": {...}, "value": [ts, "str"]}``, or a scalar/string pair for scalar results).
- ``query_value(promql) -> float | None``: the value of a one-element (or scalar) result.
- ``query_range(promql, start, end, step="1s") -> list``: range query, ``data.result``.
- ``query_exemplars(promql, start, end) -> list``: ``/api/v1/query_exemplars`` ``data``.
- ``wait_for(promql, predicate=None, timeout=30.0, interval=0.5) -> list``: re-runs the instant
  query until ``predicate(result)`` is true (default: the result is non-empty) and returns that
  result; raises ``TimeoutError`` with the last result otherwise (bounded, never hangs).
- ``targets() -> list``: ``/api/v1/targets`` ``activeTargets``.
- ``rules() -> list``: ``/api/v1/rules`` ``groups``.
- ``start()`` / ``stop()``, or use it as a context manager.

When the ``prometheus`` binary is missing, constructing the server calls :func:`require_binary`:
with environment ``CI=true`` the test FAILS (CI must never silently skip), elsewhere it is
skipped with the reason. ``require_binary("promtool")`` does the same for other tools.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

__all__ = ["PrometheusServer", "require_binary"]


def require_binary(name: str) -> str:
    """Return the path of executable ``name``; fail under CI=true, skip elsewhere, if absent."""
    path = shutil.which(name)
    if path:
        return path
    reason = (
        f"`{name}` binary not found on PATH (on Debian/Ubuntu: apt-get install prometheus, "
        "which provides prometheus and promtool)"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason}; CI=true, so this test must not be skipped", pytrace=False)
    pytest.skip(reason)
    raise AssertionError("unreachable")  # pragma: no cover


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _yaml_str(value: str) -> str:
    return json.dumps(value)  # JSON strings are valid YAML scalars


class PrometheusServer:
    """A real ``prometheus`` process scraping the given targets (see the module docstring)."""

    def __init__(
        self,
        targets: Sequence[str] | Mapping[str, Sequence[str]],
        *,
        rule_files: Iterable[str | os.PathLike[str]] = (),
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        job: str = "otel-train",
        startup_timeout: float = 30.0,
    ) -> None:
        self.binary = require_binary("prometheus")
        if isinstance(targets, Mapping):
            self._jobs = {str(j): [str(t) for t in ts] for j, ts in targets.items()}
        else:
            self._jobs = {job: [str(t) for t in targets]}
        self._rule_files = [str(Path(p).resolve()) for p in rule_files]
        self._scrape_interval = scrape_interval
        self._evaluation_interval = evaluation_interval
        self._startup_timeout = startup_timeout
        self._tmp: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self.port: int | None = None
        self.url: str = ""

    # -- lifecycle ---------------------------------------------------------------------------
    def _config_text(self) -> str:
        lines = [
            "global:",
            f"  scrape_interval: {self._scrape_interval}",
            f"  scrape_timeout: {self._scrape_interval}",
            f"  evaluation_interval: {self._evaluation_interval}",
            "storage:",
            "  exemplars:",
            "    max_exemplars: 100000",
        ]
        if self._rule_files:
            lines.append("rule_files:")
            lines += [f"  - {_yaml_str(p)}" for p in self._rule_files]
        lines.append("scrape_configs:")
        for job, targets in self._jobs.items():
            lines += [
                f"  - job_name: {_yaml_str(job)}",
                "    metrics_path: /metrics",
                "    static_configs:",
                "      - targets: [" + ", ".join(_yaml_str(t) for t in targets) + "]",
            ]
        return "\n".join(lines) + "\n"

    def start(self) -> PrometheusServer:
        if self._proc is not None:
            return self
        self._tmp = tempfile.mkdtemp(prefix="otel-train-prometheus-")
        config = Path(self._tmp, "prometheus.yml")
        config.write_text(self._config_text())
        last_error = ""
        for _attempt in range(3):  # a free port can be taken between probe and bind: retry
            self.port = _free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self._log_path = Path(self._tmp, f"prometheus-{self.port}.log")
            data_dir = Path(self._tmp, f"data-{self.port}")
            with open(self._log_path, "wb") as log:
                self._proc = subprocess.Popen(
                    [
                        self.binary,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={data_dir}",
                        f"--web.listen-address=127.0.0.1:{self.port}",
                        "--enable-feature=exemplar-storage",
                        "--storage.tsdb.retention.time=1h",
                        "--log.level=warn",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            deadline = time.monotonic() + self._startup_timeout
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    break
                try:
                    with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
                        if resp.status == 200:
                            return self
                except (urllib.error.URLError, OSError):
                    pass
                time.sleep(0.1)
            last_error = self.log()
            self._kill()
            if "address already in use" not in last_error:
                break
        self.stop()
        raise RuntimeError(f"prometheus did not become ready; its log:\n{last_error[-4000:]}")

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop the server and remove its config and data directory (idempotent)."""
        self._kill()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log(self) -> str:
        """The server's own log so far (handy in assertion messages)."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        return self._log_path.read_text(errors="replace")

    # -- HTTP API ----------------------------------------------------------------------------
    def _get(self, path: str, **params: Any) -> Any:
        if self._proc is None:
            raise RuntimeError("PrometheusServer is not running (use start() or `with`)")
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        url = f"{self.url}{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as err:  # 400/422 carry a JSON error body
            body = json.loads(err.read() or b"{}")
        if body.get("status") != "success":
            raise RuntimeError(
                f"Prometheus API {path} failed for {params}: "
                f"{body.get('errorType')}: {body.get('error')}"
            )
        return body["data"]

    def query(self, promql: str, time: float | None = None) -> list[Any]:
        data = self._get("/api/v1/query", query=promql, time=time)
        return data["result"]

    def query_value(self, promql: str) -> float | None:
        """The value of a one-series (or scalar) result; ``None`` if empty; error if several."""
        data = self._get("/api/v1/query", query=promql)
        result = data["result"]
        if data["resultType"] == "scalar":
            return float(result[1])
        if not result:
            return None
        if len(result) != 1:
            raise AssertionError(f"{promql!r} returned {len(result)} series: {result}")
        return float(result[0]["value"][1])

    def query_range(self, promql: str, start: float, end: float, step: str = "1s") -> list[Any]:
        return self._get("/api/v1/query_range", query=promql, start=start, end=end, step=step)[
            "result"
        ]

    def query_exemplars(self, promql: str, start: float, end: float) -> list[Any]:
        return self._get("/api/v1/query_exemplars", query=promql, start=start, end=end)

    def wait_for(
        self,
        promql: str,
        predicate: Callable[[list[Any]], bool] | None = None,
        timeout: float = 30.0,
        interval: float = 0.5,
    ) -> list[Any]:
        check = predicate if predicate is not None else bool
        deadline = time.monotonic() + timeout
        result: list[Any] = []
        while True:
            result = self.query(promql)
            if check(result):
                return result
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{promql!r}: condition not met in {timeout}s; last: {result}")
            time.sleep(interval)

    def targets(self) -> list[Any]:
        return self._get("/api/v1/targets")["activeTargets"]

    def rules(self) -> list[Any]:
        return self._get("/api/v1/rules")["groups"]
