"""The end-of-run line about spans not delivered: counts by reason in words, where they were
going, and why when the run can tell; real runs against a closed port and a malformed
endpoint read differently, with counts and without class names or dicts."""

from __future__ import annotations

import logging
import socket

import pytest
from train_helpers import clean_env  # noqa: F401

import otel_train
from otel_train.common.drop_words import dropped_summary

pytestmark = pytest.mark.timeout(60)


def test_every_reason_reads_in_words_with_its_count_most_first():
    line = dropped_summary({"export_failed": 3, "shutdown_timeout": 256, "build_error": 1},
                           "http://127.0.0.1:4318", delivered=10)
    assert line == ("otel-train: 260 spans were not delivered to http://127.0.0.1:4318: 256 "
                    "still queued at shutdown, 3 refused by the collector or not delivered "
                    "after retries, 1 could not be made into spans")
    assert dropped_summary({}, "x") is None and dropped_summary({"export_failed": 0}) is None
    assert dropped_summary({"export_queue_full": 1}).startswith(
        "otel-train: 1 span was not delivered: 1 dropped from a full export queue")


def test_a_collector_that_took_nothing_and_a_malformed_endpoint_say_why():
    assert dropped_summary({"shutdown_timeout": 256}, "http://127.0.0.1:4318", 0).endswith(
        "256 still queued at shutdown (the collector there confirmed none of this run's spans: "
        "is it running, on that port?)")
    assert dropped_summary({"shutdown_timeout": 5}, "not-a-url", 0, "it is not a URL").endswith(
        "5 still queued at shutdown (the endpoint is not usable: it is not a URL)")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("export_process", [False, True], ids=["in-process", "exporter-process"])
@pytest.mark.parametrize(("endpoint", "failure", "why"), [
    ("not-a-url", "the endpoint is not a usable URL", "(the endpoint is not usable: it is not "
                                                      "a URL"),
    ("http://127.0.0.1:{port}", "the collector refused the connection",
     "(the collector there confirmed none of this run's spans"),
])
def test_a_run_that_delivers_nothing_says_why_in_words_with_counts(
        tmp_path, monkeypatch, caplog, endpoint, failure, why, export_process):
    endpoint = endpoint.format(port=_closed_port())
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        run = otel_train.start_run(prometheus_port=None, console=False,
                                   status_dir=str(tmp_path), shutdown_timeout_seconds=1.0,
                                   export_interval_seconds=0.05,
                                   export_process=export_process)
        for step in run.steps(range(20)):
            with step.phase("forward"):
                pass
        run.flush(timeout_seconds=0.5)  # fails: the retry warning comes
        run.shutdown()
    lines = [r.getMessage() for r in caplog.records]
    print("\n".join(lines))
    retry = [x for x in lines if x.startswith(f"otel-train: span export to {endpoint}")]
    assert retry and f"failed: {failure}" in retry[0] and "spans kept queued, will retry" in (
        retry[0])
    end = [x for x in lines if " not delivered to " in x]
    dropped = run.drops.total
    assert len(end) == 1 and end[0].startswith(
        f"otel-train: {dropped} spans were not delivered to {endpoint}: {dropped} still queued "
        f"at shutdown {why}")
    assert dropped == 20 * 3  # root, data, forward: every span, counted once
    for line in lines:
        assert "{" not in line and "MissingSchema" not in line and "Error" not in line, line
