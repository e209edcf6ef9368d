"""instrument(model, optimizer, dataloader): an unmodified loop traced through torch hooks."""

from __future__ import annotations

import pytest
import torch
from integration_support import children, monitor_roots, receiver_run, step_roots
from otlp_receivers import GrpcOtlpReceiver
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import otel_train
from otel_train.integrations import instrument


def _setup():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ds = TensorDataset(torch.randn(16, 8), torch.randn(16, 1))
    return model, opt, DataLoader(ds, batch_size=4), DataLoader(ds, batch_size=8)


def _loop(model, opt, train, val, epochs: int = 1) -> None:
    """The user's loop, untouched."""
    for _ in range(epochs):
        for x, y in train:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            for x, y in val:
                model(x)
        model.train()


def test_an_unmodified_loop_gives_the_same_step_traces(tmp_path) -> None:
    model, opt, train, val = _setup()
    with GrpcOtlpReceiver() as recv:
        run = receiver_run(recv, tmp_path)
        inst = instrument(model, opt, dataloader={"main": train}, run=run)
        _loop(model, opt, train, val, epochs=2)
        inst.uninstrument()
        run.shutdown()
        spans = recv.spans()
    roots = step_roots(spans)
    assert sorted(roots) == list(range(8))
    for root in roots.values():
        kids = children(spans, root)
        assert [s.name for s in kids] == ["data", "forward", "backward", "optimizer"]
        assert kids[0].attributes["train.dataloader"] == "main"
        for a, b in zip(kids, kids[1:]):
            assert a.end_time_unix_nano <= b.start_time_unix_nano
        assert kids[0].start_time_unix_nano == root.start_time_unix_nano  # the fetch opens it
        assert kids[-1].end_time_unix_nano <= root.end_time_unix_nano
    evals = monitor_roots(spans, "eval")
    assert [s.attributes["train.step"] for s in evals] == [3, 7]
    assert all(s.attributes["train.phase.kind"] == "monitor" for s in evals)


def test_uninstrument_restores_everything(tmp_path) -> None:
    model, opt, train, val = _setup()
    original_iter = DataLoader.__iter__
    run = otel_train.start_run(exporter="none", prometheus_port=None, console=False,
                               status_dir=str(tmp_path))
    inst = instrument(model, opt, dataloader=train, run=run)
    assert DataLoader.__iter__ is not original_iter
    assert "train" in model.__dict__ and model._forward_hooks
    inst.uninstrument()
    assert DataLoader.__iter__ is original_iter
    assert "train" not in model.__dict__
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks
    assert type(iter(train)).__name__ != "_TimedIterator"
    _loop(model, opt, train, val)  # runs, records nothing
    assert run._recorder.current is None
    run.shutdown()


def test_a_second_instrument_is_refused_until_uninstrument(tmp_path) -> None:
    model, opt, train, _ = _setup()
    run = otel_train.start_run(exporter="none", prometheus_port=None, console=False,
                               status_dir=str(tmp_path))
    with instrument(model, opt, run=run):
        with pytest.raises(RuntimeError, match="already instrumented"):
            instrument(model, opt, run=run)
    with instrument(model, opt, run=run):
        pass
    run.shutdown()


def test_a_failing_forward_still_leaves_later_steps_traced(tmp_path) -> None:
    model, opt, train, val = _setup()
    with GrpcOtlpReceiver() as recv:
        run = receiver_run(recv, tmp_path)
        with instrument(model, opt, dataloader=train, run=run):
            with pytest.raises(RuntimeError):
                model(torch.randn(2, 3))  # wrong shape: raises inside forward
            _loop(model, opt, train, val)
        run.shutdown()
        roots = step_roots(recv.spans())
    # The failed forward opened step 0; the loop's first fetch, forward, ... complete it.
    assert sorted(roots) == [0, 1, 2, 3]
    spans = recv.spans()
    assert [s.name for s in children(spans, roots[0])] == [
        "forward", "data", "forward", "backward", "optimizer"]
    assert [s.name for s in children(spans, roots[1])] == [
        "data", "forward", "backward", "optimizer"]


def test_an_exception_in_a_hook_is_logged_and_counted_never_raised_into_the_loop(
        tmp_path, caplog) -> None:
    model, opt, train, val = _setup()
    run = otel_train.start_run(exporter="none", prometheus_port=None, console=False,
                               status_dir=str(tmp_path))

    def refuse(*args, **kwargs):
        raise RuntimeError("the run refuses to open a step")

    run.step = refuse  # every hook that would open a step now fails
    with caplog.at_level("WARNING", logger="otel_train"):
        with instrument(model, opt, dataloader=train, run=run) as inst:
            _loop(model, opt, train, val)  # does not raise
    run.shutdown()
    assert inst.hook_failures() == {"fetched": 4, "forward_pre": 4, "optimizer_pre": 4}
    assert any("forward_pre failed" in r.getMessage() and "refuses" in r.getMessage()
               for r in caplog.records)
