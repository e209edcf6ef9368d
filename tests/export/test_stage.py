"""Export: the bounded batch processor (bounds, drop counting, bounded shutdown, riding out
collector outages against the real OTLP receivers) and the JSON-lines span file that is the
default when there is no collector."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanContext, TraceFlags
from otlp_receivers import Flapping, GrpcOtlpReceiver, HttpOtlpReceiver
from train_helpers import clean_env, one, read_file_spans  # noqa: F401

import otel_train
from otel_train.common.drop_counter import DropCounter
from otel_train.export.stage import (
    BoundedBatchSpanProcessor,
    JsonLinesSpanExporter,
    read_spans_jsonl,
)
from otel_train.common.sdk_config import ExportPlan
from otel_train.export.exporters import create_exporter

pytestmark = pytest.mark.timeout(60)


def _spans(n: int, sampled: bool = True) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    for i in range(n):
        with tracer.start_as_current_span(f"s{i}"):
            pass
    spans = list(memory.get_finished_spans())
    if not sampled:
        spans = [ReadableSpan(name=s.name, context=SpanContext(
            s.context.trace_id, s.context.span_id, False, TraceFlags(TraceFlags.DEFAULT)))
            for s in spans]
    return spans


class Recording(SpanExporter):
    """Records batches; can fail, raise, or block until released."""

    def __init__(self, result: SpanExportResult = SpanExportResult.SUCCESS,
                 raises: bool = False) -> None:
        self.batches: list[list[str]] = []
        self.result = result
        self.raises = raises
        self.release = threading.Event()
        self.release.set()
        self.entered = threading.Event()
        self.shut = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.release.wait(30)
        if self.raises:
            raise ConnectionError("collector exploded")
        self.batches.append([s.name for s in spans])
        return self.result

    def shutdown(self) -> None:
        self.shut = True


def test_spans_are_exported_in_bounded_batches():
    exporter = Recording()
    drops = DropCounter()
    proc = BoundedBatchSpanProcessor(exporter, drops, max_queue_size=100, max_batch_size=4,
                                     interval_seconds=0.05)
    for span in _spans(10):
        proc.on_end(span)
    assert proc.force_flush(5000)
    proc.shutdown(2.0)
    assert sum(len(b) for b in exporter.batches) == 10
    assert max(len(b) for b in exporter.batches) <= 4
    assert proc.exported == 10
    assert drops.total == 0
    assert exporter.shut


def test_the_exporter_is_woken_once_per_batch_not_once_per_span():
    exporter = Recording()
    exporter.release.clear()  # the first export hangs: the queue grows behind it
    proc = BoundedBatchSpanProcessor(exporter, DropCounter(), max_queue_size=1000,
                                     max_batch_size=4, interval_seconds=30)
    wakes = []
    real_set = proc._wake.set
    proc._wake.set = lambda: (wakes.append(1), real_set())[1]
    spans = _spans(40)
    for span in spans[:4]:
        proc.on_end(span)
    assert exporter.entered.wait(5)  # the first batch is out
    for span in spans[4:]:
        proc.on_end(span)  # 36 more queue behind it: one more wake, not 33
    assert len(wakes) == 2
    exporter.release.set()
    assert proc.force_flush(5000)
    proc.shutdown(2.0)
    assert sum(len(b) for b in exporter.batches) == 40


def test_unsampled_spans_are_not_exported():
    exporter = Recording()
    proc = BoundedBatchSpanProcessor(exporter, DropCounter(), interval_seconds=0.05)
    for span in _spans(3, sampled=False):
        proc.on_end(span)
    assert proc.force_flush(2000)
    proc.shutdown(1.0)
    assert exporter.batches == []


def test_a_full_queue_drops_and_counts_with_one_warning(caplog):
    exporter = Recording()
    exporter.release.clear()  # the exporter is stuck
    drops = DropCounter()
    proc = BoundedBatchSpanProcessor(exporter, drops, max_queue_size=5, max_batch_size=2,
                                     interval_seconds=0.05)
    spans = _spans(20)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        proc.on_end(spans[0])
        assert exporter.entered.wait(5)  # one span is in flight, stuck
        for span in spans[1:]:
            proc.on_end(span)
    assert drops.counts() == {"export_queue_full": 14}  # 1 in flight + 5 queued
    assert len([r for r in caplog.records if "queue full" in r.getMessage()]) == 1
    exporter.release.set()
    proc.shutdown(2.0)
    assert proc.exported == 6


class _TwoPerRecord:
    """Queue items of two 'spans' per record, named after its step."""

    @staticmethod
    def from_record(rec) -> list[bytes]:
        return [f"{rec[0]}a".encode(), f"{rec[0]}b".encode()]

    @staticmethod
    def from_row(row) -> bytes:
        return row[0].encode()


class EncodingRecording(Recording):
    """An exporter that encodes span records where they arrive, as the OTLP exporters do:
    its items are bytes."""

    def span_items(self, factory) -> _TwoPerRecord:
        return _TwoPerRecord()

    def export(self, spans) -> SpanExportResult:
        self.entered.set()
        self.release.wait(30)
        self.batches.append([s.decode() for s in spans])
        return self.result


def test_encoded_records_are_queued_a_frame_at_a_time_within_the_bound_oldest_dropped():
    from otel_train.records.span_rows import RowSpanFactory

    exporter = EncodingRecording()
    exporter.release.clear()  # stuck: the queue fills behind the first batch
    drops = DropCounter()
    proc = BoundedBatchSpanProcessor(exporter, drops, max_queue_size=5, max_batch_size=4,
                                     interval_seconds=30)
    proc.use_rows(RowSpanFactory(None, None, {}))
    wakes = []
    real_set = proc._wake.set
    proc._wake.set = lambda: (wakes.append(1), real_set())[1]

    def records(*steps, sampled=True):
        return [(f"s{i}", 1, 2, 1 if sampled else 0) for i in steps]

    proc.on_records(records(0, 1))  # 4 spans: a batch's worth, one wake
    assert exporter.entered.wait(5) and wakes == [1]
    proc.on_records(records(2))
    proc.on_records(records(3, 4, 5) + records(6, sampled=False))  # 6 more: 3 over the bound
    assert wakes == [1, 1]  # the queue crossed a batch's worth once more
    assert drops.counts() == {"export_queue_full": 3}  # s2a, s2b, s3a
    assert len(proc._queue) == 5
    exporter.release.set()
    assert proc.force_flush(5000)
    proc.shutdown(1.0)
    assert exporter.batches == [["s0a", "s0b", "s1a", "s1b"], ["s3b", "s4a", "s4b", "s5a"],
                                ["s5b"]]
    proc.on_records(records(7))  # after shutdown: counted, not queued
    assert drops.counts() == {"export_queue_full": 3, "shutdown_timeout": 2}


def test_a_batch_is_taken_whole_or_span_by_span_as_the_pops_would_take_it():
    """The worker's take (the batch copied off, the queue cleared or its rest made the
    queue) against popping span by span, on the same queue."""
    from collections import deque

    exporter = EncodingRecording()
    proc = BoundedBatchSpanProcessor(exporter, DropCounter(), max_queue_size=100,
                                     max_batch_size=4, interval_seconds=30)
    for n in (0, 1, 4, 5, 9, 12):
        items = [f"i{k}" for k in range(n)]
        proc._queue.extend(items)
        reference, want = deque(items), []
        while reference:
            want.append([reference.popleft() for _ in range(min(4, len(reference)))])
        got = []
        while proc._queue:
            got.append(proc._take_batch())
        assert got == want
    proc.shutdown(1.0)


def test_a_full_batch_wake_sends_full_batches_and_the_rest_goes_with_the_next_or_a_flush():
    """Woken by a batch's worth, the worker sends full batches only (a request's cost is
    fixed); the rest goes first in the next batch, or within the interval, or at a flush."""
    from otel_train.records.span_rows import RowSpanFactory

    def records(*steps):
        return [(f"s{i:02d}", 1, 2, 1) for i in steps]

    exporter = EncodingRecording()
    proc = BoundedBatchSpanProcessor(exporter, DropCounter(), max_queue_size=100,
                                     max_batch_size=4, interval_seconds=30)
    proc.use_rows(RowSpanFactory(None, None, {}))
    proc.on_records(records(0, 1, 2))  # 6 spans: one full batch goes, 2 wait
    deadline = time.monotonic() + 5
    while not exporter.batches and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert exporter.batches == [["s00a", "s00b", "s01a", "s01b"]] and proc.queued == 2
    proc.on_records(records(3))  # 4 queued: the next full batch, the oldest first
    while len(exporter.batches) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert exporter.batches[1] == ["s02a", "s02b", "s03a", "s03b"]
    proc.on_records(records(4))
    assert proc.force_flush(5000)  # a flush takes what is left
    assert exporter.batches[2:] == [["s04a", "s04b"]]
    proc.shutdown(1.0)

    timed = BoundedBatchSpanProcessor(EncodingRecording(), DropCounter(), max_queue_size=100,
                                      max_batch_size=4, interval_seconds=0.2)
    timed.use_rows(RowSpanFactory(None, None, {}))
    timed.on_records(records(0, 1, 2))
    while timed.queued and time.monotonic() < deadline:
        time.sleep(0.01)
    assert timed.queued == 0  # the interval sent the rest without a flush
    timed.shutdown(1.0)


def test_spans_queued_while_the_worker_takes_batches_are_each_exported_or_dropped_once():
    """A producer queueing frames against a worker taking batches (the whole queue, or a
    batch off more) and a bound that drops the oldest: every span is exported or counted
    dropped, exactly once, in the order queued."""
    from otel_train.records.span_rows import RowSpanFactory

    exporter = EncodingRecording()
    drops = DropCounter()
    proc = BoundedBatchSpanProcessor(exporter, drops, max_queue_size=300, max_batch_size=64,
                                     interval_seconds=0.001)
    proc.use_rows(RowSpanFactory(None, None, {}))
    frames, per_frame = 400, 20  # records of two spans each
    for f in range(frames):
        proc.on_records([(f"s{f * per_frame + i:06d}", 1, 2, 1) for i in range(per_frame)])
        if f % 50 == 0:
            time.sleep(0.002)
    assert proc.force_flush(10000)
    proc.shutdown(2.0)
    sent = [name for batch in exporter.batches for name in batch]
    assert len(sent) == len(set(sent)) and sent == sorted(sent)
    assert max(len(b) for b in exporter.batches) <= 64
    assert len(sent) + drops.total == frames * per_frame * 2
    assert proc.exported == len(sent)


def test_failed_and_raising_exports_are_counted_and_warned_once(caplog):
    drops = DropCounter()
    failing = BoundedBatchSpanProcessor(Recording(SpanExportResult.FAILURE), drops,
                                        max_batch_size=2, interval_seconds=0.02)
    raising = BoundedBatchSpanProcessor(Recording(raises=True), drops,
                                        max_batch_size=2, interval_seconds=0.02)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for span in _spans(10):
            failing.on_end(span)
            raising.on_end(span)
            time.sleep(0.005)
        failing.force_flush(2000)
        raising.force_flush(2000)
    failing.shutdown(1.0)
    raising.shutdown(1.0)
    assert drops.counts() == {"export_failed": 20}  # every span counted exactly once
    assert failing.export_failures >= 1
    assert failing.exported == 0
    failed_msgs = [r for r in caplog.records if "export failed" in r.getMessage()]
    assert 1 <= len(failed_msgs) <= 2  # one per processor at most, not one per batch


def test_shutdown_is_bounded_when_the_exporter_hangs_and_counts_the_rest():
    exporter = Recording()
    exporter.release.clear()
    drops = DropCounter()
    proc = BoundedBatchSpanProcessor(exporter, drops, max_batch_size=2, interval_seconds=0.02)
    for span in _spans(6):
        proc.on_end(span)
    assert exporter.entered.wait(5)
    t0 = time.monotonic()
    proc.shutdown(0.3)
    elapsed = time.monotonic() - t0
    assert 0.3 <= elapsed < 0.3 + 0.5
    assert drops.counts() == {"shutdown_timeout": 6}
    proc.on_end(_spans(1)[0])  # after shutdown: counted, not queued
    assert drops.counts() == {"shutdown_timeout": 7}
    exporter.release.set()


def test_a_full_queue_drops_the_oldest_spans_first():
    exporter = Recording()
    exporter.release.clear()
    drops = DropCounter()
    proc = BoundedBatchSpanProcessor(exporter, drops, max_queue_size=3, max_batch_size=1,
                                     interval_seconds=0.02)
    spans = _spans(8)
    proc.on_end(spans[0])
    assert exporter.entered.wait(5)  # s0 is in flight
    for span in spans[1:]:
        proc.on_end(span)
    exporter.release.set()
    assert proc.force_flush(5000)
    proc.shutdown(1.0)
    assert [b[0] for b in exporter.batches] == ["s0", "s5", "s6", "s7"]
    assert drops.counts() == {"export_queue_full": 4}


# -- against real collectors: outages, rejections, hangs, size limits --------------------------

def _receiver(protocol: str, **kwargs: object) -> GrpcOtlpReceiver | HttpOtlpReceiver:
    return GrpcOtlpReceiver(**kwargs) if protocol == "grpc" else HttpOtlpReceiver(**kwargs)


def _otlp_processor(receiver, protocol: str, drops: DropCounter, timeout_seconds: float = 2.0,
                    **kwargs: object) -> BoundedBatchSpanProcessor:
    plan = ExportPlan("otlp", protocol, receiver.endpoint, timeout_seconds=timeout_seconds,
                      max_request_bytes=int(kwargs.pop("max_request_bytes", 4 << 20)))
    options = {"max_queue_size": 100_000, "max_batch_size": 64, "interval_seconds": 0.05}
    options.update(kwargs)
    return BoundedBatchSpanProcessor(create_exporter(plan, env={}), drops, **options)


PROTOCOLS = ["grpc", "http/protobuf"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_flapping_collector_gets_what_was_emitted_while_it_was_up_each_span_once(protocol):
    spans = _spans(1400)
    drops = DropCounter()
    with _receiver(protocol) as receiver:
        proc = _otlp_processor(receiver, protocol, drops)
        emitted: list[tuple[str, float]] = []
        with Flapping(receiver, down_seconds=1.0, up_seconds=1.0) as flapping:
            deadline = time.monotonic() + 7.0
            for span in spans:  # ~200 spans/s through four outages
                if time.monotonic() > deadline:
                    break
                emitted.append((span.name, time.monotonic()))
                proc.on_end(span)
                time.sleep(0.005)
        assert flapping.outages >= 3
        assert proc.force_flush(10_000)
        proc.shutdown(2.0)
        names = [s.name for s in receiver.spans()]
    assert len(names) == len(set(names))  # no span delivered twice
    assert len(names) + drops.total == len(emitted)  # every span delivered or counted
    while_up = {name for name, at in emitted if flapping.was_up_at(at)}
    share = len(while_up & set(names)) / len(while_up)
    assert share >= 0.9, f"{share:.0%} of the spans emitted while the collector was up arrived"


@pytest.mark.parametrize("protocol,mode,code", [
    ("grpc", "unavailable", None),
    ("grpc", "reject", "RESOURCE_EXHAUSTED"),
    ("http/protobuf", "unavailable", None),  # 503
    ("http/protobuf", "reject", 429),
])
def test_a_retryable_refusal_keeps_the_spans_queued_until_the_collector_takes_them(
        protocol, mode, code):
    drops = DropCounter()
    with _receiver(protocol, mode=mode, reject_code=code) as receiver:
        proc = _otlp_processor(receiver, protocol, drops)
        for span in _spans(30):
            proc.on_end(span)
        deadline = time.monotonic() + 5
        while receiver.requests_count < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert receiver.requests_count >= 2  # refused, then retried
        receiver.mode = "ok"
        assert proc.force_flush(10_000)
        proc.shutdown(1.0)
        names = sorted(s.name for s in receiver.spans())
    assert names == sorted(f"s{i}" for i in range(30))
    assert drops.counts() == {}


@pytest.mark.parametrize("protocol,code", [
    ("http/protobuf", 401), ("http/protobuf", 500), ("grpc", "UNAUTHENTICATED")])
def test_a_collector_that_rejects_for_good_costs_those_batches_only(protocol, code, caplog):
    drops = DropCounter()
    with _receiver(protocol, mode="reject", reject_code=code) as receiver:
        proc = _otlp_processor(receiver, protocol, drops, max_batch_size=10)
        with caplog.at_level(logging.WARNING, logger="otel_train"):
            for span in _spans(20):
                proc.on_end(span)
            assert proc.force_flush(5000)
        receiver.mode = "ok"  # e.g. the token was fixed
        later = _spans(5)
        for span in later:
            proc.on_end(span)
        assert proc.force_flush(5000)
        proc.shutdown(1.0)
        delivered = len(receiver.spans())
    assert drops.counts() == {"export_failed": 20}
    assert delivered == 5
    assert len([r for r in caplog.records if "rejected" in r.getMessage()]) == 1


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_hanging_collector_holds_an_export_no_longer_than_the_export_timeout(protocol):
    drops = DropCounter()
    with _receiver(protocol, mode="hang", hang_seconds=20) as receiver:
        proc = _otlp_processor(receiver, protocol, drops, timeout_seconds=0.5)
        for span in _spans(10):
            proc.on_end(span)
        receiver.wait_for_requests(1)
        t0 = time.monotonic()
        while not drops.total and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        gave_up_after = time.monotonic() - t0
        # Given up after its timeout, counted (it may have arrived: never sent twice).
        assert drops.counts() == {"export_failed": 10}
        assert gave_up_after < 0.5 + 1.0
        receiver.mode = "ok"
        for span in _spans(3):
            proc.on_end(span)
        assert proc.force_flush(10_000)
        proc.shutdown(1.0)
        assert len(receiver.spans()) == 3


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_shutdown_interrupts_an_export_in_flight_and_counts_it(protocol):
    drops = DropCounter()
    with _receiver(protocol, mode="hang", hang_seconds=20) as receiver:
        proc = _otlp_processor(receiver, protocol, drops, timeout_seconds=10.0)
        for span in _spans(6):
            proc.on_end(span)
        receiver.wait_for_requests(1)
        t0 = time.monotonic()
        proc.shutdown(0.3)
        elapsed = time.monotonic() - t0
        assert drops.counts() == {"shutdown_timeout": 6}
        assert elapsed < 0.3 + 0.2
        assert not proc._thread.is_alive()
    if protocol == "grpc":
        assert receiver.spans() == []  # the call was cancelled: the collector kept nothing
    else:
        # An HTTP request cannot be cancelled: its daemon thread is left to finish (or die
        # with the process). Here the collector answered when it closed: the count follows.
        deadline = time.monotonic() + 5
        while drops.total and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(receiver.spans()) == 6 and drops.counts() == {}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_batches_are_split_so_no_request_exceeds_the_limit(protocol):
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    for i in range(40):
        with tracer.start_as_current_span(f"big{i}") as span:
            span.set_attribute("blob", "x" * 10_000)
    drops = DropCounter()
    with _receiver(protocol) as receiver:
        proc = _otlp_processor(receiver, protocol, drops, max_request_bytes=65_536)
        for span in memory.get_finished_spans():
            proc.on_end(span)
        assert proc.force_flush(10_000)
        proc.shutdown(1.0)
        sizes = [r.ByteSize() for r in receiver.requests()]
        names = sorted(s.name for s in receiver.spans())
    assert names == sorted(f"big{i}" for i in range(40))
    assert max(sizes) <= 65_536 and len(sizes) >= 7
    assert drops.total == 0


def test_a_span_larger_than_the_limit_is_dropped_and_counted_the_rest_arrives():
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    for i in range(5):
        with tracer.start_as_current_span(f"s{i}") as span:
            span.set_attribute("blob", "x" * (100_000 if i == 2 else 10))
    drops = DropCounter()
    with GrpcOtlpReceiver() as receiver:
        proc = _otlp_processor(receiver, "grpc", drops, max_request_bytes=65_536)
        for span in memory.get_finished_spans():
            proc.on_end(span)
        assert proc.force_flush(5000)
        proc.shutdown(1.0)
        names = sorted(s.name for s in receiver.spans())
    assert names == ["s0", "s1", "s3", "s4"]
    assert drops.counts() == {"export_failed": 1}


def test_a_receiver_limit_below_ours_is_learnt_from_its_answer():
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    for i in range(12):
        with tracer.start_as_current_span(f"s{i}") as span:
            span.set_attribute("blob", "x" * 1_000_000)  # 12 MB in all, 1 MB a span
    drops = DropCounter()
    with GrpcOtlpReceiver() as receiver:  # grpcio's default: 4 MiB
        # We were told the receiver takes 64 MiB: its first answer corrects that.
        proc = _otlp_processor(receiver, "grpc", drops, max_request_bytes=64 << 20)
        for span in memory.get_finished_spans():
            proc.on_end(span)
        assert proc.force_flush(10_000)
        proc.shutdown(1.0)
        names = sorted(s.name for s in receiver.spans())
    assert names == sorted(f"s{i}" for i in range(12))
    assert drops.total == 0


def test_jsonl_exporter_appends_one_json_object_per_span(tmp_path):
    path = tmp_path / "sub" / "spans.jsonl"
    exporter = JsonLinesSpanExporter(path)
    spans = _spans(3)
    assert exporter.export(spans[:2]) is SpanExportResult.SUCCESS
    assert exporter.export(spans[2:]) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert exporter.export(spans) is SpanExportResult.FAILURE  # closed
    assert len(path.read_text().splitlines()) == 3
    rows = read_spans_jsonl(path)
    assert [r["name"] for r in rows] == ["s0", "s1", "s2"]
    assert rows[0]["context"]["trace_id"] == f"0x{spans[0].context.trace_id:032x}"


# -- exporter choice in a whole run ---------------------------------------------------------

def _one_step(run: otel_train.Run) -> None:
    for step in run.steps([0]):
        with step.phase("forward"):
            pass


def test_without_endpoint_or_exporter_spans_go_to_the_status_dir_file(tmp_path, capsys):
    with otel_train.start_run(prometheus_port=None, console=True, status_dir=str(tmp_path),
                              run_id="file-run") as run:
        _one_step(run)
    path = tmp_path / "spans.jsonl.gz"  # OTLP JSON lines, gzip by default
    assert run.spans_path == path
    spans = read_file_spans(path)
    assert sorted(s.name for s in spans) == ["data", "forward", "train.step"]
    assert one(spans, "train.step").attributes["train.run.id"] == "file-run"
    captured = capsys.readouterr()
    assert (captured.out + captured.err).count(str(path)) == 1


def test_the_default_status_dir_is_per_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with otel_train.start_run(prometheus_port=None, console=False, run_id="cwd-run") as run:
        _one_step(run)
    expected = tmp_path / "otel-train-runs" / "cwd-run" / "spans.jsonl.gz"
    assert run.spans_path.resolve() == expected
    assert len(read_file_spans(expected)) == 3


def test_otel_traces_exporter_none_writes_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    with otel_train.start_run(prometheus_port=None, console=False,
                              status_dir=str(tmp_path)) as run:
        _one_step(run)
    assert run.export_plan.kind == "none"
    assert run.spans_path is None
    assert not list(tmp_path.glob("*.jsonl*"))


def test_otel_sdk_disabled_exports_nothing_but_training_works(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    from opentelemetry import trace
    seen = []
    with otel_train.start_run(prometheus_port=None, console=False,
                              status_dir=str(tmp_path)) as run:
        for step in run.steps([1, 2, 3]):
            with step.phase("forward"):
                with trace.get_tracer("u").start_as_current_span("user") as s:
                    assert not s.is_recording()
                seen.append(step.batch)
        with run.monitor("eval"):
            pass
    assert seen == [1, 2, 3]
    assert run.export_plan.kind == "none"
    assert not list(tmp_path.glob("*.jsonl*"))
    assert run.dropped_spans() == {}


def test_an_always_off_sampler_exports_nothing_but_training_works(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    with otel_train.start_run(prometheus_port=None, console=False, status_dir=str(tmp_path),
                              export_interval_seconds=0.1) as run:
        for step in run.steps([0, 1]):
            with step.phase("forward"):
                pass
    assert run.spans_path is not None
    assert not run.spans_path.exists() or read_file_spans(run.spans_path) == []
    assert run.dropped_spans() == {}


def _run_with_a_huge_attribute(tmp_path, receiver) -> otel_train.Run:
    with otel_train.start_run(prometheus_port=None, console=False, status_dir=str(tmp_path),
                              exporter="otlp", otlp_protocol="grpc",
                              otlp_endpoint=receiver.endpoint,
                              export_interval_seconds=0.05) as run:
        for step in run.steps(range(5)):
            with step.phase("forward"):
                pass
            if step.index == 1:
                step.set_attribute("notes", "n" * (5 << 20))  # 5 MiB
        assert run.flush(10)
    return run


def test_a_5_mib_attribute_over_grpc_is_cut_and_its_batch_and_the_run_still_arrive(tmp_path):
    with GrpcOtlpReceiver() as receiver:  # grpcio's default limit: 4 MiB a message
        run = _run_with_a_huge_attribute(tmp_path, receiver)
        spans = receiver.wait_for_spans(15, 10)
    roots = {s.attributes["train.step"]: s for s in spans if s.name == "train.step"}
    assert sorted(roots) == [0, 1, 2, 3, 4]
    assert roots[1].attributes["notes"] == "n" * 4096  # the default cap
    assert run.dropped_spans() == {}


def test_with_a_length_limit_above_the_message_limit_only_that_span_is_lost(
        tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", str(8 << 20))
    with GrpcOtlpReceiver() as receiver:
        run = _run_with_a_huge_attribute(tmp_path, receiver)
        spans = receiver.wait_for_spans(14, 10)
    assert len(spans) == 14  # every span but step 1's root, which alone is over 4 MiB
    assert {s.attributes["train.step"] for s in spans if s.name == "train.step"} == {0, 2, 3, 4}
    assert run.dropped_spans() == {"export_failed": 1}


def test_otel_attribute_value_length_limit_cuts_what_a_run_sends(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "100")
    with GrpcOtlpReceiver() as receiver:
        _run_with_a_huge_attribute(tmp_path, receiver)
        spans = receiver.wait_for_spans(15, 10)
    (root,) = [s for s in spans if s.name == "train.step" and "notes" in s.attributes]
    assert root.attributes["notes"] == "n" * 100


def test_a_frame_of_records_encoded_at_once_counts_the_one_that_fails_and_queues_the_rest():
    """An OTLP exporter's items (span_fields.OtlpSpanFields) take the stage's records a frame
    at a time: a record that cannot be encoded is counted (build_error, its spans), the
    others of the frame are queued, in order, unsampled ones left out."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from otel_train.export.otlp.span_fields import OtlpSpanFields
    from otel_train.records.span_rows import RowSpanFactory

    class Encoded(Recording):
        def span_items(self, factory):
            return OtlpSpanFields(factory.run_constants)

    phase = ("forward", "train", None, 5, 1, 7, 11, 19, None, (), None, None)

    def rec(i, sampled=True, phases=(phase,)):
        return ("train.step", i + 1, 7, 1 if sampled else 0, 10, 20,
                {"train.step": i, "train.slow": False}, None, (), list(phases), None)

    exporter = Encoded()
    drops = DropCounter()
    proc = BoundedBatchSpanProcessor(exporter, drops, interval_seconds=30)
    proc.use_rows(RowSpanFactory(Resource({}), InstrumentationScope("t"), {"run": "x"}))
    frame = [rec(0), rec(1), rec(2, phases=[("forward",)] * 3), rec(3, sampled=False), rec(4)]
    proc.on_records(frame)
    assert drops.counts() == {"build_error": 4}  # the broken record's root and 3 phases
    assert proc.queued == 6  # steps 0, 1 and 4: a phase and a root each
    proc.shutdown(1.0)
