"""End to end: start_run -> real OTLP exporters -> real gRPC and HTTP receivers.

Spans are decoded from what the receivers got over the wire, then checked against the
telemetry contract (names, parent links, one trace per step, attributes, durations, resource).
Then a sick collector: unavailable, hanging, slower than training.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from otlp_receivers import GrpcOtlpReceiver, HttpOtlpReceiver, ReceivedSpan
from train_helpers import SLACK_SECONDS, SlowIterable, clean_env, one  # noqa: F401

import otel_train
from otel_train.common.identity import step_trace_id

pytestmark = pytest.mark.timeout(60)

FETCH, FORWARD, BACKWARD, INFERENCE, VAL_FETCH = 0.03, 0.04, 0.02, 0.15, 0.01
# Step 0 takes ~0.09 s, step 1 ~0.27 s: only step 1 is over the absolute slow-step limit.
SLOW_STEP_SECONDS = 0.2
PROTOCOLS = {"grpc": GrpcOtlpReceiver, "http/protobuf": HttpOtlpReceiver}


@pytest.fixture(params=sorted(PROTOCOLS))
def collector(request: pytest.FixtureRequest) -> Iterator[tuple[str, object]]:
    """(protocol, a running receiver for it), for both transports."""
    with PROTOCOLS[request.param]() as receiver:
        yield request.param, receiver


def _start(tmp_path, protocol: str, receiver, **options) -> otel_train.Run:
    opts = {"exporter": "otlp", "otlp_endpoint": receiver.endpoint, "otlp_protocol": protocol,
            "export_interval_seconds": 0.1, "prometheus_port": None, "console": False,
            "status_dir": str(tmp_path)}
    opts.update(options)
    return otel_train.start_run(**opts)


def _train(run: otel_train.Run, steps: int = 2, monitor_on: int = 1) -> None:
    """Step 0: plain training. Step ``monitor_on``: also inference and val_loss."""
    for step in run.steps(SlowIterable(list(range(steps)), FETCH), loader="train"):
        with step.phase("forward"):
            time.sleep(FORWARD)
        with step.phase("backward"):
            time.sleep(BACKWARD)
        with step.phase("optimizer"):
            pass
        if step.index == monitor_on:
            with step.monitor("inference"):
                time.sleep(INFERENCE)
            with step.monitor("val_loss"):
                for _vb in step.iter_data(SlowIterable(["v0", "v1"], VAL_FETCH), loader="val"):
                    pass


def _trace(spans: list[ReceivedSpan], run_id: str, index: int) -> list[ReceivedSpan]:
    trace_hex = f"{step_trace_id(run_id, index):032x}"
    return [s for s in spans if s.trace_id == trace_hex]


def _between(span: ReceivedSpan, seconds: float) -> None:
    assert seconds <= span.duration_seconds < seconds + SLACK_SECONDS, (
        span.name, span.duration_seconds)


def test_training_steps_arrive_as_one_trace_each_following_the_contract(tmp_path, collector):
    protocol, receiver = collector
    with _start(tmp_path, protocol, receiver, run_id="e2e-run", service_name="tiny-gpt",
                slow_step_seconds=SLOW_STEP_SECONDS, warmup_steps=0) as run:
        _train(run)
        assert run._recorder.current is None
    spans = receiver.wait_for_spans(
        lambda got: len([s for s in got if s.name == "train.step"]) == 2, 10)
    assert len({s.trace_id for s in spans}) == 2  # one trace per step, nothing else

    plain = _trace(spans, "e2e-run", 0)
    assert sorted(s.name for s in plain) == ["backward", "data", "forward", "optimizer",
                                             "train.step"]
    monitored = _trace(spans, "e2e-run", 1)
    assert sorted(s.name for s in monitored) == sorted(
        ["train.step", "data", "forward", "backward", "optimizer", "inference", "val_loss",
         "data", "data"])

    for index, step_spans in ((0, plain), (1, monitored)):
        root = one(step_spans, "train.step")
        assert root.is_root
        assert root.status_code == 0
        assert root.scope_name == "otel_train"
        assert root.attributes["train.step"] == index
        # step 1 lasts ~0.26 s > slow_step_seconds only because of its monitoring: slow steps
        # are judged on training time (~0.09 s here), so neither is slow
        assert root.attributes["train.slow"] is False
        assert root.attributes["train.dataloader"] == "train"
        for span in step_spans:
            attrs = span.attributes
            assert attrs["train.run.id"] == "e2e-run"
            assert attrs["train.step"] == index
            assert attrs["train.rank"] == 0
            assert attrs["train.world_size"] == 1
            assert attrs["train.device.synced"] is False  # CPU: host clock
            assert span.resource_attributes["service.name"] == "tiny-gpt"
            assert span.resource_attributes["service.instance.id"] == "e2e-run/rank0"
            assert root.start_time_unix_nano <= span.start_time_unix_nano
            assert span.end_time_unix_nano <= root.end_time_unix_nano
            if span is root:
                continue
            assert attrs["train.phase"] == span.name
            if span.name in ("data", "forward", "backward", "optimizer", "inference",
                             "val_loss") and not (span.name == "data"
                                                  and attrs["train.dataloader"] == "val"):
                assert span.parent_span_id == root.span_id
        train_data = one(step_spans, "data", **{"train.dataloader": "train"})
        assert train_data.attributes["train.phase.kind"] == "train"
        _between(train_data, FETCH)
        _between(one(step_spans, "forward"), FORWARD)
        _between(one(step_spans, "backward"), BACKWARD)
        assert one(step_spans, "optimizer").attributes["train.phase.kind"] == "train"

    inference, val = one(monitored, "inference"), one(monitored, "val_loss")
    _between(inference, INFERENCE)
    assert inference.attributes["train.phase.kind"] == "monitor"
    assert val.attributes["train.phase.kind"] == "monitor"
    val_data = [s for s in monitored if s.name == "data"
                and s.attributes["train.dataloader"] == "val"]
    assert len(val_data) == 2
    for d in val_data:
        assert d.parent_span_id == val.span_id
        assert d.attributes["train.phase.kind"] == "monitor"
        _between(d, VAL_FETCH)
    root1 = one(monitored, "train.step")
    _between(root1, FETCH + FORWARD + BACKWARD + INFERENCE + 3 * VAL_FETCH)
    assert run.dropped_spans() == {}


def test_a_user_span_in_a_phase_arrives_as_its_child(tmp_path, collector):
    protocol, receiver = collector
    with _start(tmp_path, protocol, receiver, run_id="user-run") as run:
        for step in run.steps([0]):
            with step.phase("forward"):
                with trace.get_tracer("x").start_as_current_span("user") as span:
                    span.set_attribute("layer", 3)
    spans = receiver.wait_for_spans(lambda got: {"user", "train.step"} <= {
        s.name for s in got}, 10)
    user, forward = one(spans, "user"), one(spans, "forward")
    assert user.trace_id == f"{step_trace_id('user-run', 0):032x}"
    assert user.parent_span_id == forward.span_id
    assert user.attributes == {"layer": 3}
    assert user.scope_name == "x"
    assert user.resource_attributes == forward.resource_attributes


def test_service_name_and_resource_attributes_come_from_the_otel_env(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "team=ml,deployment.environment=test")
    with GrpcOtlpReceiver() as receiver:
        with _start(tmp_path, "grpc", receiver) as run:
            for _step in run.steps([0]):
                pass
        spans = receiver.wait_for_spans(2, 10)
    for span in spans:
        assert span.resource_attributes["service.name"] == "from-env"
        assert span.resource_attributes["team"] == "ml"
        assert span.resource_attributes["deployment.environment"] == "test"


def test_the_endpoint_can_come_from_the_otel_env(tmp_path, monkeypatch):
    with HttpOtlpReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        with otel_train.start_run(prometheus_port=None, console=False,
                                  status_dir=str(tmp_path), export_interval_seconds=0.1) as run:
            for _step in run.steps([0]):
                pass
        assert run.export_plan.kind == "otlp"
        assert len(receiver.wait_for_spans(2, 10)) == 2
    assert not list(tmp_path.glob("*.jsonl*"))


# -- a sick collector -------------------------------------------------------------------------

def test_an_unavailable_collector_never_stops_training_and_drops_are_counted(
        tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "0.5")  # seconds: fail fast, no retries
    with GrpcOtlpReceiver(mode="unavailable") as receiver:
        with caplog.at_level(logging.WARNING, logger="otel_train"):
            with _start(tmp_path, "grpc", receiver, export_batch_size=2) as run:
                done = 0
                for step in run.steps(range(40)):
                    with step.phase("forward"):
                        time.sleep(0.002)
                    done += 1
                    if step.index == 19:  # let the first exports fail, then keep training
                        receiver.wait_for_requests(1)
                t_shutdown = time.monotonic()
            shutdown_seconds = time.monotonic() - t_shutdown
        assert receiver.requests_count >= 1
        assert receiver.spans() == []
    assert done == 40
    drops = run.dropped_spans()
    # UNAVAILABLE is retryable: the spans stay queued and are retried (with backoff) until
    # the shutdown bound, then counted; nothing is dropped at the first failure any more.
    assert receiver.requests_count >= 2
    assert drops == {"shutdown_timeout": done * 3}  # every span of every step accounted
    assert shutdown_seconds < 2.0 + 0.5
    # The export warnings do not flood (a 2 ms step that a loaded machine makes 5 ms is
    # rightly called slow: that warning is another behaviour's, not counted here).
    ours = [r for r in caplog.records if r.name == "otel_train" and r.levelno >= logging.WARNING
            and not r.getMessage().startswith("otel-train: slow step")]
    assert 1 <= len(ours) <= 3, [r.getMessage() for r in ours]


def _three_steps_stuck_in_the_collector(run, receiver) -> None:
    for step in run.steps(range(3)):
        with step.phase("forward"):
            pass
    # the first export is now stuck in the collector
    assert receiver.wait_for_requests(1) >= 1


def test_a_hanging_collector_cannot_hold_shutdown_beyond_its_timeout(tmp_path):
    with GrpcOtlpReceiver(mode="hang", hang_seconds=10) as receiver:
        with _start(tmp_path, "grpc", receiver) as run:
            _three_steps_stuck_in_the_collector(run, receiver)
            t0 = time.monotonic()
            run.shutdown(timeout=1.0)
            elapsed = time.monotonic() - t0
            # Counted while the collector still hangs (if it answers later, the count is
            # corrected: see the exactly-once test below).
            assert run.dropped_spans().get("shutdown_timeout", 0) >= 1
    assert elapsed < 1.0 + 0.5


def test_after_a_hanging_shutdown_every_span_is_counted_exactly_once(tmp_path):
    with GrpcOtlpReceiver(mode="hang", hang_seconds=10) as receiver:
        with _start(tmp_path, "grpc", receiver) as run:
            _three_steps_stuck_in_the_collector(run, receiver)
            run.shutdown(timeout=0.5)
    export = run._telemetry.export
    if hasattr(export, "_proc"):  # the exporter process: killed at the deadline, or ended
        export._proc.wait(5)
    else:
        export._thread.join(5)  # the stuck export has returned, one way or the other
        assert not export._thread.is_alive()
    delivered = len(receiver.spans())
    assert sum(run.dropped_spans().values()) + delivered == 9


def test_a_collector_slower_than_training_fills_the_bounded_export_queue(tmp_path):
    with GrpcOtlpReceiver(mode="hang", hang_seconds=10) as receiver:
        with _start(tmp_path, "grpc", receiver, max_queued_spans=5, export_batch_size=5) as run:
            for step in run.steps(range(10)):
                with step.phase("forward"):
                    time.sleep(0.02)
            run.shutdown(timeout=0.5)
    drops = run.dropped_spans()
    assert drops.get("export_queue_full", 0) >= 30 - 5 - 5  # <= 5 in flight, <= 5 queued
    assert drops.get("shutdown_timeout", 0) >= 5


def test_record_queue_full_is_counted_when_the_builder_falls_behind(tmp_path):
    with HttpOtlpReceiver() as receiver:
        # The recorder's queue (step_ring off): a full step ring is tests/pipeline/
        # test_ring_source.py's.
        with _start(tmp_path, "http/protobuf", receiver, max_queued_steps=2,
                    step_ring="off") as run:
            run._telemetry.worker.paused = True
            time.sleep(0.1)  # let any drain cycle already under way finish
            for step in run.steps(range(5)):
                with step.phase("forward"):
                    pass
        assert run.dropped_spans() == {"record_queue_full": 9}  # steps 2..4, 3 spans each
        spans = receiver.wait_for_spans(6, 10)
    assert sorted(s.attributes["train.step"] for s in spans if s.is_root) == [0, 1]
