"""The step ring: finished flat steps written by the hot path into shared memory, read back
in order by another process or this one; a full ring drops the newest step, counted."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from train_helpers import clean_env  # noqa: F401  (clean_env: autouse)

from otel_train.common.drop_counter import DropCounter
from otel_train.recording import recorder as recorder_module
from otel_train.recording.recorder import Recorder
from otel_train.recording.step_ring_reader import StepRingReader
from otel_train.recording.step_ring import (
    MAX_STRING_BYTES,
    QUEUED,
    StepRing,
    StepRingWriter,
    attach_ring,
    detach_ring,
    ring_capacity_bytes,
)

pytestmark = pytest.mark.timeout(60)
WRITERS = ["attached"] + (["python"] if recorder_module.ACCELERATED else [])


def _write(rec: Recorder, ring: StepRing, how: str) -> None:
    """Steps from now on go into ``ring``: attached to the recorder (the C writer where it
    was built), or the pure-Python writer called on each queued step afterwards."""
    if how == "attached":
        attach_ring(rec, ring)


def _loop(rec: Recorder, n: int, attrs: bool = False) -> list:
    steps = []
    for step in rec.steps(range(n), loader="train"):
        with step.phase("forward"):
            pass
        with step.monitor("val_loss"):
            pass
        if attrs and step.index % 3 == 0:
            step.set_attribute("loss", step.index / 7)
        steps.append(step)
    return steps


@pytest.mark.parametrize("how", WRITERS)
def test_steps_come_back_in_order_with_their_times_phases_and_loader(how):
    rec = Recorder(100, DropCounter(), None)
    ring = StepRing.create(1 << 16)
    _write(rec, ring, how)
    steps = _loop(rec, 20, attrs=True)
    if how == "python":
        writer = StepRingWriter(ring, Recorder(100, rec.drops, None))
        assert all(writer.write_step(s) for s in list(rec.queue))
        rec.queue.clear()
    assert not rec.queue  # every flat step went into the ring, none to the queue
    got = StepRingReader(StepRing.open(os.dup(ring.fd))).read()
    assert [s.index for s in got] == list(range(20))
    for want, back in zip(steps, got):
        assert (back.start_ns, back.end_ns, back.loader) == (want.start_ns, want.end_ns, "train")
        assert back.ev[1::4] == want.ev[1::4] and back.ev[2::4] == want.ev[2::4]
        assert [(p.name, p.kind, p.loader) for p in back.ev[0::4]] == [
            ("data", "train", None), ("forward", "train", None), ("val_loss", "monitor", None)]
        assert back.attrs == want.attrs
        assert back.span_count() == want.span_count() == 4
    assert ring.counters()["written_steps"] == 20


def test_attribute_values_the_ring_carries_come_back_exactly_and_others_go_the_queue():
    rec = Recorder(100, DropCounter(), None)
    ring = StepRing.create(1 << 16)
    attach_ring(rec, ring)
    values = [True, False, 0, -(2**63), 2**63 - 1, 1.5, float("inf"), -0.0, "", "é" * 10,
              "x" * MAX_STRING_BYTES]
    for step in rec.steps(range(len(values)), None):
        step.set_attribute("v", values[step.index])
        step.set_attribute("name", "ok")
    refused = [2**63, "x" * (MAX_STRING_BYTES + 1), [1, 2], None, object()]
    for i, step in enumerate(rec.steps(range(len(refused)), None)):
        step.set_attribute("v", refused[i])
    got = StepRingReader(ring).read()
    assert got[len(values):] == [QUEUED] * len(refused)  # their places, in order
    got = got[:len(values)]
    back = [s.attrs["v"] for s in got]
    assert back == values and [type(v) for v in back] == [type(v) for v in values]
    assert str(back[7]) == "-0.0" and all(s.attrs["name"] == "ok" for s in got)
    assert [s.attrs["v"] for s in rec.queue] == refused[:4] + [rec.queue[4].attrs["v"]]


def test_steps_the_ring_cannot_carry_go_the_queue_and_a_marker_holds_their_place():
    rec = Recorder(100, DropCounter(), None)
    ring = StepRing.create(1 << 16)
    attach_ring(rec, ring)
    for step in rec.steps(range(6), "train"):
        if step.index == 1:  # nested
            with step.phase("forward"), step.phase("attention"):
                pass
        elif step.index == 2:  # a phase failed
            with pytest.raises(ValueError), step.phase("forward"):
                raise ValueError("boom")
        elif step.index == 3:  # ended inside a phase: left open
            step.phase("backward").__enter__()
            step.end()
        elif step.index == 4:  # ids handed to a user span
            step.span_ids = {-1: 7}
        else:
            with step.phase("forward"):
                pass
    from otel_train.recording.recorder import MonitorRecord

    with MonitorRecord(rec, "evaluate"):  # run.monitor between steps: the queue's too
        pass
    assert [getattr(s, "index", "monitor") for s in rec.queue] == [1, 2, 3, 4, "monitor"]
    got = StepRingReader(ring).read()
    assert [s if s == QUEUED else s.index for s in got] == [0, QUEUED, QUEUED, QUEUED, QUEUED, 5,
                                                     QUEUED]


@pytest.mark.parametrize("how", WRITERS)
def test_a_full_ring_drops_the_newest_steps_and_counts_them_then_takes_steps_again(how):
    drops = DropCounter()
    rec = Recorder(1000, drops, None)
    ring = StepRing.create(4096)
    _write(rec, ring, how)
    _loop(rec, 60)
    if how == "python":
        writer = StepRingWriter(ring, Recorder(1000, drops, None))
        assert all(writer.write_step(s) for s in list(rec.queue))
        rec.queue.clear()
    reader = StepRingReader(ring)
    first = reader.read()
    c = ring.counters()
    kept = len(first)
    assert 10 < kept < 60 and [s.index for s in first] == list(range(kept))
    assert c["dropped_steps"] == 60 - kept and c["dropped_spans"] == 4 * (60 - kept)
    assert drops.counts() == {"step_ring_full": 4 * (60 - kept)}
    assert kept + c["dropped_steps"] == 60  # written + dropped = ended
    # Read, the room is free again: the ring wraps and keeps every step of the next loop.
    for _ in range(20):
        more = _loop(rec, 5)
        if how == "python":
            assert all(writer.write_step(s) for s in list(rec.queue))
            more = list(rec.queue)
            rec.queue.clear()
        assert [s.index for s in reader.read()] == [s.index for s in more]
    assert ring.counters()["head"] > 3 * 4096, ring.counters()  # wrapped several times


def test_another_process_reads_the_ring_by_its_descriptor():
    rec = Recorder(100, DropCounter(), None)
    ring = StepRing.create(ring_capacity_bytes(100))
    attach_ring(rec, ring)
    _loop(rec, 7, attrs=True)
    code = textwrap.dedent("""
        import sys
        from otel_train.recording.step_ring import StepRing
        from otel_train.recording.step_ring_reader import StepRingReader
        steps = StepRingReader(StepRing.open(int(sys.argv[1]))).read()
        print([(s.index, [p.name for p in s.ev[0::4]], s.attrs) for s in steps])
    """)
    out = subprocess.run([sys.executable, "-c", code, str(ring.fd)], pass_fds=[ring.fd],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    want = [(i, ["data", "forward", "val_loss"], {"loss": i / 7} if i % 3 == 0 else None)
            for i in range(7)]
    assert out.strip() == repr(want)
    c = ring.counters()
    assert c["tail"] == c["head"] > 0  # the reader's tail, seen here: the room is free


def test_a_ring_is_refused_when_too_small_or_not_a_ring():
    with pytest.raises(ValueError, match="capacity_bytes must be >= 4096"):
        StepRing.create(100)
    fd = os.memfd_create("not-a-ring")
    os.ftruncate(fd, 8192)
    with pytest.raises(ValueError, match="not a step ring"):
        StepRing.open(fd)  # closes it


def test_a_detached_ring_sends_every_step_to_the_queue_again():
    rec = Recorder(100, DropCounter(), None)
    ring = StepRing.create(1 << 16)
    attach_ring(rec, ring)
    _loop(rec, 2)
    detach_ring(rec)
    _loop(rec, 3)
    assert [s.index for s in rec.queue] == [2, 3, 4]
    assert [s.index for s in StepRingReader(ring).read()] == [0, 1]


@pytest.mark.skipif(not recorder_module.ACCELERATED, reason="the C accelerator is not built")
def test_the_c_writer_writes_the_very_bytes_of_the_python_writer():
    rec = Recorder(100, DropCounter(), None)
    c_ring = StepRing.create(1 << 16)
    attach_ring(rec, c_ring)  # the C writer: the Python one only for what is new
    values = [1.25, -3, True, "warm", "é" * 3, 2**62, float("nan"), "", False]
    ended = []
    for step in rec.steps(range(40), loader="train"):
        with step.phase("forward"):
            pass
        if step.index % 4 == 1:
            with step.monitor("val_loss"):
                pass
        if step.index % 3:
            step.set_attribute("loss", values[step.index % len(values)])
            step.set_attribute("tokens", step.index * 1024)
        if step.index == 20:
            step.set_attribute("blob", "x" * 300)  # too long: the queue's, behind a marker
        ended.append(step)
    py_ring = StepRing.create(1 << 16)
    side = Recorder(100, DropCounter(), None)
    py = StepRingWriter(py_ring, side)
    assert all(py.write_step(s) for s in ended)
    head = c_ring.counters()["head"]
    assert py_ring.counters() == c_ring.counters() and head > 40 * 64
    assert bytes(c_ring.buffer[:256 + head]) == bytes(py_ring.buffer[:256 + head])
    assert [s.index for s in rec.queue] == [s.index for s in side.queue] == [20]
