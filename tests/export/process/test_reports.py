"""The exporter process's reports read in the training process: a frame that cannot be read
is counted and told, never silently lost."""

from __future__ import annotations

import logging
import marshal
from pathlib import Path

import pytest
from train_helpers import clean_env, start_test_run  # noqa: F401  (clean_env: autouse)

from otel_train.common.drop_counter import DropCounter
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.export.process.derived_link import DerivedMetricsLink
from otel_train.export.process.lifecycle import ClientLifecycle, ClientState
from otel_train.export.process.reports import ChildReports

pytestmark = pytest.mark.timeout(60)
_log = logging.getLogger("otel_train")


def _reports() -> tuple[ChildReports, DropCounter]:
    warn = RateLimitedLogger(_log)
    drops = DropCounter()
    return ChildReports(ClientLifecycle(), drops, DerivedMetricsLink(warn), warn), drops


def test_a_corrupt_frame_is_counted_and_warned_and_the_frames_after_it_still_apply(caplog):
    reports, drops = _reports()
    stats = marshal.dumps(("stats", 10, 0, {"export_failed": 2}, 0))
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        reports.take([b"\xff not marshal", stats, b""])
    assert reports.corrupt_frames == 2
    assert "a report from the exporter process could not be read" in caplog.text
    assert reports.exported == 10 and drops.counts() == {"export_failed": 2}
    assert reports._lifecycle.state is ClientState.READY


def test_a_good_stream_counts_no_corrupt_frame():
    reports, _ = _reports()
    reports.take([marshal.dumps(("startup", 0.25)), marshal.dumps(("flushed", 1, True))])
    assert reports.corrupt_frames == 0 and reports.answer(1)


def test_corrupt_frames_show_in_the_run_costs(tmp_path: Path) -> None:
    run = start_test_run(tmp_path)
    for _ in run.steps(range(5)):
        pass
    assert run.flush(timeout_seconds=10)
    clean = run.costs()
    run._telemetry.export._reports.take([b"\x00 not a report"])
    costs = run.costs()
    run.shutdown(timeout=10)
    assert "exporter_process_corrupt_report_frames" not in clean
    assert costs["exporter_process_corrupt_report_frames"] == 1
