"""Off the hot path, StepRecordBuilder turns steps into span records that follow the contract
(checked through the SDK spans the row factory makes of their rows, as an edge exporter
would see them)."""

from __future__ import annotations

import logging
from time import perf_counter_ns

import pytest
import torch
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import StatusCode
from train_helpers import clean_env, nested_step  # noqa: F401  (clean_env: autouse)

from otel_train.records.attribute_values import DEFAULT_VALUE_LENGTH, MAX_SEQUENCE_ITEMS
from otel_train.common.drop_counter import DropCounter
from otel_train.common.identity import RunIdentity, step_trace_id
from otel_train.recording.recorder import MonitorRecord, Recorder, Step
from otel_train.records.span_rows import rows_from_record
from otel_train.records import step_records as step_records_module
from otel_train.records.step_batch import step_trace_head
from otel_train.records.step_records import StepRecordBuilder, epoch_offset_ns

pytestmark = pytest.mark.timeout(30)

IDENT = RunIdentity("run-s", rank=1, world_size=4, local_rank=1, run_id_source="option")
RESOURCE = Resource.create({"service.name": "spans-test"})
SCOPE = InstrumentationScope("otel_train", "0.1.0")


def _builder(sampled: bool = True, synced: bool = False) -> StepRecordBuilder:
    return StepRecordBuilder(IDENT, RESOURCE, SCOPE, synced, "cpu", lambda tid: sampled,
                             epoch_offset_ns())


def _spans(builder: StepRecordBuilder, record) -> list[ReadableSpan]:
    """The SDK spans of one step's record, children first (the order spans end)."""
    return builder.factory.spans(rows_from_record(builder.record(record)))


def test_a_step_becomes_a_root_and_one_child_per_phase_children_first():
    rec = Recorder(10, DropCounter(), None)
    spans = _spans(_builder(), nested_step(rec))
    assert [s.name for s in spans] == ["attention", "forward", "inference", "train.step"]
    root = spans[-1]
    assert root.parent is None
    by = {s.name: s for s in spans}
    assert by["forward"].parent.span_id == root.context.span_id
    assert by["inference"].parent.span_id == root.context.span_id
    assert by["attention"].parent.span_id == by["forward"].context.span_id
    assert {s.context.trace_id for s in spans} == {step_trace_id("run-s", 3)}
    assert len({s.context.span_id for s in spans}) == 4
    assert all(s.context.trace_flags.sampled for s in spans)
    assert all(s.resource is RESOURCE and s.instrumentation_scope is SCOPE for s in spans)


def test_spans_carry_the_contract_attributes():
    rec = Recorder(10, DropCounter(), None)
    spans = {s.name: s for s in _spans(_builder(synced=True), nested_step(rec))}
    root = spans["train.step"]
    assert root.attributes["train.run.id"] == "run-s"
    assert root.attributes["train.step"] == 3
    assert root.attributes["train.rank"] == 1
    assert root.attributes["train.world_size"] == 4
    assert root.attributes["train.slow"] is False
    assert root.attributes["train.device.synced"] is True
    assert root.attributes["train.dataloader"] == "train"
    assert "train.phase" not in root.attributes
    fwd = spans["forward"].attributes
    assert (fwd["train.phase"], fwd["train.phase.kind"]) == ("forward", "train")
    assert fwd["train.step"] == 3 and fwd["train.rank"] == 1
    assert spans["inference"].attributes["train.phase.kind"] == "monitor"


def test_span_times_are_the_recorded_times_on_the_epoch_clock():
    rec = Recorder(10, DropCounter(), None)
    step = nested_step(rec)
    off = epoch_offset_ns()
    builder = StepRecordBuilder(IDENT, RESOURCE, SCOPE, False, "cpu", lambda t: True, off)
    root = _spans(builder, step)[-1]
    assert root.start_time == step.start_ns + off
    assert root.end_time == step.end_ns + off


def test_unsampled_steps_get_unsampled_span_contexts():
    rec = Recorder(10, DropCounter(), None)
    spans = _spans(_builder(sampled=False), nested_step(rec))
    assert not any(s.context.trace_flags.sampled for s in spans)


