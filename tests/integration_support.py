"""Helpers for the integration and example tests: runs exporting to a real OTLP receiver,
span-tree queries, and environments for subprocesses.

Usage::

    from integration_support import receiver_run, step_roots, children

    with GrpcOtlpReceiver() as recv:
        run = receiver_run(recv, tmp_path)
        ...
        run.shutdown()
        roots = step_roots(recv.spans())            # {step index: root span}
        names = [c.name for c in children(recv.spans(), roots[0])]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import otel_train

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
PYTHON = sys.executable
BIN = Path(sys.executable).parent


def receiver_run(recv: Any, tmp_path: Path, **options: Any) -> otel_train.Run:
    """A run exporting over OTLP/gRPC to ``recv``; no Prometheus, no console."""
    opts: dict[str, Any] = dict(exporter="otlp", otlp_endpoint=recv.endpoint,
                                otlp_protocol="grpc", prometheus_port=None, console=False,
                                status_dir=str(tmp_path))
    opts.update(options)
    return otel_train.start_run(**opts)


def step_roots(spans: list[Any]) -> dict[int, Any]:
    """The ``train.step`` roots by step index (single-rank runs)."""
    return {s.attributes["train.step"]: s for s in spans
            if s.name == "train.step" and s.parent_span_id is None}


def children(spans: list[Any], parent: Any) -> list[Any]:
    """Direct children of ``parent``, in start order."""
    kids = [s for s in spans if s.parent_span_id == parent.span_id
            and s.trace_id == parent.trace_id]
    return sorted(kids, key=lambda s: s.start_time_unix_nano)


def monitor_roots(spans: list[Any], name: str | None = None) -> list[Any]:
    """Monitoring spans recorded between steps (their own roots)."""
    return [s for s in spans if s.parent_span_id is None and s.name != "train.step"
            and (name is None or s.name == name)]


def subprocess_env(recv: Any, tmp_path: Path, protocol: str = "grpc", **extra: str
                   ) -> dict[str, str]:
    """Environment for a child process exporting to ``recv`` through OTEL_TRAIN_*."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "TORCHELASTIC_"))}
    env.update({
        "OTEL_TRAIN_EXPORTER": "otlp", "OTEL_TRAIN_OTLP_ENDPOINT": recv.endpoint,
        "OTEL_TRAIN_OTLP_PROTOCOL": protocol, "OTEL_TRAIN_PROMETHEUS_PORT": "none",
        "OTEL_TRAIN_CONSOLE": "false", "OTEL_TRAIN_STATUS_DIR": str(tmp_path / "status"),
        "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
        # A short run can end before its exporter process is up; the exit then waits for it
        # or exports from the training process. 10 s, not 2, for a loaded CI box (the exit
        # still ends as soon as everything is sent).
        "OTEL_TRAIN_SHUTDOWN_TIMEOUT_SECONDS": "10",
    })
    env.update(extra)
    return env
