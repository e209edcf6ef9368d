"""The hot path and the Run API: steps, phases, monitoring, errors, and the spans they give.

Spans are read back from the run's span file (a real exporter writing JSON lines).
"""

from __future__ import annotations

import time

import pytest
import torch
from train_helpers import (  # noqa: F401  (clean_env: autouse fixture)
    SLACK_SECONDS,
    SlowIterable,
    clean_env,
    one,
    run_spans,
    start_in_process_run,
)

from otel_train.common.attributes import KIND_MONITOR, KIND_TRAIN
from otel_train.common.drop_counter import DropCounter
from otel_train.recording.recorder import Phase, Recorder, Step

pytestmark = pytest.mark.timeout(60)


# -- the flat event list, without a Run -----------------------------------------------------

def test_phases_are_reused_per_name_kind_and_loader():
    rec = Recorder(10, DropCounter(), None)
    assert rec.phase("forward", KIND_TRAIN) is rec.phase("forward", KIND_TRAIN)
    assert rec.phase("forward", KIND_TRAIN) is not rec.phase("forward", KIND_MONITOR)
    assert rec.phase("data", KIND_TRAIN, "a") is not rec.phase("data", KIND_TRAIN, "b")


def test_a_full_record_queue_counts_the_dropped_spans():
    drops = DropCounter()
    rec = Recorder(1, drops, None)
    for i in range(3):
        step = Step(rec, i, None)
        with step.phase("forward"):
            pass
        step._finish(None)
    assert len(rec.queue) == 1
    assert drops.counts() == {"record_queue_full": 4}  # 2 steps x (root + forward)


# -- steps ----------------------------------------------------------------------------------

def test_steps_yield_one_step_per_item_with_index_and_batch(tmp_path):
    items = ["a", "b", "c"]
    seen = []
    with start_in_process_run(tmp_path, run_id="r1") as run:
        for step in run.steps(items, loader="train"):
            seen.append((step.index, step.batch))
            assert run._recorder.current is step
        assert run._recorder.current is None
    assert seen == [(0, "a"), (1, "b"), (2, "c")]
    roots = [s for s in run_spans(run) if s.name == "train.step"]
    assert sorted(s.attributes["train.step"] for s in roots) == [0, 1, 2]


def test_the_batch_is_released_when_the_step_ends(tmp_path):
    with start_in_process_run(tmp_path) as run:
        steps = list(run.steps([object()]))
    assert steps[0].batch is None


def test_a_step_ended_in_the_loop_body_is_queued_once_and_the_loop_goes_on(tmp_path):
    with start_in_process_run(tmp_path) as run:
        for step in run.steps(range(3)):
            with step.phase("forward"):
                pass
            if step.index == 1:
                step.end()  # the step ends here, not when the loop comes round
                time.sleep(0.05)  # work after the end is no part of the step
                with pytest.raises(RuntimeError, match="step 1, which has already ended"):
                    step.phase("backward")
            assert run._recorder.current is (None if step.index == 1 else step)
    roots = sorted((s for s in run_spans(run) if s.is_root),
                   key=lambda s: s.attributes["train.step"])
    assert [s.attributes["train.step"] for s in roots] == [0, 1, 2]
    assert roots[1].duration_seconds < 0.05  # ended by step.end(), before the sleep
    assert roots[2].start_ns - roots[1].end_ns >= 0.05e9
    assert run._recorder.next_index == 3


def test_data_phase_covers_the_fetch_and_names_the_loader(tmp_path):
    fetch = 0.05
    loader = SlowIterable([1, 2], fetch)
    with start_in_process_run(tmp_path) as run:
        for step in run.steps(loader, loader="train-main"):
            with step.phase("forward"):
                pass
    spans = run_spans(run)
    data = [s for s in spans if s.name == "data"]
    assert len(data) == 2  # the fetch that found the loader exhausted is no step
    roots = {s.span_id: s for s in spans if s.is_root}
    assert len(roots) == 2
    for d in data:
        assert fetch <= d.duration_seconds < fetch + SLACK_SECONDS
        assert d.attributes["train.dataloader"] == "train-main"
        assert d.attributes["train.phase"] == "data"
        assert d.attributes["train.phase.kind"] == "train"
        assert d.parent_id in roots
        root = roots[d.parent_id]
        assert root.start_ns <= d.start_ns and d.end_ns <= root.end_ns
        assert root.attributes["train.dataloader"] == "train-main"


