"""Phases opened, closed and recorded by timestamps: they nest and decode like ``with`` blocks."""

from __future__ import annotations

import pytest

from otel_train.common.attributes import KIND_MONITOR
from otel_train.common.drop_counter import DropCounter
from otel_train.recording.recorder import Recorder, Step
from otel_train.recording.step_events import decode_events


def test_phases_opened_and_closed_by_timestamps_nest_like_with_blocks():
    rec = Recorder(10, DropCounter(), None)
    step = Step(rec, 0, None)
    step.open_phase("micro_step", start_ns=100)
    step.open_phase("forward", start_ns=110)
    step.close_phase(150)
    step.record_phase("data", 160, 170, loader="train")
    step.close_phase(200)
    step.end()
    got = [(p.phase.name, p.parent, p.start_ns, p.end_ns, p.phase.loader)
           for p in decode_events(step.ev)]
    assert got == [("micro_step", -1, 100, 200, None), ("forward", 0, 110, 150, None),
                   ("data", 0, 160, 170, "train")]
    assert step.span_count() == 4


def test_attributes_given_at_open_land_on_that_phase_and_an_error_fails_the_step():
    rec = Recorder(10, DropCounter(), None)
    step = Step(rec, 0, None)
    step.open_phase("forward", attributes={"micro": 1})
    step.record_phase("eval", 1, 2, kind=KIND_MONITOR, attributes={"examples": 100})
    error = ValueError("nan")
    step.close_phase(error=error)
    step.end()
    assert step.phase_attrs == {0: {"micro": 1}, 1: {"examples": 100}}
    (forward, ev) = decode_events(step.ev)
    assert forward.error is error and step.error is error
    assert ev.phase.kind == KIND_MONITOR


def test_an_ended_step_refuses_new_phases():
    rec = Recorder(10, DropCounter(), None)
    step = Step(rec, 3, None)
    step.end()
    with pytest.raises(RuntimeError, match="step 3, which has already ended"):
        step.open_phase("forward")
    with pytest.raises(RuntimeError, match="already ended"):
        step.record_phase("data", 1, 2)
