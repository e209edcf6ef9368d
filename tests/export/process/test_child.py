"""child.py's watch thread: counts that changed are reported every STATS_INTERVAL_SECONDS,
and the watch adds no report where the export thread's reports (one after each batch) went
out since its last wake."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from train_helpers import clean_env  # noqa: F401  (autouse fixture)

from otel_train.common.sdk_config import ExportPlan
from otel_train.export.process import child as child_module
from otel_train.export.process.pipe import STATS_INTERVAL_SECONDS


class _Writer:
    """The child's report pipe: each frame with the time and thread it was sent from."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, str, tuple[Any, ...]]] = []

    def send(self, msg: tuple[Any, ...], block: bool = False) -> bool:
        self.sent.append((time.monotonic(), threading.current_thread().name, msg))
        return True


def _child(tmp_path: Path, writer: _Writer) -> Any:
    config = {"plan": ExportPlan(kind="jsonl", path=tmp_path / "spans.jsonl"),
              "resource": ({"service.name": "watch"}, None), "scope": ("otel-train", "1", None),
              "run_constants": {}, "max_queue": 1000, "batch": 512, "interval": 60.0,
              "parent_pid": os.getppid()}  # the orphan check finds its parent
    return child_module._Child(writer, config)  # type: ignore[arg-type]


def _watch(child: Any, seconds: float, during: Any = None) -> None:
    watcher = threading.Thread(target=child.watch, name="watch", daemon=True)
    watcher.start()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if during is not None:
            during()
        time.sleep(0.05)
    child._done.set()
    child._watch_sleep.release()  # as stop() does
    watcher.join(2)
    assert not watcher.is_alive()


def test_counts_that_change_with_no_batch_sent_are_reported_every_wake(tmp_path):
    writer = _Writer()
    child = _child(tmp_path, writer)
    try:
        # Counts that change between wakes (a drop now and then), and no batch reports them.
        _watch(child, 1.6, during=lambda: child.drops.add("export_queue_full", 1))
        reports = [(t, m) for t, name, m in writer.sent if m[0] == "stats"]
        assert all(name == "watch" for _, name, m in writer.sent if m[0] == "stats")
        gaps = [b[0] - a[0] for a, b in zip(reports, reports[1:])]
        assert 5 <= len(reports) <= 8
        assert max(gaps) < STATS_INTERVAL_SECONDS + 0.1
    finally:
        child.export.shutdown(1.0)


def test_the_watch_adds_no_report_while_the_export_threads_keep_the_counts_fresh(tmp_path):
    writer = _Writer()
    child = _child(tmp_path, writer)
    try:
        def batch_settled() -> None:  # as on_settled after each batch, every 0.1 s
            child.drops.add("export_failed", 1)
            child.stats(block=True)

        _watch(child, 1.6, during=batch_settled)
        from_watch = [m for _, name, m in writer.sent if name == "watch" and m[0] == "stats"]
        assert from_watch == []
        # Then the export thread goes quiet: the watch reports again within the interval.
        writer.sent.clear()
        child._done.clear()  # (the watch that left holds its lock again)
        child.drops.add("export_failed", 1)
        _watch(child, 0.6)
        assert [m for _, name, m in writer.sent if name == "watch" and m[0] == "stats"]
    finally:
        child.export.shutdown(1.0)
