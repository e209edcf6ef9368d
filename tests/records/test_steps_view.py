"""StepAssembler / StepViewProcessor on hand-built span trees and on real SDK tracer spans."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.trace import SpanContext, TraceFlags
from span_trees import MS, feed, monitor_span, step_spans

from otel_train.common import attributes as A
from otel_train.records.steps_view import (
    SharedStepSpanProcessor,
    StepAssembler,
    StepView,
    StepViewProcessor,
    set_span_attribute,
)

pytestmark = pytest.mark.timeout(30)


class Collect(StepViewProcessor):
    """Keeps every view."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[StepView] = []
        self.ops: list[StepView] = []

    def on_step(self, view: StepView) -> None:
        self.steps.append(view)

    def on_operation(self, view: StepView) -> None:
        self.ops.append(view)


def test_a_step_view_holds_the_root_and_every_phase_once_the_root_arrives() -> None:
    c = Collect()
    spans = step_spans(3, [("data", "train", 0, 10), ("forward", "train", 10, 60)], 100)
    feed(c, spans[:-1])
    assert c.steps == []
    c.on_end(spans[-1])
    (view,) = c.steps
    assert view.step == 3 and view.duration_ns == 100 * MS and view.loader == "train"
    assert sorted(p[0] for p in view.phases) == ["data", "forward"]
    assert view.monitor_ns == 0 and view.operations == []


def test_a_monitor_nested_in_a_monitor_is_not_counted_twice() -> None:
    c = Collect()
    phases = [("forward", "train", 0, 50),
              ("eval", "monitor", 50, 90),
              ("val_loss", "monitor", 60, 80, 1),          # nested in eval
              ("data", "monitor", 60, 65, 2, "val"),        # val loader inside val_loss
              ("stats", "monitor", 20, 30, 0)]              # monitor inside a train phase
    feed(c, step_spans(1, phases, 100))
    (view,) = c.steps
    assert sorted(view.operations) == [("eval", 40 * MS), ("stats", 10 * MS)]
    assert view.monitor_ns == 50 * MS
    assert sorted(p[0] for p in view.top_level_phases()) == ["eval", "forward"]


def test_monitoring_between_steps_becomes_an_operation_view() -> None:
    c = Collect()
    c.on_end(monitor_span("checkpoint", after_step=9, duration_ms=250))
    (op,) = c.ops
    assert not op.is_step and op.name == "checkpoint" and op.step == 9
    assert op.operations == [("checkpoint", 250 * MS)] and op.monitor_ns == 250 * MS


def test_spans_without_contract_attributes_are_ignored() -> None:
    c = Collect()
    ctx = SpanContext(5, 6, False, TraceFlags(1))
    c.on_end(ReadableSpan(name="user.span", context=ctx, parent=None, attributes={"x": 1},
                          start_time=1, end_time=2))
    c.on_end(ReadableSpan(name="train.step", context=ctx, parent=None, attributes=None,
                          start_time=1, end_time=2))
    assert c.steps == [] and c.ops == []
    assert c._assembler is not None and c._assembler.ignored_spans == 2


def test_incomplete_traces_are_bounded_and_the_evictions_counted() -> None:
    views: list[StepView] = []
    asm = StepAssembler(views.append, max_pending_traces=4)
    steps = [step_spans(i, [("forward", "train", 0, 5)], 10) for i in range(10)]
    for child, _root in steps:
        asm.add(child)  # children only
    assert asm.evicted_traces == 6
    assert views == []
    for _child, root in steps:
        asm.add(root)
    # The 4 newest traces were still held: their steps come whole, the evicted ones bare.
    assert [len(v.phases) for v in views] == [0] * 6 + [1] * 4


