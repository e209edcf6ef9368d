"""The ring's steps built and counted in the exporter process (ring_build.py): the counts the
training process's own cost reads (warm and cold spans, the last end) are the same in C
(``_recorder_c.ring_span_counts``) and in its Python twin (``span_counts``), over records of
every shape, and a step that cannot be built is counted dropped while the others go on."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest
from train_helpers import clean_env  # noqa: F401  (autouse fixture)

from ring_helpers import OFFSET, ring_builder

from otel_train.common.drop_counter import DropCounter
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.common.self_cost import COLD_STEP_NS_PER_SPAN, is_cold_step
from otel_train.export.process import ring_build
from otel_train.export.process.ring_build import RingRecordBuilds, span_counts
from otel_train.recording.recorder import Recorder
from otel_train.recording.step_ring import StepRing, attach_ring
from otel_train.recording.step_ring_reader import StepRingReader

pytestmark = pytest.mark.timeout(60)
needs_c = pytest.mark.skipif(ring_build._C_SPAN_COUNTS is None,
                             reason="the C accelerator was not built here (CI requires it)")


def _record(start: int, end: int, phases: Any) -> tuple[Any, ...]:
    return ("train.step", 1, 2, 1, start, end, {}, None, (), phases, None)


class _Settlement:
    stage_in = 0


def _builds(drops: DropCounter | None = None) -> RingRecordBuilds:
    return RingRecordBuilds(ring_builder(), drops or DropCounter(), _Settlement(),
                            RateLimitedLogger(logging.getLogger("test")))


@needs_c
def test_span_counts_in_c_equal_the_python_twin_at_the_cold_edge_and_past_int64():
    rng = random.Random(4)
    recs = []
    for _ in range(400):
        phases = rng.choice([None, [], [("p",)] * rng.randrange(1, 9)])
        spans = 1 + len(phases or ())
        wall = rng.choice([0, 1, spans * COLD_STEP_NS_PER_SPAN - 1,
                           spans * COLD_STEP_NS_PER_SPAN, 10**12, rng.randrange(10**9)])
        start = OFFSET + rng.randrange(10**12)
        recs.append(_record(start, start + wall, phases))
    for last in (0, OFFSET, 2**62):
        got = ring_build._C_SPAN_COUNTS(recs, OFFSET, COLD_STEP_NS_PER_SPAN, last)
        assert got == span_counts(recs, OFFSET, last)
    warm, cold, _ = span_counts(recs, OFFSET, 0)
    assert warm > 0 and cold > 0
    # the edge itself, as is_cold_step says
    edge = [_record(OFFSET, OFFSET + 3 * COLD_STEP_NS_PER_SPAN - d, [("p",)] * 2) for d in (0, 1)]
    assert is_cold_step(3 * COLD_STEP_NS_PER_SPAN, 3)
    assert ring_build._C_SPAN_COUNTS(edge, OFFSET, COLD_STEP_NS_PER_SPAN, 0)[:2] == (3, 3)
    # what C does not read exactly goes to the twin: None
    for odd in ([_record(2**64, 2**64 + 1, None)], [_record(OFFSET, OFFSET + 1, ("p",))],
                [_record(OFFSET, 2.5, None)]):
        assert ring_build._C_SPAN_COUNTS(odd, OFFSET, COLD_STEP_NS_PER_SPAN, 0) is None
    assert span_counts([_record(2**64, 2**64 + 10**12, None)], OFFSET, 0) == (0, 1, 2**64 + 10**12
                                                                             - OFFSET)


@pytest.mark.parametrize("c", [True, False])
def test_ring_steps_are_counted_alike_with_or_without_the_accelerator_a_failed_one_dropped(
        monkeypatch, c):
    if not c:
        monkeypatch.setattr(ring_build, "_C_SPAN_COUNTS", None)
    rec = Recorder(100, DropCounter(), None)
    ring = StepRing.create(1 << 16)
    attach_ring(rec, ring)
    for step in rec.steps(range(12), loader="train"):
        with step.phase("forward"):
            pass
        with step.monitor("val_loss"):
            pass
    steps = StepRingReader(ring).read()
    assert len(steps) == 12
    drops = DropCounter()
    builds = _builds(drops)

    class Broken:  # a step whose build raises
        span_ids = None
        trace_id = 0
        index = "x"

        def span_count(self) -> int:
            return 4

        def __getattr__(self, name: str) -> Any:
            raise RuntimeError("unreadable")

    recs = builds.build(steps[:5] + [Broken()] + steps[5:])
    assert len(recs) == 12 and builds.steps == 12
    assert drops.counts().get("build_error") == 4 and builds._settlement.stage_in == 4
    want = span_counts(recs, OFFSET, 0)
    assert (builds.warm_spans, builds.cold_spans, builds.last_end_ns) == want
    assert builds.warm_spans + builds.cold_spans == 12 * 4
    assert builds.last_end_ns == max(s.end_ns for s in steps)
