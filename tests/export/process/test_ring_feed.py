"""The step ring read in the exporter process (ring_feed.py): the ring's steps built there
equal the training process's records, queued records come in at their markers in the order
the steps ended, a marker whose record never comes is passed over (bounded, counted), and
``tail`` moves only past what the export stage settled."""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
from train_helpers import clean_env  # noqa: F401  (autouse fixture)

from ring_helpers import (OFFSET, FeedChild, RingExporter, make_feed, ring_builder,
                          train_into)

from otel_train.common.drop_counter import DropCounter
from otel_train.export.process import ring_feed
from otel_train.pipeline.ring_source import RingSource
from otel_train.recording.recorder import MonitorRecord, Recorder
from otel_train.recording.step_ring import StepRing
from otel_train.records.span_rows import C_ATTRS
from otel_train.records.step_records import StepRecordBuilder

pytestmark = pytest.mark.timeout(60)


def _queued_records(rec: Recorder, builder: StepRecordBuilder) -> list[tuple[Any, ...]]:
    """What the training process's span worker sends: the queue's records, built there."""
    out = []
    while rec.queue:
        out.append(builder.record(rec.queue.popleft()))
    return out


def test_ring_steps_built_in_the_exporter_process_equal_the_training_process_records():
    rec = Recorder(100, DropCounter(), None)
    ring = StepRing.create(1 << 16)
    source = RingSource(rec, ring, exporter=RingExporter())  # the child reads; nothing here
    train_into(rec, range(6), queued_at=())
    # The same steps built here, from the ring read back by the training process's reader.
    from otel_train.recording.step_ring_reader import StepRingReader

    here = StepRingReader(StepRing.open(__import__("os").dup(ring.fd)), move_tail=False)
    random.seed(3)
    want = [ring_builder().record(s) for s in here.read()]
    child = FeedChild()
    feed = make_feed(ring, child)
    random.seed(3)
    feed.catch_up(time.monotonic() + 5)
    got = [r for recs, _ in child.handed for r in recs]
    assert got == want and len(got) == 6
    assert feed.counts()["steps"] == 6 and source.records is rec.queue


def test_queued_records_go_on_at_their_markers_in_the_order_the_steps_ended():
    rec = Recorder(100, DropCounter(), None)
    ring = StepRing.create(1 << 16)
    RingSource(rec, ring, exporter=RingExporter())
    train_into(rec, range(4), queued_at=(1, 2))
    with MonitorRecord(rec, "evaluate"):
        pass
    train_into(rec, range(4, 6), queued_at=(5,))
    child = FeedChild()
    feed = make_feed(ring, child)
    queued = _queued_records(rec, ring_builder())
    assert len(queued) == 4
    feed.catch_up(time.monotonic() + 0.2)  # marker 0 waits for its record: step 0 only
    assert child.names() == ["train.step:0"]
    feed.add_frame(queued[:2], [], 0, [0, 1])
    feed.add_frame(queued[2:], [], 0, [2, 3])
    feed.catch_up(time.monotonic() + 5)
    assert child.names() == ["train.step:0", "train.step:1", "train.step:2", "train.step:3",
                             "evaluate:3", "train.step:4", "train.step:5"]
    assert feed.counts()["markers_unmatched"] == 0


def test_a_marker_whose_record_never_comes_is_passed_over_bounded_and_counted(monkeypatch):
    monkeypatch.setattr(ring_feed, "MARKER_WAIT_SECONDS", 0.05)
    rec = Recorder(100, DropCounter(), None)
    ring = StepRing.create(1 << 16)
    RingSource(rec, ring, exporter=RingExporter())
    train_into(rec, range(5), queued_at=(1, 3))
    child = FeedChild()
    feed = make_feed(ring, child)
    queued = _queued_records(rec, ring_builder())
    # Record 0's frame was dropped in the training process (export_queue_full): record 1
    # comes, so marker 0 is passed over at once; then nothing more waits.
    feed.add_frame(queued[1:], [], 0, [1])
    feed.catch_up(time.monotonic() + 5)
    assert child.names() == ["train.step:0", "train.step:2", "train.step:3", "train.step:4"]
    assert feed.counts()["markers_unmatched"] == 1
    # A marker with no frame at all: waited for MARKER_WAIT_SECONDS, then passed over.
    train_into(rec, range(5, 7), queued_at=(5,))
    rec.queue.clear()
    deadline = time.monotonic() + 5
    while feed.counts()["markers_unmatched"] < 2 and time.monotonic() < deadline:
        feed.catch_up(time.monotonic() + 0.1)
    assert feed.counts()["markers_unmatched"] == 2
    assert child.names()[-1] == "train.step:6"
    # A record coming after its marker was passed over goes on at once: never lost.
    feed.add_frame(queued[:1], [], 0, [0])
    feed.catch_up(time.monotonic() + 5)
    assert child.names()[-1] == "train.step:1" and feed.counts()["late_records"] == 1