def test_spans_from_an_sdk_tracer_that_follows_the_contract_are_assembled() -> None:
    c = Collect()
    provider = TracerProvider()
    provider.add_span_processor(c)
    tracer = provider.get_tracer("foreign")
    t0 = 1_000_000_000
    base = {A.STEP: 4, A.RANK: 0}
    root = tracer.start_span(A.STEP_SPAN_NAME, attributes=base, start_time=t0)
    ctx = trace.set_span_in_context(root)
    fwd = tracer.start_span("forward", context=ctx, start_time=t0,
                            attributes={**base, A.PHASE: "forward", A.PHASE_KIND: "train"})
    fwd.end(end_time=t0 + 70 * MS)
    inf = tracer.start_span("inference", context=ctx, start_time=t0 + 70 * MS,
                            attributes={**base, A.PHASE: "inference", A.PHASE_KIND: "monitor"})
    inf.end(end_time=t0 + 100 * MS)
    root.end(end_time=t0 + 100 * MS)
    (view,) = c.steps
    assert view.monitor_ns == 30 * MS and view.duration_ns == 100 * MS
    # BoundedAttributes are immutable: marking replaces them with a mutable copy
    set_span_attribute(view.span, A.SLOW, True)
    assert view.span.attributes[A.SLOW] is True and view.span.attributes[A.STEP] == 4
    provider.shutdown()


def test_a_shared_processor_assembles_once_and_feeds_every_processor_in_order() -> None:
    order: list[str] = []

    class Named(StepViewProcessor):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        def on_step(self, view: StepView) -> None:
            order.append(self.name)

    class Broken(StepViewProcessor):
        def on_step(self, view: StepView) -> None:
            raise RuntimeError("bug")

    a, b = Named("a"), Named("b")
    shared = SharedStepSpanProcessor([a, Broken(), b])
    feed(shared, step_spans(0, [("forward", "train", 0, 5)], 10))
    assert order == ["a", "b"]
    assert shared.errors == 1
    assert a._lock is shared.lock and b._lock is shared.lock


def test_a_frame_of_views_goes_to_each_processor_in_turn_in_order_a_failure_counted() -> None:
    from otel_train.records.span_rows import view_from_record

    seen: list[tuple[str, str, int]] = []

    class Marks(StepViewProcessor):  # like the slow-step processor: marks views first
        def on_step(self, view: StepView) -> None:
            view.slow = view.step % 2 == 1
            seen.append(("marks", "step", view.step))

        def on_operation(self, view: StepView) -> None:
            seen.append(("marks", "op", view.step))

    class Reads(StepViewProcessor):
        def on_step(self, view: StepView) -> None:
            seen.append(("reads", f"step slow={view.slow}", view.step))

        def on_operation(self, view: StepView) -> None:
            seen.append(("reads", "op", view.step))

    class Broken(StepViewProcessor):
        def on_step(self, view: StepView) -> None:
            if view.step == 1:
                raise RuntimeError("bug")

    phase = ("forward", "train", None, 5, 1, 7, 100, 105, None, (), None, None)

    def step(i: int) -> tuple:
        return ("train.step", 1, 7, 1, 100, 110, {A.STEP: i}, None, (), [phase], None)

    op = ("checkpoint", 2, 8, 1, 110, 120, {A.STEP: 1, A.PHASE: "checkpoint"}, None, (),
          None, None)
    views = [view_from_record(r, 0) for r in (step(0), step(1), op, step(2))]
    shared = SharedStepSpanProcessor([Marks(), Broken(), Reads()])
    shared.on_views(views)
    # Each processor takes the whole frame, in order, before the next one does; what the
    # first marked is there for the last; the broken one is counted and starves nobody.
    assert seen == [("marks", "step", 0), ("marks", "step", 1), ("marks", "op", 1),
                    ("marks", "step", 2), ("reads", "step slow=False", 0),
                    ("reads", "step slow=True", 1), ("reads", "op", 1),
                    ("reads", "step slow=False", 2)]
    assert shared.errors == 1 and shared._assembler.views == 4


