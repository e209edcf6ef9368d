"""The step ring read back (step_ring_reader.py): the C reader (``_recorder_c.ring_read_items``)
and its Python twin read the very same items from the same bytes, and the records built from
them in C (``flat_step_record``) and in Python are equal, over steps of every shape the ring
carries; CI builds the C reader;
OTEL_TRAIN_PURE_PYTHON=1 selects the twin."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from typing import Any

import pytest
from train_helpers import clean_env  # noqa: F401  (clean_env: autouse)

from otel_train.common.drop_counter import DropCounter
from otel_train.common.identity import RunIdentity, step_trace_id
from otel_train.recording import step_ring_reader
from otel_train.recording.recorder import Recorder
from otel_train.recording.step_ring import (
    MAX_STRING_BYTES,
    QUEUED,
    StepRing,
    StepRingWriter,
)
from otel_train.recording.step_ring_reader import StepRingReader
from otel_train.records import step_records
from otel_train.records.step_records import StepRecordBuilder

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

pytestmark = pytest.mark.timeout(120)

needs_c = pytest.mark.skipif(step_ring_reader._C_READ_ITEMS is None,
                             reason="the C accelerator was not built here (CI requires it)")
I64_MAX = 2**63 - 1
# Root attribute values of every kind the ring carries, at their edges.
VALUES: list[Any] = [True, False, 0, 1, -1, -(2**63), I64_MAX, 0.0, -0.0, 1.5, float("inf"),
                     float("-inf"), 1e-300, "", "warm", "é" * 10, "日本語テキスト", "\U0001f680",
                     "x" * MAX_STRING_BYTES, "é" * (MAX_STRING_BYTES // 2), "y" * 255,
                     "\ud800" + "z"]  # a lone surrogate: written and read with surrogatepass


def _builder() -> StepRecordBuilder:
    return StepRecordBuilder(RunIdentity("reader", 0, 1, 0, "option"),
                             Resource({"service.name": "reader"}),
                             InstrumentationScope("otel-train", "1"), False, "cpu",
                             lambda t: True, 10**18)


def _steps(n: int, seed: int) -> list[Any]:
    """``n`` finished steps of many shapes (phase counts, loaders, attributes of every kind,
    new phase names and keys mid-stream, some the ring cannot carry), their times replaced
    with edge values on some."""
    rng = random.Random(seed)
    rec = Recorder(10 * n, DropCounter(), None)  # no ring attached: every step is queued
    loaders = [None, "train", "val", "ローダー", "l" * 200]
    for step in rec.steps(range(n), loader="train"):
        step.loader = rng.choice(loaders)
        for p in range(rng.randrange(0, 9)):
            name = rng.choice(["forward", "backward", "optimizer", f"phase{rng.randrange(40)}",
                               "ñ" * rng.randrange(1, 120)])
            with (step.monitor(name) if p % 5 == 4 else step.phase(name)):
                pass
        for k in range(rng.randrange(0, 6)):
            step.set_attribute(rng.choice(["loss", "lr", f"key{rng.randrange(60)}", "ключ"]),
                               rng.choice(VALUES))
        if step.index % 11 == 5:
            step.set_attribute("weights", [1.0, 2.0])  # the queue's, behind a marker
    steps = list(rec.queue)
    for step in steps[::7]:  # zero and huge timestamps
        lo, hi = rng.choice([(0, 0), (0, I64_MAX), (I64_MAX - 10**9, I64_MAX), (0, 1)])
        step.start_ns, step.end_ns = lo, hi
        for i in range(1, len(step.ev), 4):
            step.ev[i], step.ev[i + 1] = lo, hi
    return steps


def _item(item: Any) -> Any:
    """Everything a read item holds, as plain values (types kept: True is not 1)."""
    if item is QUEUED:
        return QUEUED
    phases = [(p.name, p.kind, p.loader, type(p).__name__) for p in item.ev[0::4]]
    times = [(type(t), t) for i, t in enumerate(item.ev) if i % 4 in (1, 2)]
    attrs = None if item.attrs is None else [
        (k, type(v), repr(v)) for k, v in item.attrs.items()]
    return (type(item).__name__, item.index, item.loader, item.start_ns, item.end_ns, phases,
            times, item.ev[3::4], attrs, item.span_count())


@needs_c
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_c_reader_and_the_python_reader_read_the_same_items_and_build_equal_records(seed):
    steps = _steps(400, seed)
    ring = StepRing.create(8192)  # small: the records wrap around its end, PADs between
    writer = StepRingWriter(ring, Recorder(10**4, DropCounter(), None))
    c_reader = StepRingReader(ring, move_tail=False)
    py_reader = StepRingReader(StepRing.open(os.dup(ring.fd)), move_tail=False)
    c_builder, py_builder = _builder(), _builder()
    pads = seen = 0
    rng = random.Random(seed)
    at = 0
    while at < len(steps):
        chunk = steps[at:at + rng.randrange(1, 25)]
        at += len(chunk)
        head_before = ring.counters()["head"]
        for step in chunk:
            writer.write_step(step)
        pads += (head_before % ring.capacity) > (ring.counters()["head"] % ring.capacity)
        limit = rng.choice([None, 1, 3, 512])
        while True:
            c_items = c_reader.read_items(limit)
            py_items = py_reader._read_items_python(limit)
            assert [(_item(i), e, o) for i, e, o in c_items] == \
                [(_item(i), e, o) for i, e, o in py_items]
            assert c_reader.position == py_reader.position
            for (c_item, _, _), (py_item, _, _) in zip(c_items, py_items):
                if c_item is QUEUED:
                    continue
                random.seed(seen)
                c_rec = c_builder.record(c_item)  # the record in C (flat_step_record)
                random.seed(seen)
                with pytest.MonkeyPatch.context() as mp:  # its Python twin
                    mp.setattr(step_records, "_flat_record", None)
                    py_rec = py_builder.record(py_item)
                assert c_rec == py_rec
                assert [list(map(type, p)) for p in c_rec[9]] == \
                    [list(map(type, p)) for p in py_rec[9]]
                seen += 1
            if not c_items:
                break
        c_reader.release(c_reader.position)
    assert c_reader.strings == py_reader.strings
    assert {k: (p.name, p.kind, p.loader) for k, p in c_reader.phases.items()} == \
        {k: (p.name, p.kind, p.loader) for k, p in py_reader.phases.items()}
    dropped = ring.counters()["dropped_steps"]
    assert pads >= 3 and seen > 200 and seen + dropped + len(writer.recorder.queue) == 400


@needs_c
def test_the_c_reader_moves_tail_past_each_record_and_leaves_what_it_did_not_read():
    rec = Recorder(100, DropCounter(), None)
    ring = StepRing.create(1 << 16)
    writer = StepRingWriter(ring, rec)
    for step in _steps(30, 9)[:20]:
        writer.write_step(step)
    reader = StepRingReader(ring)  # move_tail: the room of what it read is free
    first = reader.read_items(5)
    assert len(first) == 5 and ring.counters()["tail"] == reader.position == first[-1][1]
    rest = reader.read_items()
    assert len(first) + len(rest) == 20 and ring.counters()["tail"] == ring.counters()["head"]


@needs_c
def test_the_c_reader_refuses_a_corrupt_record_and_an_id_never_defined_like_the_python_one():
    ring = StepRing.create(4096)
    writer = StepRingWriter(ring, Recorder(100, DropCounter(), None))
    step = next(s for s in _steps(20, 4) if len(s.ev) >= 8)
    writer.write_step(step)
    defined = StepRingReader(ring, move_tail=False)
    assert len(defined.read_items()) == 1
    writer.write_step(step)  # its definitions are behind: a reader from here lacks them
    for read in ("read_items", "_read_items_python"):
        late = StepRingReader(ring, move_tail=False)
        late.position = defined.position
        with pytest.raises(KeyError):
            getattr(late, read)()
    ring.buffer[256:260] = (4).to_bytes(4, "little")  # a record shorter than its head
    for read in (StepRingReader(ring).read_items, StepRingReader(ring)._read_items_python):
        with pytest.raises(ValueError, match="corrupt"):
            read()


def test_ci_builds_the_c_ring_reader_and_flat_step_record():
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        pytest.skip("only CI must have built it; elsewhere the pure-Python twin is allowed")
    assert step_ring_reader._C_READ_ITEMS is not None, \
        "pip install -e . did not build otel_train/recording/_recorder_c_ringread.c"
    assert step_ring_reader.RING_READER.startswith("C accelerator")
    assert step_records._flat_record is not None, "flat_step_record was not built"


def test_otel_train_pure_python_selects_the_python_ring_reader():
    env = {**os.environ, "OTEL_TRAIN_PURE_PYTHON": "1"}
    code = "import otel_train.recording.step_ring_reader as r; print(r.RING_READER)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "pure Python"


@needs_c
@pytest.mark.parametrize("seed", [1, 2])
def test_ring_steps_built_from_the_c_readers_fields_equal_the_python_readers_built_in_python(
        monkeypatch, seed):
    """flat_step_records builds the C reader's RingSteps from their C fields (no event
    list); the Python reader's RingSteps built by the pure-Python path give the same records,
    over every shape the ring carries: attributes (left to Python), own loaders, steps whose
    numbers leave int64 with the offset or whose data time is past 2**53 (the general path),
    a carried device verdict, the sampling decision, a memory reading every N-th step, an
    event list already read, a sampler that raises on one trace id (that step handed over)."""
    steps = _steps(300, seed)
    for step in steps[3::13]:  # a data phase past 2**53 ns, the offset still within int64
        step.start_ns, step.end_ns = 0, 2**60
        step.ev[1], step.ev[2] = 0, 2**60 - 5
    ring = StepRing.create(1 << 17)
    writer = StepRingWriter(ring, Recorder(10**4, DropCounter(), None))
    for step in steps:
        writer.write_step(step)
    c_steps = [s for s, _, _ in StepRingReader(ring, move_tail=False).read_items()
               if s is not QUEUED]
    py_steps = [s for s, _, _ in StepRingReader(StepRing.open(os.dup(ring.fd)),
                                                move_tail=False)._read_items_python()
                if s is not QUEUED]
    assert type(c_steps[0]) is not type(py_steps[0]) and len(c_steps) == len(py_steps) > 200
    for s in c_steps[5::17]:
        assert s.ev  # read: the general path builds it
    bad = py_steps[40].index

    def built(items: list[Any], c: bool, verdict: str | None, rss_every: int) -> Any:
        with pytest.MonkeyPatch.context() as mp:
            if not c:
                mp.setattr(step_records, "_flat_records", None)
                mp.setattr(step_records, "_flat_record", None)
            bad_trace = step_trace_id("reader", bad)

            def sampled(trace_id: int) -> bool:
                if trace_id == bad_trace:
                    raise ZeroDivisionError("a sampler that fails on one step")
                return trace_id % 3 > 0

            b = StepRecordBuilder(RunIdentity("reader", 0, 1, 0, "option"),
                                  Resource({"service.name": "reader"}),
                                  InstrumentationScope("otel-train", "1"), False, "cpu",
                                  sampled, 10**18, host_rss_every_steps=rss_every)
            b._device_bound = verdict
            random.seed(seed)
            failed: list[Any] = []
            out = b.step_records(items, lambda s, e: failed.append((s.index, type(e))))
            for r in out:
                r[6].pop("train.memory.host_rss_bytes", None)
            return out, failed, random.getrandbits(64)

    for verdict, rss_every in [(None, 0), ("input", 0), ("compute", 7), ("", 3)]:
        c_out, c_failed, c_after = built(c_steps, True, verdict, rss_every)
        py_out, py_failed, py_after = built(py_steps, False, verdict, rss_every)
        assert c_out == py_out and c_failed == py_failed == [(bad, ZeroDivisionError)]
        assert c_after == py_after  # the same ids drawn
        assert [[list(map(type, p)) for p in r[9]] for r in c_out] == \
            [[list(map(type, p)) for p in r[9]] for r in py_out]
        assert [[type(v) for v in r[:6]] for r in c_out] == [[type(v) for v in r[:6]]
                                                             for r in py_out]
    bounds = {r[6]["train.step.bound"] for r in c_out}
    assert {"input", "compute"} <= bounds