def _flat_step(rec: Recorder, index: int, loader: str | None) -> Step:
    step = Step(rec, index, loader, rec.phase("data", "train"))
    step.ev.extend((perf_counter_ns(), None))  # as run.steps closes the data phase
    for name in ("forward", "backward", "optimizer"):
        with step.phase(name):
            pass
    with step.monitor("val_loss"):
        pass
    step.record_phase("checkpoint", perf_counter_ns() - 50, perf_counter_ns())
    step._finish(None)
    return step


def test_steps_whose_phases_run_one_after_another_give_the_record_the_decoder_gives(
        monkeypatch):
    """The flat-step fast path (read off the event list by slices) and the decoder agree."""
    import otel_train.records.step_records as sb

    rec = Recorder(10, DropCounter(), None)
    for loader in ("train", None):
        step = _flat_step(rec, 7, loader)
        assert sb._flat_phases(step.ev, loader, 1, 0) is not None  # the fast path applies
        builder = _builder()
        monkeypatch.setattr(sb, "_getrandbits", lambda bits: 99)
        fast = builder.record(step)
        monkeypatch.setattr(sb, "_flat_phases", lambda *a: None)  # the decoder only
        decoded = builder.record(step)
        monkeypatch.undo()
        assert fast == decoded
        names = [(p[0], p[1], p[2]) for p in fast[9]]
        assert names == [("data", "train", loader), ("forward", "train", None),
                         ("backward", "train", None), ("optimizer", "train", None),
                         ("val_loss", "monitor", None), ("checkpoint", "train", None)]
    assert sb._flat_phases([], "train", 1, 0) == []


def test_nested_failed_and_open_phases_are_left_to_the_decoder():
    import otel_train.records.step_records as sb

    rec = Recorder(10, DropCounter(), None)
    nested = nested_step(rec)  # forward > attention
    step = Step(rec, 0, None)
    with pytest.raises(ValueError):
        with step.phase("forward"):
            raise ValueError("bad batch")
    step._finish(None)
    open_ = Step(rec, 1, None)
    open_.phase("forward").__enter__()
    open_._finish(None)
    inner = Step(rec, 2, None)  # a phase recorded inside another: nested, by position
    with inner.phase("forward"):
        inner.record_phase("kernel", perf_counter_ns() - 10, perf_counter_ns())
    inner._finish(None)
    for s in (nested, step, open_, inner):
        assert sb._flat_phases(s.ev, None, 1, 0) is None
    kernel, forward = _builder().record(inner)[9][1], _builder().record(inner)[9][0]
    assert kernel[0] == "kernel" and forward[0] == "forward" and kernel[5] == 1  # its parent


def test_a_phase_left_open_ends_with_its_step():
    rec = Recorder(10, DropCounter(), None)
    step = Step(rec, 0, None)
    step.phase("forward").__enter__()
    step._finish(None)  # e.g. shutdown while the phase was open
    forward, root = _spans(_builder(), step)
    assert forward.end_time == root.end_time


def test_errors_become_error_status_and_an_exception_event():
    rec = Recorder(10, DropCounter(), None)
    step = Step(rec, 0, None)
    with pytest.raises(ValueError):
        with step.phase("forward"):
            raise ValueError("bad batch")
    step._finish(None)
    forward, root = _spans(_builder(), step)
    for span in (forward, root):
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "ValueError: bad batch"
        (event,) = span.events
        assert event.name == "exception"
        assert event.attributes["exception.type"] == "ValueError"
        assert event.attributes["exception.message"] == "bad batch"
        assert event.attributes["exception.escaped"] is True
        assert "ValueError: bad batch" in event.attributes["exception.stacktrace"]


def test_tensor_and_other_attribute_values_become_otel_values():
    rec = Recorder(10, DropCounter(), None)
    step = Step(rec, 0, None)
    step.set_attribute("loss", torch.tensor(0.25))
    step.set_attribute("count", torch.tensor(7))
    step.set_attribute("vec", torch.tensor([1.0, 2.0]))
    step.set_attribute("tags", ["a", "b"])
    step.set_attribute("obj", object())
    with step.phase("forward") as fwd:
        fwd.set_attribute("grad_norm", torch.tensor(2.0))
    step._finish(None)
    forward, root = _spans(_builder(), step)
    assert root.attributes["loss"] == 0.25 and isinstance(root.attributes["loss"], float)
    assert root.attributes["count"] == 7 and isinstance(root.attributes["count"], int)
    assert isinstance(root.attributes["vec"], str)
    assert tuple(root.attributes["tags"]) == ("a", "b")
    assert isinstance(root.attributes["obj"], str)
    assert forward.attributes["grad_norm"] == 2.0