def test_a_frame_of_steps_alone_goes_to_each_processor_in_one_call_a_failing_step_counted(
) -> None:
    """A frame with no operation: each processor outside a view-by-view group takes it in
    one on_steps call (its own, or the default, on_step each); a step it fails on is
    counted and the rest of the frame still reaches it and the processors after it; an
    on_steps that raises past its own guard is counted too, and starves nobody."""
    from otel_train.records.span_rows import view_from_record

    seen: list[tuple[str, int]] = []

    class Default(StepViewProcessor):
        def on_step(self, view: StepView) -> None:
            if view.step == 1:
                raise RuntimeError("bug")
            seen.append(("default", view.step))

    class Batch(StepViewProcessor):
        calls = 0

        def on_steps(self, views, failed) -> None:
            Batch.calls += 1
            for view in views:
                seen.append(("batch", view.step))

    class Unguarded(StepViewProcessor):
        def on_steps(self, views, failed) -> None:
            raise RuntimeError("bug")

    class Grouped(StepViewProcessor):  # view by view, with the next one
        view_by_view = True

        def on_step(self, view: StepView) -> None:
            if view.step == 2:
                raise RuntimeError("bug")
            seen.append(("grouped", view.step))

    class Last(Grouped):
        def on_step(self, view: StepView) -> None:
            seen.append(("last", view.step))

    phase = ("forward", "train", None, 5, 1, 7, 100, 105, None, (), None, None)
    views = [view_from_record(("train.step", 1, 7, 1, 100, 110, {A.STEP: i}, None, (),
                                [phase], None), 0) for i in range(3)]
    shared = SharedStepSpanProcessor([Default(), Batch(), Unguarded(), Grouped(), Last()])
    shared.on_views(views)
    assert seen == [("default", 0), ("default", 2), ("batch", 0), ("batch", 1), ("batch", 2),
                    ("grouped", 0), ("last", 0), ("grouped", 1), ("last", 1),
                    ("last", 2)]
    assert Batch.calls == 1 and shared.errors == 3 and shared._assembler.views == 3


def test_a_view_by_view_group_s_members_after_its_last_reader_take_a_frame_whole_and_its_last_member_may_take_the_group(
) -> None:
    """Consecutive view_by_view processors: a reader (reads_before) sees the members before
    it as of each view; the members after the group's last reader read no one's figures
    as of a step and take the frame whole, each in one on_steps call. A last member's
    take_group takes the frame for its group (False: fed view by view as usual); one that
    raises past its guards is counted and starves nobody after it."""
    from otel_train.records.span_rows import view_from_record

    seen: list[Any] = []

    class Counts(StepViewProcessor):
        view_by_view = True
        reads_before = False

        def __init__(self) -> None:
            super().__init__()
            self.steps = 0

        def on_step(self, view: StepView) -> None:
            self.steps += 1

    class Reader(StepViewProcessor):
        view_by_view = True

        def __init__(self, counts: Counts, take: Any = False) -> None:
            super().__init__()
            self.counts, self.take = counts, take

        def on_step(self, view: StepView) -> None:
            seen.append(("read", view.step, self.counts.steps))

        def take_group(self, before, views, failed) -> bool:
            if self.take == "raise":
                raise RuntimeError("bug")
            if self.take:
                seen.append(("took", [type(p).__name__ for p in before], len(views)))
            return bool(self.take)

    class After(StepViewProcessor):
        view_by_view = True
        reads_before = False

        def on_steps(self, views, failed) -> None:
            seen.append(("after", [v.step for v in views]))

    phase = ("forward", "train", None, 5, 1, 7, 100, 105, None, (), None, None)
    views = [view_from_record(("train.step", 1, 7, 1, 100, 110, {A.STEP: i}, None, (),
                                [phase], None), 0) for i in range(3)]
    counts = Counts()
    shared = SharedStepSpanProcessor([counts, Reader(counts), After()])
    shared.on_views(views)
    assert seen == [("read", 0, 1), ("read", 1, 2), ("read", 2, 3), ("after", [0, 1, 2])]
    assert [len(g) for g in shared._groups] == [2, 1]

    seen.clear()
    counts = Counts()
    shared = SharedStepSpanProcessor([counts, Reader(counts, take=True), After()])
    shared.on_views(views)
    assert seen == [("took", ["Counts"], 3), ("after", [0, 1, 2])] and counts.steps == 0

    seen.clear()
    counts = Counts()
    shared = SharedStepSpanProcessor([counts, Reader(counts, take="raise"), After()])
    shared.on_views(views)
    assert seen == [("after", [0, 1, 2])] and shared.errors == 1
