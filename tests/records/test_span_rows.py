"""Span records' phase span ids (span_rows.py): drawn as one 64-bit draw each would be."""

from __future__ import annotations

import random
from typing import Any

import pytest

from otel_train.records import span_rows

PHASE = ("forward", "train", None, 10, 1, 7, 0, 10, None, (), None, None)


@pytest.mark.parametrize("n", [1, 2, 6, 32, 33, 100])
def test_phase_span_ids_are_those_of_one_64_bit_draw_each_and_leave_the_same_state(n):
    random.seed(n)
    want = [random.getrandbits(64) or 1 for _ in range(n)]
    after = random.random()
    random.seed(n)
    assert span_rows.phase_span_ids([PHASE] * n, None) == want
    assert random.random() == after  # the generator moved on exactly as far


def test_a_zero_draw_is_never_a_span_id_and_ids_asked_for_by_user_spans_are_kept(monkeypatch):
    monkeypatch.setattr(span_rows, "_getrandbits", lambda bits: 0)
    assert span_rows.phase_span_ids([PHASE] * 6, None) == [1] * 6
    assert span_rows.phase_span_ids([PHASE] * 3, {1: 42}) == [1, 42, 1]
    assert span_rows.phase_span_ids([], None) == []


def test_span_ids_drawn_at_once_are_the_ids_of_a_draw_each():
    import random

    from otel_train.records.span_rows import draw_span_ids

    for n in (0, 1, 7, 512, 1025, 3000):
        random.seed(n)
        want = [random.getrandbits(64) or 1 for _ in range(n)]
        after = random.getrandbits(64)
        random.seed(n)
        assert draw_span_ids(n) == want
        assert random.getrandbits(64) == after  # the generator's state after them too


def _views_record(i: int, phases: list[tuple[Any, ...]] | None,
                  attrs: dict[str, Any] | None = None) -> tuple[Any, ...]:
    root = 0x500 + i
    rows = None if phases is None else [
        (name, kind, loader, dur, k + 1, root if parent is None else parent, 100 * k,
         100 * k + dur, None, (), None, None)
        for k, (name, kind, loader, dur, parent) in enumerate(phases)]
    base = {"train.step": i, "train.dataloader": "train"} if phases is not None else {
        "train.step": i, "train.phase": "checkpoint", "train.phase.kind": "monitor"}
    return ("train.step" if phases is not None else "checkpoint", (3 << 64) + i, root, 1,
            1_000 * i, 1_000 * i + 900, {**base, **(attrs or {})}, None,
            (("an event", 5, {}),) if i % 2 else (), rows, None)


def test_a_frame_s_views_are_each_record_s_own_view_field_by_field() -> None:
    """views_from_records (a view made inline, monitoring counted in one pass) against
    view_from_record on each record: plain steps, steps with monitoring under the root,
    a monitor nested in a monitor and one under a train phase (the tree walked), an empty
    step, an operation between steps, the job envelope, a step ending before its start; a record that
    cannot be made is given to ``failed`` and the others go on."""
    from otel_train.records.span_rows import view_from_record, views_from_records
    from otel_train.records.steps_view import StepView

    recs = [
        _views_record(0, [("data", "train", "train", 10, None), ("forward", "train", None,
                                                                 50, None)]),
        _views_record(1, [("forward", "train", None, 50, None),
                          ("inference", "monitor", None, 20, None),
                          ("val_loss", "monitor", None, 30, None)]),
        _views_record(2, [("eval", "monitor", None, 60, None),
                          ("data", "monitor", "val", 20, 1),  # nested in eval
                          ("inner", "monitor", None, 10, 1),  # a monitor in a monitor
                          ("forward", "train", None, 40, None),
                          ("probe", "monitor", None, 5, 4)]),  # a monitor in a train phase
        _views_record(3, []),
        _views_record(4, None),  # an operation between steps
        _views_record(5, None, {"train.phase.kind": "envelope", "train.phase": "startup"}),
        _views_record(6, [("inference", "monitor", None, 7, None)], {"train.step": 6}),
    ]
    recs[6] = recs[6][:5] + (recs[6][4] - 10,) + recs[6][6:]  # ends before its start: 0 ns
    failed: list[Exception] = []
    views = views_from_records(recs[:3] + [("not", "a record")] + recs[3:], 1,
                               failed.append)
    assert len(failed) == 1 and len(views) == len(recs)
    for rec, view in zip(recs, views):
        want = view_from_record(rec, 1)
        assert type(view) is StepView and want is not None
        for field in StepView.__slots__:
            if field == "span":
                assert view.span._attributes is want.span._attributes is rec[6]
            else:
                assert getattr(view, field) == getattr(want, field), field
    assert views[1].operations == [("inference", 20), ("val_loss", 30)]
    assert views[1].monitor_ns == 50
    assert views[2].operations == [("eval", 60), ("probe", 5)] and views[2].monitor_ns == 65
    assert views[6].duration_ns == 0