def _root_with(attrs: dict, env: dict | None = None, monkeypatch=None) -> ReadableSpan:
    rec = Recorder(10, DropCounter(), None)
    step = Step(rec, 0, None)
    for key, value in attrs.items():
        step.set_attribute(key, value)
    step._finish(None)
    return _spans(_builder(), step)[-1]


def test_a_large_tensor_becomes_a_short_summary_and_warns_once_per_key(caplog):
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for _ in range(3):
            root = _root_with({"weights": torch.zeros(1000), "one": torch.ones(1, 1)})
    assert root.attributes["weights"] == "tensor(dtype=torch.float32, shape=(1000,))"
    assert root.attributes["one"] == 1.0  # one element: its number
    warned = [r for r in caplog.records if "'weights'" in r.getMessage()]
    assert len(warned) == 1


def test_dicts_and_odd_objects_become_bounded_strings():
    class Chatty:
        def __repr__(self) -> str:
            return "chatty" * 10_000

    root = _root_with({"cfg": {f"k{i}": list(range(100)) for i in range(100)}, "odd": Chatty()})
    assert isinstance(root.attributes["cfg"], str) and len(root.attributes["cfg"]) < 2000
    assert root.attributes["cfg"].startswith("{'k0': [0, 1, 2")
    assert isinstance(root.attributes["odd"], str) and len(root.attributes["odd"]) <= 4096


def test_without_limits_in_the_env_a_default_cap_applies_to_user_values(caplog):
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        root = _root_with({"note": "x" * 100_000, "ids": list(range(5000)), "ok": "short"})
    assert root.attributes["note"] == "x" * DEFAULT_VALUE_LENGTH
    assert len(root.attributes["ids"]) == MAX_SEQUENCE_ITEMS
    assert root.attributes["ok"] == "short"
    assert len([r for r in caplog.records if "'note'" in r.getMessage()]) == 1


def test_otel_value_length_limits_are_honoured_span_specific_first(monkeypatch):
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "10")
    root = _root_with({"note": "abcdefghijklmnop", "tags": ["0123456789xyz", "a"]})
    assert root.attributes["note"] == "abcdefghij"
    assert list(root.attributes["tags"]) == ["0123456789", "a"]
    assert root.attributes["train.run.id"] == "run-s"  # the contract's values are short anyway
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "4")
    assert _root_with({"note": "abcdefgh"}).attributes["note"] == "abcd"
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "100000")
    assert _root_with({"note": "y" * 50_000}).attributes["note"] == "y" * 50_000


def test_the_count_limit_drops_the_oldest_user_attributes_never_the_contract(monkeypatch, caplog):
    monkeypatch.setenv("OTEL_ATTRIBUTE_COUNT_LIMIT", "12")
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        root = _root_with({f"u{i}": i for i in range(20)})
    contract = {k for k in root.attributes if k.startswith("train.")}
    assert {"train.run.id", "train.step", "train.rank", "train.slow"} <= contract
    users = [k for k in root.attributes if not k.startswith("train.")]
    assert len(root.attributes) == 12
    assert users == [f"u{i}" for i in range(20 - len(users), 20)]  # the newest kept
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "200")  # span-specific wins
    assert len(_root_with({f"u{i}": i for i in range(150)}).attributes) == 150 + len(contract)
    assert len([r for r in caplog.records if "attributes" in r.getMessage()]) == 1


def test_numbers_that_do_not_fit_and_bytes_are_kept_exportable():
    root = _root_with({"big": 1 << 70, "raw": b"\x00" * 10_000, "np": 3})
    assert root.attributes["big"] == str(1 << 70)
    assert root.attributes["raw"] == b"\x00" * DEFAULT_VALUE_LENGTH


def test_set_attribute_keeps_a_detached_tensor_and_does_not_read_it():
    rec = Recorder(10, DropCounter(), None)
    step = Step(rec, 0, None)
    loss = torch.tensor(1.0, requires_grad=True) * 3
    step.set_attribute("loss", loss)
    kept = step.attrs["loss"]
    assert isinstance(kept, torch.Tensor)
    assert not kept.requires_grad