def test_nested_phases_are_children_of_the_enclosing_phase(tmp_path):
    with start_in_process_run(tmp_path) as run:
        for step in run.steps([0]):
            with step.phase("forward"):
                with step.phase("attention"):
                    time.sleep(0.01)
            with step.phase("backward"):
                pass
    spans = run_spans(run)
    root, forward = one(spans, "train.step"), one(spans, "forward")
    attention, backward = one(spans, "attention"), one(spans, "backward")
    assert forward.parent_id == root.span_id
    assert backward.parent_id == root.span_id
    assert attention.parent_id == forward.span_id
    assert forward.start_ns <= attention.start_ns and attention.end_ns <= forward.end_ns
    assert len({s.trace_id for s in spans}) == 1


def test_phase_set_attribute_lands_on_the_innermost_open_phase(tmp_path):
    with start_in_process_run(tmp_path) as run:
        for step in run.steps([0]):
            with step.phase("forward") as fwd:
                with step.phase("attention"):
                    fwd.set_attribute("heads", 8)
                fwd.set_attribute("tokens", 128)
    spans = run_spans(run)
    assert one(spans, "attention").attributes["heads"] == 8
    assert one(spans, "forward").attributes["tokens"] == 128
    assert "tokens" not in one(spans, "attention").attributes


def test_an_exception_in_a_phase_marks_phase_and_step_and_propagates_unchanged(tmp_path):
    boom = ValueError("loss is nan")
    with pytest.raises(ValueError) as caught:
        with start_in_process_run(tmp_path) as run:
            for step in run.steps([0, 1]):
                with step.phase("forward"):
                    raise boom
    assert caught.value is boom
    spans = run_spans(run)
    assert len([s for s in spans if s.is_root]) == 1  # the loop stopped at step 0
    root, forward = one(spans, "train.step"), one(spans, "forward")
    for span in (forward, root):
        assert span.status_code == "ERROR"
        assert "ValueError" in span.status_message and "loss is nan" in span.status_message
        (name, attrs), = span.events
        assert name == "exception"
        assert attrs["exception.type"] == "ValueError"
        assert attrs["exception.message"] == "loss is nan"
        assert "raise boom" in attrs["exception.stacktrace"]
    assert one(spans, "data").status_code == "UNSET"


def test_an_exception_in_the_loop_body_outside_a_phase_marks_the_step(tmp_path):
    boom = KeyError("missing")
    with pytest.raises(KeyError) as caught:
        with start_in_process_run(tmp_path) as run:
            for step in run.steps([0, 1]):
                with step.phase("forward"):
                    pass
                if step.index == 1:
                    raise boom
    assert caught.value is boom
    spans = run_spans(run)
    root0 = one(spans, "train.step", **{"train.step": 0})
    root1 = one(spans, "train.step", **{"train.step": 1})
    assert root0.status_code == "UNSET"
    assert root1.status_code == "ERROR"
    assert root1.events[0][0] == "exception"
    assert root1.events[0][1]["exception.type"] == "KeyError"
    assert one(spans, "forward", **{"train.step": 1}).status_code == "UNSET"


def test_an_exception_from_the_loader_marks_the_data_phase(tmp_path):
    def loader():
        yield 0
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        with start_in_process_run(tmp_path) as run:
            for _step in run.steps(loader()):
                pass
    spans = run_spans(run)
    bad_data = one(spans, "data", **{"train.step": 1})
    assert bad_data.status_code == "ERROR"
    assert one(spans, "train.step", **{"train.step": 1}).status_code == "ERROR"
    assert one(spans, "train.step", **{"train.step": 0}).status_code == "UNSET"


def test_break_out_of_steps_ends_the_step_ok(tmp_path):
    with start_in_process_run(tmp_path) as run:
        for step in run.steps([0, 1, 2, 3]):
            with step.phase("forward"):
                pass
            if step.index == 1:
                break
        assert run._recorder.current is None
        time.sleep(0.01)
    spans = run_spans(run)
    roots = [s for s in spans if s.is_root]
    assert sorted(r.attributes["train.step"] for r in roots) == [0, 1]
    assert all(r.status_code == "UNSET" for r in roots)
    root1 = one(spans, "train.step", **{"train.step": 1})
    # The step ended at the break, not at shutdown.
    assert root1.end_ns - one(spans, "forward", **{"train.step": 1}).end_ns < 0.01 * 1e9


