"""Shared helpers for the core tests: a clean environment, runs that write a span file we can
read back, slow iterables, and a faithful fake of the ``torch.accelerator`` API.

Import the ``clean_env`` fixture into a test module (``from train_helpers import clean_env``)
to make it autouse there.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fake_accelerator import FakeAccelerator  # noqa: F401  (re-exported for the tests)

import otel_train
from otel_train.common import rate_limited_log
from otel_train.rundir.span_files import attributes_dict, read_span_dicts

# Environment variables that change what a run does; tests start without any of them.
_IDENTITY_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                  "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_STEPID",
                  "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID",
                  "JOBSET_NAME", "KUBEFLOW_JOB_NAME", "K8S_POD_NAME", "POD_NAME")

# Slack for duration upper bounds: durations are "at least the sleep, at most sleep + slack".
SLACK_SECONDS = 0.25


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No OTEL_*, OTEL_TRAIN_* or torchrun variables; warn-once memory cleared."""
    for name in list(os.environ):
        if name.startswith("OTEL_") or name in _IDENTITY_VARS:
            monkeypatch.delenv(name, raising=False)
    rate_limited_log._warned.clear()
    yield
    rate_limited_log._warned.clear()


def start_test_run(tmp_path: Path, **options: Any) -> otel_train.Run:
    """start_run with metrics and console off, the status dir in tmp_path, spans to a file."""
    opts: dict[str, Any] = {
        "prometheus_port": None,
        "console": False,
        "status_dir": str(tmp_path),
        "exporter": "jsonl",
        "spans_path": str(tmp_path / "spans.jsonl"),
        "export_interval_seconds": 0.1,
    }
    opts.update(options)
    return otel_train.start_run(**opts)


def start_in_process_run(tmp_path: Path, **options: Any) -> otel_train.Run:
    """start_test_run with the span file written from this process, no exporter interpreter:
    for tests of the hot path, which read the spans back but do not check their route there
    (tests/pipeline/test_routes.py checks every route); each run starts in a fraction of the
    time."""
    return start_test_run(tmp_path, **{"export_process": False, **options})


@dataclass(frozen=True)
class FileSpan:
    """One span read back from a span file (OTLP JSON lines)."""

    name: str
    trace_id: int
    span_id: int
    parent_id: int | None
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status_code: str  # "UNSET" | "OK" | "ERROR"
    status_message: str | None
    resource: dict[str, Any]

    @property
    def duration_seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def is_root(self) -> bool:
        return self.parent_id is None


_STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}


def read_file_spans(path: str | Path) -> list[FileSpan]:
    """Every span in a span file (or a run directory's span files), decoded."""
    out = []
    for d in read_span_dicts(path):
        status: dict[str, Any] = d.get("status", {})
        parent = d.get("parentSpanId")
        out.append(FileSpan(
            name=str(d["name"]),
            trace_id=int(d["traceId"], 16),
            span_id=int(d["spanId"], 16),
            parent_id=int(parent, 16) if parent else None,
            start_ns=int(d["startTimeUnixNano"]),
            end_ns=int(d["endTimeUnixNano"]),
            attributes=attributes_dict(d.get("attributes")),
            events=[(e["name"], attributes_dict(e.get("attributes"))) for e in d.get("events", ())],
            status_code=_STATUS[int(status.get("code", 0))],
            status_message=status.get("message"),
            resource=dict(d["resource"]),
        ))
    return out


def run_spans(run: otel_train.Run) -> list[FileSpan]:
    """The spans a (shut down) run wrote to its span file."""
    assert run.spans_path is not None
    if not Path(run.spans_path).exists():
        return []
    return read_file_spans(run.spans_path)


def one(spans: list[Any], name: str, **attrs: Any) -> Any:
    """The single span called ``name`` whose attributes include ``attrs``."""
    found = [s for s in spans if s.name == name
             and all(s.attributes.get(k) == v for k, v in attrs.items())]
    assert len(found) == 1, (name, attrs, [(s.name, s.attributes) for s in spans])
    return found[0]


class SlowIterable:
    """An iterable whose every fetch takes ``seconds`` (like a slow DataLoader)."""

    def __init__(self, items: list[Any], seconds: float) -> None:
        self.items = list(items)
        self.seconds = seconds
        self.fetches = 0

    def __iter__(self) -> Iterator[Any]:
        return _SlowIterator(self)


class _SlowIterator:
    def __init__(self, owner: SlowIterable) -> None:
        self._owner = owner
        self._i = 0

    def __iter__(self) -> _SlowIterator:
        return self

    def __next__(self) -> Any:
        owner = self._owner
        owner.fetches += 1
        time.sleep(owner.seconds)
        if self._i >= len(owner.items):
            raise StopIteration
        self._i += 1
        return owner.items[self._i - 1]


def nested_step(rec: Any, index: int = 3, loader: str | None = "train") -> Any:
    """A finished step of a bare recorder: forward > attention, then inference (monitoring)."""
    from otel_train.recording.recorder import Step

    step = Step(rec, index, loader)
    with step.phase("forward"):
        with step.phase("attention"):
            pass
    with step.monitor("inference"):
        pass
    step._finish(None)
    return step


def use_fake_accelerator(monkeypatch: pytest.MonkeyPatch,
                         acc: FakeAccelerator | None = None) -> FakeAccelerator:
    """Runs started from now on resolve their device timing against ``acc`` (a new fake by
    default), where the builder resolves it: the only thing patched."""
    import otel_train.pipeline.assembly
    from otel_train.recording.device import resolve_device_timing

    acc = FakeAccelerator() if acc is None else acc
    monkeypatch.setattr(otel_train.pipeline.assembly, "resolve_device_timing",
                        lambda mode, *args, **kwargs: resolve_device_timing(
                            mode, accelerator=acc))
    return acc