def test_a_monitor_record_is_one_root_span_with_kind_monitor():
    rec = Recorder(10, DropCounter(), None)
    rec.next_index = 5
    with MonitorRecord(rec, "snapshot") as mon:
        mon.set_attribute("path", "/ckpt")
    (span,) = _spans(_builder(), rec.queue.popleft())
    assert span.name == "snapshot" and span.parent is None
    assert span.attributes["train.phase"] == "snapshot"
    assert span.attributes["train.phase.kind"] == "monitor"
    assert span.attributes["train.step"] == 4
    assert span.attributes["path"] == "/ckpt"
    assert span.context.trace_id not in {step_trace_id("run-s", i) for i in range(10)}


def test_span_ids_drawn_early_for_user_spans_are_kept():
    rec = Recorder(10, DropCounter(), None)
    step = Step(rec, 2, None)
    with step.phase("forward"):
        step.span_ids = {-1: 0xAAA, 0: 0xBBB}
        step.trace_id = 0xCCC
    step._finish(None)
    forward, root = _spans(_builder(), step)
    assert (root.context.span_id, forward.context.span_id) == (0xAAA, 0xBBB)
    assert root.context.trace_id == forward.context.trace_id == 0xCCC


def test_an_empty_attribute_key_is_refused_at_the_call():
    rec = Recorder(10, DropCounter(), None)
    step = Step(rec, 0, None)
    with pytest.raises(ValueError, match="non-empty string"):
        step.set_attribute("", 1.0)
    with step.phase("forward") as fwd:
        with pytest.raises(ValueError, match="non-empty string"):
            fwd.set_attribute("", 1.0)
        with pytest.raises(ValueError, match="non-empty string"):
            fwd.set_attribute(None, 1.0)  # type: ignore[arg-type]
    step._finish(None)
    with MonitorRecord(rec, "snapshot") as mon, pytest.raises(ValueError, match="''"):
        mon.set_attribute("", "x")


class _Entry:
    """A phase entry that is no C phase: read by its attributes."""

    def __init__(self, name: str, kind: str = "train", loader: str | None = None) -> None:
        self.name, self.kind, self.loader = name, kind, loader


def _recorded_event_lists() -> list[list]:
    """Event lists as the recorder writes them: flat, nested, failed, left open, loaders."""
    rec = Recorder(100, DropCounter(), None)
    lists = []
    for step in rec.steps(range(3), loader="train"):  # data phase + the step's loader
        with step.phase("forward"):
            pass
        with rec.phase("val_data", "monitor", "val"):  # a loader of its own
            pass
        lists.append(step.ev)
    lists.append(nested_step(rec).ev)
    failed = Step(rec, 10, None)
    with pytest.raises(ValueError), failed.phase("forward"):
        raise ValueError("boom")
    failed._finish(None)
    left_open = Step(rec, 11, None)
    left_open.phase("backward").__enter__()  # ends with the step
    left_open._finish(None)
    return lists + [failed.ev, left_open.ev]


def test_flat_phase_rows_in_c_equal_the_pure_python_twin_and_both_refuse_other_lists():
    from otel_train.recording.recorder import FLAT_PHASE_ROWS
    from otel_train.records import step_records

    if FLAT_PHASE_ROWS is None:
        pytest.skip("the C accelerator is not built (OTEL_TRAIN_PURE_PYTHON or no compiler)")
    assert step_records._flat_rows is FLAT_PHASE_ROWS  # the builder calls the C twin
    twin = step_records._flat_phases
    t = 1_000
    odd = [_Entry("data"), t, t + 5, None, _Entry("x", "monitor", "own"), t + 9, t + 20, 0]
    lists = _recorded_event_lists() + [
        [], odd, odd[:3],
        [_Entry("data"), t, t + 5, ValueError("failed")],  # an exception at the exit
        [7, t, t + 5, None],  # an int where an entry opens
        [_Entry("data"), t, float(t + 5), None],  # an end time that is no int
        [_Entry("data"), 2**70, 2**71, None],  # ints beyond 64 bits
    ]
    flat = 0
    for ev in lists:
        for loader in ("train", None):
            want = twin(ev, loader, 42, 10**18)
            assert FLAT_PHASE_ROWS(ev, loader, 42, 10**18, "data") == want, ev
            flat += want is not None
    assert flat >= 8  # the flat ones were built, not only refused
    assert twin(lists[0], "train", 42, 0)[0][:3] == ("data", "train", "train")
    with pytest.raises(AttributeError):  # an entry without a name fails alike
        FLAT_PHASE_ROWS([object(), t, t + 1, None], None, 1, 0, "data")
    with pytest.raises(TypeError):
        FLAT_PHASE_ROWS((), None, 1, 0, "data")