def test_a_phase_outside_a_step_raises_a_clear_error(tmp_path):
    with start_in_process_run(tmp_path) as run:
        with pytest.raises(RuntimeError, match=r"outside a step.*run\.steps"):
            run.phase("forward")
        for step in run.steps([0]):
            phase = step.phase("forward")
        with pytest.raises(RuntimeError, match="outside a step"):
            with phase:
                pass


def test_a_phase_on_an_ended_step_raises(tmp_path):
    with start_in_process_run(tmp_path) as run:
        for step in run.steps([0]):
            pass
        with pytest.raises(RuntimeError, match="already ended"):
            step.phase("forward")
        # A final eval written like the quick start's: the error names the way to do it.
        with pytest.raises(RuntimeError, match=r"already ended.*run\.monitor\('inference'\)"):
            step.monitor("inference")
        with run.monitor("inference"):
            pass
    assert one(run_spans(run), "inference").attributes["train.phase.kind"] == "monitor"


def test_a_kept_step_cannot_open_phases_in_the_step_that_follows_it(tmp_path):
    with start_in_process_run(tmp_path) as run:
        kept = None
        for step in run.steps(range(2)):
            if kept is None:
                kept = step
                continue
            with pytest.raises(RuntimeError, match="step 0, which has already ended"):
                kept.phase("forward")
            with pytest.raises(RuntimeError, match="already ended"):
                kept.monitor("inference")
    spans = run_spans(run)
    assert not [s for s in spans if s.name in ("forward", "inference")]


def test_run_step_context_manager_with_its_own_data_phase(tmp_path):
    with start_in_process_run(tmp_path) as run:
        for _ in range(2):
            with run.step(loader="stream") as step:
                with step.phase("data"):
                    time.sleep(0.02)
                with step.phase("forward"):
                    pass
        assert run._recorder.current is None
    spans = run_spans(run)
    roots = sorted((s for s in spans if s.is_root), key=lambda s: s.attributes["train.step"])
    assert [r.attributes["train.step"] for r in roots] == [0, 1]
    data = one(spans, "data", **{"train.step": 0})
    assert data.attributes["train.dataloader"] == "stream"
    assert data.parent_id == roots[0].span_id
    assert 0.02 <= data.duration_seconds < 0.02 + SLACK_SECONDS


def test_run_step_marks_an_exception_and_propagates_it(tmp_path):
    with start_in_process_run(tmp_path) as run:
        with pytest.raises(ZeroDivisionError):
            with run.step() as step:
                with step.phase("forward"):
                    1 / 0  # noqa: B018
    spans = run_spans(run)
    assert one(spans, "train.step").status_code == "ERROR"
    assert one(spans, "forward").status_code == "ERROR"


def test_steps_do_not_nest(tmp_path):
    with start_in_process_run(tmp_path) as run:
        for step in run.steps([0]):
            with pytest.raises(RuntimeError, match="do not nest"):
                run.step()
            with pytest.raises(RuntimeError, match="do not nest"):
                next(iter(run.steps([1])))
            with step.phase("forward"):
                pass  # the outer step is unharmed
        with run.step() as outer:
            with pytest.raises(RuntimeError, match="do not nest"):
                run.step()
    spans = run_spans(run)
    assert sorted(s.attributes["train.step"] for s in spans if s.is_root) == [0, 1]
    assert outer.index == 1


def test_monitor_inside_a_step_is_a_monitor_phase(tmp_path):
    with start_in_process_run(tmp_path) as run:
        for step in run.steps([0]):
            with run.monitor("inference"):
                time.sleep(0.02)
            with step.monitor("val_loss"):
                with step.phase("forward"):  # work inside monitoring is monitoring
                    pass
    spans = run_spans(run)
    root = one(spans, "train.step")
    inference, val = one(spans, "inference"), one(spans, "val_loss")
    for s in (inference, val):
        assert s.parent_id == root.span_id
        assert s.attributes["train.phase.kind"] == "monitor"
    assert one(spans, "forward").attributes["train.phase.kind"] == "monitor"
    assert one(spans, "forward").parent_id == val.span_id
    assert one(spans, "data").attributes["train.phase.kind"] == "train"
    assert inference.duration_seconds >= 0.02


