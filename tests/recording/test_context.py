"""User spans nest under the active phase (ActivePhaseSpan), through the ordinary OTel API."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN_CONTEXT
from train_helpers import clean_env, one, run_spans, start_in_process_run  # noqa: F401

from otel_train.recording.context import ActivePhaseSpan
from otel_train.common.drop_counter import DropCounter
from otel_train.pipeline.global_provider import RunScopedTracerProvider
from otel_train.common.identity import step_trace_id
from otel_train.recording.recorder import Recorder

pytestmark = pytest.mark.timeout(30)


def _proxy(rec: Recorder, sampled: bool = True) -> ActivePhaseSpan:
    ids = iter(range(100, 200))
    return ActivePhaseSpan(rec, "ctx-run", lambda: next(ids), lambda tid: sampled)


def test_outside_a_step_the_proxy_is_an_invalid_context():
    rec = Recorder(10, DropCounter(), None)
    proxy = _proxy(rec)
    assert proxy.get_span_context() is INVALID_SPAN_CONTEXT
    assert not proxy.is_recording()


def test_the_proxy_resolves_to_the_active_phase_then_back_to_the_root():
    rec = Recorder(10, DropCounter(), None)
    proxy = _proxy(rec)
    step = rec.begin_step(None, 4)
    root_ctx = proxy.get_span_context()
    assert root_ctx.trace_id == step_trace_id("ctx-run", 4)
    assert root_ctx.trace_flags.sampled
    with step.phase("forward"):
        fwd = proxy.get_span_context()
        assert fwd.span_id != root_ctx.span_id
        assert proxy.get_span_context().span_id == fwd.span_id  # drawn once
        with step.phase("attention"):
            inner = proxy.get_span_context()
            assert inner.span_id not in (fwd.span_id, root_ctx.span_id)
        assert proxy.get_span_context().span_id == fwd.span_id
    assert proxy.get_span_context().span_id == root_ctx.span_id
    assert step.span_ids == {-1: root_ctx.span_id, 0: fwd.span_id, 1: inner.span_id}
    rec.finish_step(step, None)
    assert proxy.get_span_context() is INVALID_SPAN_CONTEXT


def test_an_unsampled_step_gives_an_unsampled_parent():
    rec = Recorder(10, DropCounter(), None)
    proxy = _proxy(rec, sampled=False)
    rec.begin_step(None, 0)
    assert not proxy.get_span_context().trace_flags.sampled


def test_a_user_span_in_a_phase_is_a_child_of_that_phase(tmp_path):
    with start_in_process_run(tmp_path, run_id="ctx") as run:
        for step in run.steps([0, 1]):
            with step.phase("forward"):
                with step.phase("attention"):
                    with trace.get_tracer("user.lib").start_as_current_span("flash") as s:
                        s.set_attribute("heads", 8)
            with step.phase("optimizer"):
                with trace.get_tracer("user.lib").start_as_current_span("clip"):
                    pass
            with trace.get_tracer("user.lib").start_as_current_span("between"):
                pass
    spans = run_spans(run)
    for index in (0, 1):
        mine = [s for s in spans if s.trace_id == step_trace_id("ctx", index)]
        by = {s.name: s for s in mine}
        assert set(by) == {"train.step", "data", "forward", "attention", "optimizer",
                           "flash", "clip", "between"}
        assert by["flash"].parent_id == by["attention"].span_id
        assert by["clip"].parent_id == by["optimizer"].span_id
        assert by["between"].parent_id == by["train.step"].span_id
        assert by["flash"].attributes == {"heads": 8}
        assert by["flash"].resource == by["train.step"].resource


def test_a_user_span_outside_any_step_starts_its_own_trace(tmp_path):
    with start_in_process_run(tmp_path) as run:
        with trace.get_tracer("user.lib").start_as_current_span("setup"):
            pass
        for _step in run.steps([0]):
            pass
    spans = run_spans(run)
    setup = one(spans, "setup")
    assert setup.is_root
    assert setup.trace_id != one(spans, "train.step").trace_id


def test_a_user_span_inside_monitoring_between_steps_nests_under_that_operation(tmp_path):
    with start_in_process_run(tmp_path) as run:
        for _step in run.steps([0]):
            pass
        with run.monitor("checkpoint"):
            with trace.get_tracer("user.lib").start_as_current_span("write_shards"):
                pass
        with trace.get_tracer("user.lib").start_as_current_span("after"):
            pass
    spans = run_spans(run)
    op, inner = one(spans, "train.checkpoint"), one(spans, "write_shards")
    assert op.is_root
    assert inner.parent_id == op.span_id and inner.trace_id == op.trace_id
    assert one(spans, "after").is_root  # the operation ended: back to no parent


def test_tracers_obtained_earlier_follow_the_active_run(tmp_path):
    tracer = trace.get_tracer("long.lived")
    with start_in_process_run(tmp_path / "a") as first:
        for _step in first.steps([0]):
            with tracer.start_as_current_span("in-first"):
                pass
    with tracer.start_as_current_span("between-runs") as span:
        assert not span.is_recording()  # no run active: a no-op
    with start_in_process_run(tmp_path / "b") as second:
        for _step in second.steps([0]):
            with tracer.start_as_current_span("in-second"):
                pass
    assert isinstance(trace.get_tracer_provider(), RunScopedTracerProvider)
    assert "in-first" in {s.name for s in run_spans(first)}
    names_second = {s.name for s in run_spans(second)}
    assert "in-second" in names_second and "in-first" not in names_second
    assert "between-runs" not in names_second


def test_the_context_is_restored_after_the_run(tmp_path):
    before = trace.get_current_span()
    with start_in_process_run(tmp_path):
        assert isinstance(trace.get_current_span(), ActivePhaseSpan)
    assert trace.get_current_span() is before
