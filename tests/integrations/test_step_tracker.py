"""HookStepTracker: the one module that turns hook and callback events into steps."""

from __future__ import annotations

import logging

import pytest
import torch
from integration_support import children, monitor_roots, receiver_run, step_roots
from otlp_receivers import GrpcOtlpReceiver

from otel_train.integrations.step_tracker import HookStepTracker, attach_backward_probe


def _failing_run():
    raise RuntimeError("the collector config is broken")


def test_a_failing_handler_is_logged_and_counted_and_returns_none(caplog) -> None:
    tracker = HookStepTracker(_failing_run)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        assert tracker.optimizer_pre(opt) is None
        assert tracker.optimizer_pre(opt) is None
        tracker.fetched("train", 1, 2)
    assert tracker.hook_failures.counts() == {"optimizer_pre": 2, "fetched": 1}
    logged = [r.getMessage() for r in caplog.records if r.name == "otel_train"]
    # Rate-limited per handler: the second optimizer_pre failure is counted, not logged.
    assert sum("optimizer_pre failed" in m for m in logged) == 1
    assert any("fetched failed" in m and "collector config is broken" in m for m in logged)


def test_the_backward_probe_reports_start_then_end_once_per_backward() -> None:
    events: list[str] = []
    x = torch.randn(4, 3, requires_grad=True)
    out = (x * 2, x.sum())  # two outputs that receive a gradient: still one start
    assert attach_backward_probe(out, lambda: events.append("start"),
                                 lambda: events.append("end"))
    (out[0].sum() + out[1]).backward()
    assert events == ["start", "end"]
    with torch.no_grad():
        assert not attach_backward_probe(x * 2, lambda: None, lambda: None)


def test_closing_a_phase_closes_what_opened_inside_it_and_monitoring_ends_with_its_step(
        tmp_path) -> None:
    with GrpcOtlpReceiver() as recv:
        run = receiver_run(recv, tmp_path)
        tracker = HookStepTracker(lambda: run, hooks_delimit_steps=False)
        t = run.timestamp_ns
        tracker.begin_step("train", 0, t())
        tracker.open_phase("micro_step", t())
        tracker.open_phase("forward", t())
        assert tracker.close_phase("micro_step", t())  # forward was still open: it ends too
        assert not tracker.close_phase("forward", t())  # closed with micro_step: nothing to close
        tracker.open_monitoring("log")
        assert tracker.monitoring_open and tracker.monitor_record is None
        tracker.end_step()
        assert not tracker.monitoring_open
        tracker.open_monitoring("val_loss")  # between steps: a span of its own
        assert tracker.monitor_record is not None
        tracker.close_monitoring()
        run.shutdown()
        spans = recv.spans()
    root = step_roots(spans)[0]
    assert [s.name for s in children(spans, root)] == ["micro_step", "log"]
    assert [s.name for s in children(spans, children(spans, root)[0])] == ["forward"]
    assert children(spans, root)[1].attributes["train.phase.kind"] == "monitor"
    assert [s.name for s in monitor_roots(spans)] == ["val_loss"]


def test_without_the_trainer_opening_a_step_forwards_record_nothing(tmp_path) -> None:
    run_calls: list[int] = []
    tracker = HookStepTracker(lambda: run_calls.append(1), hooks_delimit_steps=False)
    model = torch.nn.Linear(2, 1)
    undo = tracker.hook_model(model, wrap_train=False)
    model(torch.randn(1, 2)).sum().backward()
    for fn in undo:
        fn()
    assert run_calls == [] and tracker.step is None
    assert tracker.hook_failures.counts() == {}
    assert not model._forward_hooks and "train" not in model.__dict__


@pytest.mark.parametrize("wrap_train", [True, False])
def test_hook_model_wraps_train_only_when_asked(wrap_train: bool) -> None:
    tracker = HookStepTracker(_failing_run, hooks_delimit_steps=False)
    model = torch.nn.Linear(2, 1)
    undo = tracker.hook_model(model, wrap_train=wrap_train)
    assert ("train" in model.__dict__) is wrap_train
    for fn in undo:
        fn()
    assert "train" not in model.__dict__