def test_tail_moves_only_past_what_the_stage_settled_and_frames_settled_counts_theirs():
    rec = Recorder(100, DropCounter(), None)
    ring = StepRing.create(1 << 16)
    RingSource(rec, ring, exporter=RingExporter())
    train_into(rec, range(3), queued_at=(1,))
    child = FeedChild()
    feed = make_feed(ring, child)
    queued = _queued_records(rec, ring_builder())
    feed.add_frame(queued, [("row",)], 0, [0])  # one queued step (3 spans) and a user row
    feed.catch_up(time.monotonic() + 5)
    # Handed on: step 0 (3 spans), step 1 from the frame (3), step 2 (3), the row (1).
    assert child.names() == ["train.step:0", "train.step:1", "train.step:2"]
    counters = ring.counters()
    assert counters["tail"] == 0 < counters["head"]  # nothing settled yet
    settlement = feed.settlement
    settlement.settle(3, partial=True)  # step 0 settled: freed once the report is sent
    assert ring.counters()["tail"] == 0 < settlement.position
    settlement.release_settled()
    assert 0 < ring.counters()["tail"] == settlement.position < counters["head"]
    assert feed.counts()["frames_settled"] == 0
    # The frame's hand-over: its row, then its record's three spans.
    settlement.settle(5, partial=True)  # two of the frame's four spans
    assert feed.counts()["frames_settled"] == 2 and feed.counts()["ring_partial_spans"] == 0
    settlement.settle(8, partial=True)  # the frame's, and one of step 2's spans
    assert feed.counts()["frames_settled"] == 4 and feed.counts()["ring_partial_spans"] == 1
    settlement.settle(10, partial=True)  # everything
    settlement.release_settled()
    assert ring.counters()["tail"] == counters["head"] == feed.counts()["ring_position"]
    assert feed.counts()["frames_settled"] == 4 and feed.counts()["ring_partial_spans"] == 0


def test_train_startup_is_made_in_the_exporter_process_ahead_of_the_first_step():
    from otel_train.records.envelope_records import StartupRecordMaker

    rec = Recorder(100, DropCounter(), None)
    ring = StepRing.create(1 << 16)
    RingSource(rec, ring, exporter=RingExporter())
    maker = StartupRecordMaker(time.time_ns() - 10**9, "process", time.perf_counter_ns(),
                               OFFSET, {"train.attempt": 2, "train.restart.lost_seconds": 1.5})
    train_into(rec, range(2), queued_at=())
    child = FeedChild()
    feed = make_feed(ring, child, startup=maker)
    feed.catch_up(time.monotonic() + 5)
    names = child.names()
    assert names[0].startswith("train.startup") and names[1:] == ["train.step:0",
                                                                   "train.step:1"]
    first = child.handed[1][0][0]
    assert first[C_ATTRS]["train.attempt"] == 2  # a resumed run's first step says so
    assert feed.counts()["startup_done"]