@pytest.mark.parametrize("writer", ["attached", "python"])
def test_records_built_from_the_step_ring_equal_those_built_from_the_steps(writer):
    """The step ring's records (recording/step_ring.py) give the same span records as the
    steps they were written from: flat steps with loaders, own-loader and monitoring phases,
    root attribute values; the steps the ring refuses are the queue's, built as before."""
    import random

    from otel_train.recording.step_ring_reader import StepRingReader
    from otel_train.recording.step_ring import (
        StepRing,
            StepRingWriter,
        attach_ring,
    )

    rec = Recorder(100, DropCounter(), None)
    ring = StepRing.create(1 << 16)
    if writer == "attached":  # the C writer where the accelerator was built
        attach_ring(rec, ring)
    ended = []
    for step in rec.steps(range(8), loader="train"):
        with step.phase("forward"):
            pass
        with rec.phase("val_data", "monitor", "val"):  # a loader of its own
            pass
        with step.monitor("val_loss"):
            pass
        if step.index % 2:
            step.set_attribute("loss", step.index / 3)
            step.set_attribute("tag", "warm" if step.index > 3 else "cold")
            step.set_attribute("finite", True)
            step.set_attribute("tokens", 2**40 + step.index)
        if step.index == 6:
            step.set_attribute("big", torch.tensor(2.5))  # a tensor: the queue's
        ended.append(step)
    ended.append(nested_step(rec, index=8))
    ended += [Step(rec, 9, None), Step(rec, 10, "eval")]  # a step with no phase; a loader
    with ended[-1].phase("forward"):
        pass
    for s in ended[-2:]:
        s._finish(None)
    if writer == "python":
        side = Recorder(100, rec.drops, None)  # its queue takes what the ring cannot carry
        py = StepRingWriter(ring, side)
        assert all(py.write_step(s) for s in list(rec.queue))
        left = list(side.queue)
    else:
        left = list(rec.queue)
    from_ring = [s for s in StepRingReader(ring).read() if s != "queued"]
    assert sorted([s.index for s in from_ring] + [s.index for s in left]) == list(range(11))
    assert [s.index for s in left] == [6, 8, 9]  # the tensor, the nested step, no phase
    by_index = {s.index: s for s in ended}

    def fixed() -> StepRecordBuilder:  # one epoch offset for both
        return StepRecordBuilder(IDENT, RESOURCE, SCOPE, False, "cpu", lambda t: True, 10**18)

    random.seed(7)
    want = [fixed().record(by_index[s.index]) for s in from_ring]
    random.seed(7)
    got = [fixed().record(s) for s in from_ring]
    assert got == want and len(got) == 8
    assert any(r[6].get("loss") for r in got) and got[-1][6]["train.dataloader"] == "eval"
    # Odd event lists, as the recorder writes them: the ring takes exactly the flat ones.
    from otel_train.recording.step_events import flat_events

    odd_ring = StepRing.create(1 << 16)
    side = Recorder(100, DropCounter(), None)
    py = StepRingWriter(odd_ring, side)
    taken = []
    for n, ev in enumerate(_recorded_event_lists()):
        step = Step(rec, 100 + n, "train")
        step._finish(None)
        step.ev = ev
        queued = len(side.queue)
        assert py.write_step(step)
        assert (len(side.queue) == queued) == (bool(ev) and flat_events(ev) is not None), ev
        if flat_events(ev) is not None:
            taken.append(step)
    random.seed(3)
    want = [fixed().record(s) for s in taken]
    random.seed(3)
    assert [fixed().record(s) for s in StepRingReader(odd_ring).read() if s != "queued"
            ] == want
    assert len(want) >= 3


@pytest.mark.skipif(step_records_module._flat_record is None,
                    reason="the C accelerator was not built here (CI requires it)")
