"""A step's flat event list read back: the phase tree, live lists, the flat fast path."""

from __future__ import annotations

from otel_train.common.drop_counter import DropCounter
from otel_train.recording.recorder import Recorder, Step
from otel_train.recording.step_events import active_ordinal, decode_events, flat_events


def test_decode_events_rebuilds_the_phase_tree_in_start_order():
    rec = Recorder(10, DropCounter(), None)
    step = Step(rec, 0, None)
    with step.phase("forward"):
        with step.phase("attention"):
            pass
        with step.phase("mlp"):
            pass
    with step.phase("backward"):
        pass
    step.end()
    phases = decode_events(step.ev)
    assert [(p.phase.name, p.parent) for p in phases] == [
        ("forward", -1), ("attention", 0), ("mlp", 0), ("backward", -1)]
    for p in phases:
        assert step.start_ns <= p.start_ns <= p.end_ns <= step.end_ns
        assert p.error is None
    assert step.span_count() == 5
    assert list(rec.queue) == [step]


def test_decode_events_is_safe_on_a_live_list_with_half_an_event():
    rec = Recorder(10, DropCounter(), None)
    step = Step(rec, 0, None)
    phase = step.phase("forward")
    phase.__enter__()
    live = list(step.ev) + [123]  # a reader saw the end timestamp but not its pair
    (ph,) = decode_events(live)
    assert ph.phase.name == "forward" and ph.end_ns == 0
    assert rec.in_progress()[2] == "forward"
    phase.__exit__(None, None, None)
    step.end()
    assert rec.in_progress() is None


def test_flat_events_slices_a_step_whose_phases_ran_one_after_another():
    rec = Recorder(10, DropCounter(), None)
    step = Step(rec, 0, None)
    for name in ("forward", "backward", "optimizer"):
        with step.phase(name):
            pass
    step.end()
    phases, starts, ends = flat_events(step.ev)
    assert [p.name for p in phases] == ["forward", "backward", "optimizer"]
    decoded = decode_events(step.ev)
    assert starts == [p.start_ns for p in decoded] and ends == [p.end_ns for p in decoded]


def test_flat_events_leaves_nested_failed_and_open_phases_to_decode_events():
    rec = Recorder(10, DropCounter(), None)
    nested = Step(rec, 0, None)
    with nested.phase("forward"), nested.phase("attention"):
        pass
    nested.end()
    failed = Step(rec, 1, None)
    try:
        with failed.phase("forward"):
            raise ValueError("nan")
    except ValueError:
        pass
    failed.end()
    assert flat_events(nested.ev) is None and flat_events(failed.ev) is None
    assert flat_events(nested.ev[:2]) is None  # a phase still open
    assert flat_events([]) == ([], [], [])


def test_active_ordinal_names_the_innermost_open_phase_and_counts_the_started():
    rec = Recorder(10, DropCounter(), None)
    step = Step(rec, 0, None)
    assert active_ordinal(step.ev) == (-1, 0)
    with step.phase("forward"):
        with step.phase("attention"):
            pass
        with step.phase("mlp"):
            assert active_ordinal(step.ev) == (2, 3)
        assert active_ordinal(step.ev) == (0, 3)
    assert active_ordinal(step.ev) == (-1, 3)
    step.end()