def test_ring_steps_built_in_the_exporter_process_carry_the_training_process_memory(
        tmp_path):
    """Host RSS on every N-th step (memory_peaks' CPU fallback) is the training process's
    resident memory, read by the exporter process by its pid, not the child's own."""
    from train_helpers import read_file_spans, start_test_run

    ballast = bytearray(400 << 20)
    ballast[::4096] = b"x" * len(ballast[::4096])  # resident, not just reserved
    run = start_test_run(tmp_path, step_ring="on", startup_span=False)
    assert run._telemetry.client.reads_ring
    every = run._telemetry.builder.host_rss_every_steps
    assert every > 0
    for step in run.steps(range(3 * every)):
        with step.phase("forward"):
            pass
    run.shutdown(timeout=10)
    roots = [s for s in read_file_spans(tmp_path / "spans.jsonl") if s.name == "train.step"]
    rss = {s.attributes["train.step"]: s.attributes.get("train.memory.host_rss_bytes")
           for s in roots}
    assert run._telemetry.client._reports.ring_counts["steps"] == 3 * every
    assert [i for i, v in sorted(rss.items()) if v is not None] == [0, every, 2 * every]
    assert all(v > 400 << 20 for v in rss.values() if v is not None)
    del ballast


@pytest.mark.parametrize("step_ring", ["off", "on"])
def test_collectives_timed_in_the_training_process_reach_the_steps_built_from_the_ring(
        tmp_path, step_ring):
    """The training process sends the collectives' entries on the worker's pace; a ring
    step built in the exporter process waits (bounded) until they cover its end: the same
    train.comm.* attributes as when the span worker builds it here."""
    from train_helpers import read_file_spans, start_test_run

    from otel_train.common import attributes as A
    from otel_train.recording.collectives import KIND_OVERLAPPED

    run = start_test_run(tmp_path, step_ring=step_ring, startup_span=False)
    assert run._telemetry.client.reads_ring == (step_ring == "on")
    log = run._telemetry.collective_log()
    for step in run.steps(range(40)):
        with step.phase("backward"):
            if step.index % 2 == 0:
                entry = log.begin("all_reduce", 4096 * (1 + step.index), KIND_OVERLAPPED)
                time.sleep(0.001)
                log.end(entry)
        time.sleep(0.002)
    run.shutdown(timeout=10)
    roots = {s.attributes["train.step"]: s for s in read_file_spans(tmp_path / "spans.jsonl")
             if s.name == "train.step"}
    assert sorted(roots) == list(range(40))
    got = {i: (r.attributes.get(A.COMM_COUNT), r.attributes.get(A.COMM_BYTES))
           for i, r in roots.items()}
    assert got == {i: ((1, 4096 * (1 + i)) if i % 2 == 0 else (None, None))
                   for i in range(40)}


def test_a_child_that_cannot_read_the_ring_exits_and_the_training_process_reads_it(
        tmp_path, monkeypatch):
    """The ring's reader cannot be made in the exporter process: it says why and exits, the
    training process takes over and reads the ring itself; nothing is lost."""
    from train_helpers import read_file_spans, start_test_run

    from otel_train.export.process import launch

    monkeypatch.setattr(launch, "_BOOT", launch._BOOT.replace(
        "from otel_train.export.process.child import child_main; ",
        "from otel_train.export.process import ring_feed; "
        "ring_feed.ChildRingFeed.__init__ = lambda *a, **k: 1 / 0; "
        "from otel_train.export.process.child import child_main; "))
    run = start_test_run(tmp_path, step_ring="on", startup_span=False)
    client = run._telemetry.client
    assert client.reads_ring
    for step in run.steps(range(100)):
        with step.phase("forward"):
            pass
    run.flush(timeout_seconds=20)
    run.shutdown(timeout=10)
    assert not run._telemetry.worker._ring_source.in_child
    assert run.dropped_spans() == {}
    assert len(read_file_spans(tmp_path / "spans.jsonl")) == 100 * 3


def test_a_marker_whose_record_failed_to_build_is_passed_at_once_not_waited_for():
    rec = Recorder(100, DropCounter(), None)
    ring = StepRing.create(1 << 16)
    exporter = RingExporter()
    source = RingSource(rec, ring, exporter=exporter)
    train_into(rec, range(3), queued_at=(1,))
    source.skip([0])  # the training process could not build queued record 0
    assert exporter.sent[-1] == ("ring_skip", [0])
    child = FeedChild()
    feed = make_feed(ring, child)
    feed.skip(exporter.sent[-1][1])
    began = time.monotonic()
    feed.catch_up(time.monotonic() + 5)
    assert time.monotonic() - began < ring_feed.MARKER_WAIT_SECONDS
    assert child.names() == ["train.step:0", "train.step:2"]
    assert feed.counts()["markers_unmatched"] == 0  # counted where it failed