@pytest.mark.parametrize("setting", ["plain", "own timing", "host rss", "collectives"])
def test_a_flat_step_built_in_c_equals_its_python_twin_and_the_rest_falls_back(setting):
    """flat_step_record builds the common flat step; the builder sends what it does not
    cover (own timing, a memory reading, collectives, a failure, a step's own exposed
    communication time, nesting) to the Python path, decided before anything is built."""
    import random

    from otel_train.recording.collectives import CollectiveLog

    def builder() -> StepRecordBuilder:
        b = StepRecordBuilder(IDENT, RESOURCE, SCOPE, False, "cpu", lambda tid: True, 10**18,
                              span_timing=None if setting == "own timing" else "host",
                              host_rss_every_steps=3 if setting == "host rss" else 0)
        if setting == "collectives":
            b.collectives = CollectiveLog()
            b.collectives.extend([["all_reduce", 1024, 2**62, 2**62 + 10, 0]])  # later on
        return b

    rec = Recorder(100, DropCounter(), None)
    for step in rec.steps(range(24), loader="train" if setting != "plain" else None):
        with step.phase("data"):
            if step.index % 4 == 1:
                t = perf_counter_ns() + 200_000  # the data phase dominates: input-bound
                while perf_counter_ns() < t:
                    pass
        with step.phase("forward"):
            if step.index % 5 == 2:
                with step.phase("inner"):  # nested: not flat, the Python decoder
                    pass
        if step.index % 6 == 3:
            step.set_attribute("train.comm.exposed_seconds", 0.5)  # its own: Python
        if step.index % 7 == 4:
            step.set_attribute("loss", step.index / 3)
            step.set_attribute("tag", "é" * 300)  # over the value length limit? kept alike
        if step.index % 8 == 5:
            with pytest.raises(RuntimeError), step.phase("backward"):
                raise RuntimeError("boom")
    steps = list(rec.queue)
    c_builder, py_builder = builder(), builder()
    for last in (None, "host"):  # the verdict carried from the last sampled step
        c_builder._device_bound = py_builder._device_bound = last
        for i, step in enumerate(steps):
            random.seed(i)
            c_rec = c_builder.record(step)
            random.seed(i)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(step_records_module, "_flat_record", None)
                py_rec = py_builder.record(step)
            if setting == "host rss":  # a reading each time: equal but for its value
                for r in (c_rec, py_rec):
                    r[6].pop("train.memory.host_rss_bytes", None)
            assert c_rec == py_rec, (setting, step.index)
    bounds = {c_builder.record(s)[6].get("train.step.bound") for s in steps}
    assert {"input", "host"} <= bounds or setting != "plain"


@pytest.mark.parametrize("setting", ["plain", "own timing", "host rss"])
def test_a_batch_of_steps_gives_the_records_built_one_by_one_and_a_failing_step_is_left_out(
        setting):
    """step_records (the step ring's reader builds a batch at a time) draws the same ids and
    builds the same records as record() per step, C and Python paths, flat, nested and
    failed steps, user span ids kept, a stall's events, steps read back from the ring; a
    step whose build fails is handed over, the others go on."""
    import random

    from otel_train.recording.step_ring import StepRing, attach_ring
    from otel_train.recording.step_ring_reader import StepRingReader

    rec = Recorder(100, DropCounter(), None)
    for step in rec.steps(range(20), loader="train"):
        with step.phase("forward"):
            if step.index % 5 == 2:
                with step.phase("inner"):  # nested: the Python decoder
                    pass
        if step.index % 7 == 4:
            step.set_attribute("loss", step.index / 3)
    steps = list(rec.queue)
    steps[3].span_ids = {-1: 77, 0: 78}  # ids handed to user spans early: kept, none drawn
    steps[8].stall_events = [("train.stall", 10**18 + 5, {"train.stall.seconds": 2.0})]
    ring = StepRing.create(1 << 16)
    attach_ring(rec, ring)
    for step in rec.steps(range(20, 26), loader="train"):
        with step.phase("forward"):
            pass
    ring_steps = [s for s in StepRingReader(ring).read() if s != "queued"]
    assert len(ring_steps) == 6
    steps += ring_steps

    def fixed() -> StepRecordBuilder:
        return StepRecordBuilder(IDENT, RESOURCE, SCOPE, False, "cpu", lambda t: True, 10**18,
                                 span_timing=None if setting == "own timing" else "host",
                                 host_rss_every_steps=3 if setting == "host rss" else 0)

    random.seed(5)
    one_by_one = fixed()
    want = [one_by_one.record(s) for s in steps]
    after = random.getrandbits(64)
    random.seed(5)
    failed = []
    got = fixed().step_records(steps, lambda s, exc: failed.append(s))
    if setting == "host rss":  # a reading each time: equal but for its value
        for r in got + want:
            r[6].pop("train.memory.host_rss_bytes", None)
    assert got == want and not failed
    assert random.getrandbits(64) == after
    assert got[3][2] == 77 and got[8][8][-1][0] == "train.stall"

    class Broken:  # a step whose build raises
        span_ids = None
        trace_id = 0
        index = "x"

        def __getattr__(self, name):
            raise RuntimeError("unreadable")

    random.seed(5)
    got = fixed().step_records(steps[:2] + [Broken()] + steps[2:], lambda s, exc: failed.append(
        (s, exc)))
    assert len(failed) == 1 and isinstance(failed[0][1], RuntimeError)
    assert [r[6]["train.step"] for r in got] == list(range(26))


