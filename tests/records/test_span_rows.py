"""Span records' phase span ids (span_rows.py): drawn as one 64-bit draw each would be."""

from __future__ import annotations

import random

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