@pytest.mark.parametrize("step_ring", ["off", "on"])
def test_attribute_limits_apply_to_the_steps_built_in_the_exporter_process(
        tmp_path, monkeypatch, step_ring):
    """The OTEL_*ATTRIBUTE* limits the training process reads hold for the ring's steps
    built in the exporter process (it inherits the environment and reads them alike)."""
    from train_helpers import read_file_spans, start_test_run

    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "5")
    run = start_test_run(tmp_path, step_ring=step_ring, startup_span=False)
    assert run._telemetry.client.reads_ring == (step_ring == "on")
    for step in run.steps(range(5)):
        with step.phase("forward"):
            pass
        step.set_attribute("tag", "abcdefghij")  # a short string: the ring carries it
    run.shutdown(timeout=10)
    roots = [s for s in read_file_spans(tmp_path / "spans.jsonl") if s.name == "train.step"]
    assert len(roots) == 5 and {s.attributes["tag"] for s in roots} == {"abcde"}
    if step_ring == "on":
        assert run._telemetry.client._reports.ring_counts["steps"] == 5


@pytest.mark.parametrize("step_ring", ["off", "auto"])
def test_ring_steps_built_in_the_exporter_process_carry_the_last_sampled_device_verdict(
        tmp_path, monkeypatch, step_ring):
    """On an accelerator, the steps with device readings (one in N) are queued and built in
    the training process; the steps between them, read from the ring and built in the
    exporter process, carry their verdict (host-bound here) as the queue path's do, not
    the ``compute`` the host clock alone would say."""
    from train_helpers import read_file_spans, start_test_run, use_fake_accelerator

    from otel_train.common import attributes as A

    acc = use_fake_accelerator(monkeypatch)
    run = start_test_run(tmp_path, step_ring=step_ring, startup_span=False,
                         device_events_every_steps=3)
    assert run._telemetry.client.reads_ring == (step_ring == "auto")
    for step in run.steps(range(9)):
        for name in ("forward", "backward"):
            with step.phase(name):
                time.sleep(0.02)  # the device keeps pace with slow Python: host-bound
                acc.launch(0.001)
    run.shutdown(timeout=10)
    roots = {s.attributes["train.step"]: s for s in read_file_spans(tmp_path / "spans.jsonl")
             if s.name == "train.step"}
    assert sorted(roots) == list(range(9))
    sampled = [i for i, s in roots.items() if A.DEVICE_BUSY in s.attributes]
    assert sampled == [0, 3, 6]
    assert {i: s.attributes[A.STEP_BOUND] for i, s in roots.items()} == {
        i: A.BOUND_HOST for i in range(9)}
    if step_ring == "auto":
        assert run._telemetry.client._reports.ring_counts["steps"] == 6  # built there


def test_a_frame_of_user_span_rows_alone_ahead_of_a_record_does_not_hold_up_its_marker():
    """The training process sent a frame of user span rows only, then the frame with the
    queued record: the reader meeting the record's marker finds it at once (the rows go
    on first, in frame order), it does not wait out MARKER_WAIT_SECONDS."""
    rec = Recorder(100, DropCounter(), None)
    ring = StepRing.create(1 << 16)
    source = RingSource(rec, ring, exporter=RingExporter())
    train_into(rec, range(3), queued_at=(1,))
    queued = _queued_records(rec, ring_builder())
    assert len(queued) == 1
    child = FeedChild()
    feed = make_feed(ring, child)
    user_row = ("user-root",)  # a row as the feed passes it on: opaque here
    feed.add_frame([], [user_row], 0, [])
    feed.add_frame(queued, [], 0, [source.take_ordinal()])
    began = time.monotonic()
    feed.catch_up(time.monotonic() + 5)
    assert time.monotonic() - began < ring_feed.MARKER_WAIT_SECONDS
    assert child.names() == ["train.step:0", "train.step:1", "train.step:2"]
    assert [rows for _, rows in child.handed if rows] == [[user_row]]
    assert feed.counts()["markers_unmatched"] == 0