def test_monitor_outside_steps_is_its_own_root_span(tmp_path):
    with start_in_process_run(tmp_path, run_id="mon") as run:
        for _step in run.steps([0, 1]):
            pass
        with run.monitor("checkpoint") as op:
            op.set_attribute("bytes", 4096)
            time.sleep(0.02)
    spans = run_spans(run)
    ckpt = [s for s in spans if s.attributes.get("train.phase") == "checkpoint"]
    assert len(ckpt) == 1
    span = ckpt[0]
    assert span.is_root
    assert span.attributes["train.phase.kind"] == "monitor"
    assert span.attributes["train.step"] == 1  # after the last step
    assert span.attributes["train.run.id"] == "mon"
    assert span.attributes["bytes"] == 4096
    assert span.trace_id not in {s.trace_id for s in spans if s.name == "train.step"}
    assert 0.02 <= span.duration_seconds < 0.02 + SLACK_SECONDS


def test_monitor_outside_steps_records_an_exception(tmp_path):
    with start_in_process_run(tmp_path) as run:
        with pytest.raises(RuntimeError, match="eval failed"):
            with run.monitor("eval"):
                raise RuntimeError("eval failed")
    span = one(run_spans(run), "eval")
    assert span.status_code == "ERROR"
    assert span.events[0][1]["exception.type"] == "RuntimeError"


def test_set_attribute_with_a_cpu_tensor_becomes_a_float_on_the_root(tmp_path):
    with start_in_process_run(tmp_path) as run:
        for step in run.steps([0]):
            loss = torch.tensor(1.5, requires_grad=True) * 2
            step.set_attribute("train.loss", loss)
            step.set_attribute("train.lr", 3e-4)
            step.set_attribute("train.tokens", torch.tensor([1, 2, 3]))
    root = one(run_spans(run), "train.step")
    assert root.attributes["train.loss"] == 3.0
    assert isinstance(root.attributes["train.loss"], float)
    assert root.attributes["train.lr"] == 3e-4
    assert isinstance(root.attributes["train.tokens"], str)  # not a scalar: its text


def test_iter_data_inside_a_monitor_phase_gives_monitor_data_spans(tmp_path):
    val_loader = SlowIterable(["v0", "v1", "v2"], 0.01)
    got = []
    with start_in_process_run(tmp_path) as run:
        for step in run.steps([0], loader="train"):
            with step.monitor("val_loss"):
                for vb in step.iter_data(val_loader, loader="val"):
                    got.append(vb)
    assert got == ["v0", "v1", "v2"]
    assert val_loader.fetches == 4  # the last fetch found it exhausted ...
    spans = run_spans(run)
    val = one(spans, "val_loss")
    val_data = [s for s in spans if s.name == "data"
                and s.attributes["train.dataloader"] == "val"]
    assert len(val_data) == 3  # ... and is not a span
    for d in val_data:
        assert d.parent_id == val.span_id
        assert d.attributes["train.phase.kind"] == "monitor"
        assert d.duration_seconds >= 0.01
    train_data = one(spans, "data", **{"train.dataloader": "train"})
    assert train_data.attributes["train.phase.kind"] == "train"


def test_shutdown_twice_is_harmless_and_the_run_is_closed_after(tmp_path):
    run = start_in_process_run(tmp_path)
    with run:
        for _step in run.steps([0]):
            pass
    run.shutdown()
    run.shutdown(timeout=0.1)
    with pytest.raises(RuntimeError, match="after the run was shut down"):
        next(iter(run.steps([1])))
    with pytest.raises(RuntimeError, match="after the run was shut down"):
        run.step()
    with pytest.raises(RuntimeError, match="after the run was shut down"):
        run.monitor("eval")
    assert len([s for s in run_spans(run) if s.is_root]) == 1


def test_shutdown_inside_a_phase_ends_the_open_step(tmp_path):
    run = start_in_process_run(tmp_path)
    step = run.step()
    with step.phase("forward"):
        run.shutdown()
    spans = run_spans(run)
    root, forward = one(spans, "train.step"), one(spans, "forward")
    assert forward.parent_id == root.span_id
    assert forward.end_ns <= root.end_ns


def test_flush_exports_every_step_recorded_so_far(tmp_path):
    run = start_in_process_run(tmp_path)
    try:
        for step in run.steps(range(3)):
            with step.phase("forward"):
                pass
        assert run.flush()
        assert len(run_spans(run)) == 9  # 3 x (root, data, forward)
    finally:
        run.shutdown()


def test_phase_objects_are_plain_reusable_context_managers(tmp_path):
    with start_in_process_run(tmp_path) as run:
        phases = []
        for step in run.steps([0, 1]):
            phases.append(step.phase("forward"))
    assert phases[0] is phases[1]
    assert isinstance(phases[0], Phase)