@pytest.mark.skipif(step_records_module._flat_records is None,
                    reason="the C accelerator was not built here (CI requires it)")
def test_ring_trace_ids_hashed_in_c_equal_step_trace_id_across_block_boundaries():
    """flat_step_records' trace ids (hashlib's blake2b of the run id's part, copied and fed
    the step's digits in C) against step_trace_id, run ids from empty to several 128-byte
    blocks (the step's digits crossing a block's end), any 64-bit step; an index that is
    no 64-bit int is left to Python (None)."""
    import random

    from otel_train.recording.recorder import _recorder_c

    rng = random.Random(2)
    for run_id in ["", "run-s", "é" * 63, *("x" * n for n in range(110, 131)), "y" * 300]:
        prefix = step_trace_head(run_id)
        for step in [0, 1, 9, 10, -1, 2**63 - 1, -2**63] + [rng.randrange(-2**63, 2**63)
                                                              for _ in range(20)]:
            assert _recorder_c.ring_trace_id(prefix, step) == step_trace_id(run_id, step), (
                run_id, step)
    assert _recorder_c.ring_trace_id(step_trace_head("r"), 2**64) is None
    assert _recorder_c.ring_trace_id(step_trace_head("r"), True) is None  # str() says "True"


@pytest.mark.parametrize("rss_every", [0, 4])
def test_ring_steps_built_a_run_at_a_time_in_c_equal_those_built_in_python(monkeypatch,
                                                                           rss_every):
    """flat_step_records (C: a run of ring steps, trace ids included) against the Python
    path of step_records for the same steps: the same records, the same ids drawn; a step
    the C leaves (attributes, a memory reading every N-th step) built in Python in its
    place."""
    import random

    from otel_train.recording.step_ring import StepRing, attach_ring
    from otel_train.recording.step_ring_reader import StepRingReader

    rec = Recorder(100, DropCounter(), None)
    ring = StepRing.create(1 << 16)
    attach_ring(rec, ring)
    for step in rec.steps(range(40), loader="train"):
        with step.phase("forward"):
            pass
        if step.index % 9 == 4:
            step.set_attribute("loss", step.index / 7)
        with step.monitor("val_loss"):
            pass
    steps = [s for s in StepRingReader(ring).read() if s != "queued"]
    assert len(steps) == 40 and any(s.attrs for s in steps)

    def built(c: bool) -> list:
        if not c:
            monkeypatch.setattr(step_records_module, "_flat_records", None)
        b = StepRecordBuilder(IDENT, RESOURCE, SCOPE, False, "cpu", lambda t: t % 3 > 0, 10**18,
                              host_rss_every_steps=rss_every)
        random.seed(9)
        failed = []
        out = b.step_records(steps, lambda s, e: failed.append(e))
        assert not failed
        read = [r[6].pop("train.memory.host_rss_bytes", None) is not None for r in out]
        assert sum(read) == (10 if rss_every else 0)  # steps 0, 4, ..., 36
        return out

    c_built = built(True)
    assert built(False) == c_built
    assert {r[3] for r in c_built} == {0, 1}  # the builder's sampling decision, each
