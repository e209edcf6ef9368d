"""The real Lightning Trainer on a tiny model, traced by the callback."""

from __future__ import annotations

import pytest

L = pytest.importorskip("lightning")

import torch  # noqa: E402
from integration_support import children, monitor_roots, receiver_run, step_roots  # noqa: E402
from otlp_receivers import GrpcOtlpReceiver  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import otel_train  # noqa: E402
from otel_train.integrations.lightning import LightningStepTraceCallback  # noqa: E402


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201, D102
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx, dataloader_idx=0):  # noqa: ANN001, ANN201, D102
        x, y = batch
        self.log("val", F.mse_loss(self.net(x), y))

    def configure_optimizers(self):  # noqa: ANN201, D102
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader(n: int) -> torch.utils.data.DataLoader:
    ds = torch.utils.data.TensorDataset(torch.randn(n, 8), torch.randn(n, 1))
    return torch.utils.data.DataLoader(ds, batch_size=4)


def _trainer(callback: LightningStepTraceCallback, accumulate: int = 1) -> L.Trainer:
    return L.Trainer(
        max_steps=4, accumulate_grad_batches=accumulate, val_check_interval=2 * accumulate,
        limit_val_batches=2, num_sanity_val_steps=0, accelerator="cpu", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[callback])


def _fit(tmp_path, accumulate: int, val: dict | list, **callback_kwargs):
    with GrpcOtlpReceiver() as recv:
        run = receiver_run(recv, tmp_path)
        trainer = L.Trainer(
            max_steps=4, accumulate_grad_batches=accumulate, val_check_interval=2 * accumulate,
            limit_val_batches=2, num_sanity_val_steps=0, accelerator="cpu", logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            callbacks=[LightningStepTraceCallback(run=run, **callback_kwargs)])
        trainer.fit(Tiny(), _loader(64), val)
        run.shutdown()
        return recv.spans()


def test_each_optimizer_step_has_data_forward_backward_optimizer(tmp_path) -> None:
    spans = _fit(tmp_path, 1, [_loader(8)])
    roots = step_roots(spans)
    assert sorted(roots) == [0, 1, 2, 3]
    for root in roots.values():
        kids = children(spans, root)
        assert [s.name for s in kids] == ["data", "forward", "backward", "optimizer"]
        for a, b in zip(kids, kids[1:]):
            assert a.end_time_unix_nano <= b.start_time_unix_nano
        # Only the data span carries its loader (issue 11: compute phases read none).
        assert [s.attributes.get("train.dataloader") for s in kids] == ["train", None, None, None]


def test_accumulated_batches_are_micro_steps_of_one_step(tmp_path) -> None:
    spans = _fit(tmp_path, 2, [_loader(8)])
    roots = step_roots(spans)
    assert sorted(roots) == [0, 1, 2, 3]
    for root in roots.values():
        kids = children(spans, root)
        assert [s.name for s in kids] == ["micro_step", "micro_step", "optimizer"]
        assert [s.attributes["train.micro_step"] for s in kids[:2]] == [0, 1]
        for micro in kids[:2]:
            assert [s.name for s in children(spans, micro)] == ["data", "forward", "backward"]
        # Each micro-batch's samples (4, from its shape) add up on the step's root.
        assert root.attributes["train.samples"] == 8 and "train.tokens" not in root.attributes


def test_validation_is_monitoring_per_named_dataloader(tmp_path) -> None:
    spans = _fit(tmp_path, 1, [_loader(8), _loader(8)], val_loader_names=["clean", "noisy"])
    val = monitor_roots(spans, "val_loss")
    assert [s.attributes["train.dataloader"] for s in val] == ["clean", "noisy"] * 2
    assert all(s.attributes["train.phase.kind"] == "monitor" for s in val)
    assert [s.attributes["train.step"] for s in val] == [1, 1, 3, 3]
    roots = step_roots(spans)
    # Validation after step 1 is not counted as step 2's data fetch.
    assert val[1].end_time_unix_nano <= children(spans, roots[2])[0].start_time_unix_nano


def test_teardown_shuts_down_the_run_the_callback_started(tmp_path) -> None:
    with GrpcOtlpReceiver() as recv:
        cb = LightningStepTraceCallback(
            exporter="otlp", otlp_endpoint=recv.endpoint, otlp_protocol="grpc",
            prometheus_port=None, console=False, status_dir=str(tmp_path))
        _trainer(cb).fit(Tiny(), _loader(64), [_loader(8)])
        first = cb.run
        # fit() returned: every span is already exported, and the run is closed.
        assert sorted(step_roots(recv.spans())) == [0, 1, 2, 3]
        with pytest.raises(RuntimeError, match="shut down"):
            first.step()
        assert first.costs()["steps"] == 4  # still readable after the shutdown
        # The run the callback starts takes the run's default timing: on an accelerator the
        # validation loop is where the device is synchronized, never a training phase.
        assert first.options.device_sync == "auto"
        _trainer(cb).fit(Tiny(), _loader(64), [_loader(8)])  # a second fit: a new run
        second = cb.run
        assert second is not first
        with pytest.raises(RuntimeError, match="shut down"):
            second.step()
        spans = recv.spans()
    assert {r.attributes["train.run.id"] for r in spans if r.name == "train.step"} == {
        first.run_id, second.run_id}


def test_teardown_leaves_a_run_it_was_given_open(tmp_path) -> None:
    run = otel_train.start_run(exporter="none", prometheus_port=None, console=False,
                               status_dir=str(tmp_path))
    _trainer(LightningStepTraceCallback(run=run)).fit(Tiny(), _loader(32), [_loader(8)])
    with run.step():  # still open: the caller shuts it down
        pass
    run.shutdown()


def test_an_exception_in_the_callback_is_logged_and_counted_never_raised_into_the_trainer(
        tmp_path, caplog) -> None:
    run = otel_train.start_run(exporter="none", prometheus_port=None, console=False,
                               status_dir=str(tmp_path))

    def refuse(*args, **kwargs):
        raise RuntimeError("the run refuses to open a step")

    run.step = refuse  # our on_train_batch_start now fails inside the Trainer
    cb = LightningStepTraceCallback(run=run)
    trainer = _trainer(cb)
    with caplog.at_level("WARNING", logger="otel_train"):
        trainer.fit(Tiny(), _loader(64), [_loader(8)])  # does not raise
    run.shutdown()
    assert trainer.global_step == 4
    assert cb.hook_failures() == {"on_train_batch_start": 4}
    assert any("on_train_batch_start failed" in r.getMessage() and "refuses" in r.getMessage()
               for r in caplog.records)


class TinyWithTestAndPredict(Tiny):
    def test_step(self, batch, batch_idx, dataloader_idx=0):  # noqa: ANN001, ANN201, D102
        x, y = batch
        self.log("test", F.mse_loss(self.net(x), y))

    def predict_step(self, batch, batch_idx, dataloader_idx=0):  # noqa: ANN001, ANN201, D102
        return self.net(batch[0])


def test_test_and_predict_after_fit_are_their_own_monitoring_traces_with_loader_names(
        tmp_path) -> None:
    with GrpcOtlpReceiver() as recv:
        cb = LightningStepTraceCallback(
            exporter="otlp", otlp_endpoint=recv.endpoint, otlp_protocol="grpc",
            prometheus_port=None, console=False, status_dir=str(tmp_path))
        trainer = _trainer(cb)
        module = TinyWithTestAndPredict()
        trainer.fit(module, _loader(64), [_loader(8)])
        fit_run = cb.run
        trainer.test(module, [_loader(8), _loader(8)], verbose=False)
        test_run = cb.run
        predictions = trainer.predict(module, _loader(8))
        predict_run = cb.run
        spans = recv.spans()
    assert len(predictions) == 2  # the predict loop ran untouched
    # Each of fit, test and predict: its own run (the callback started it, teardown shut it
    # down), so every span below arrived.
    assert len({fit_run.run_id, test_run.run_id, predict_run.run_id}) == 3
    tested = [s for s in monitor_roots(spans, "val_loss")
              if s.attributes["train.run.id"] == test_run.run_id]
    assert [s.attributes["train.dataloader"] for s in tested] == ["test", "test1"]
    predicted = monitor_roots(spans, "inference")
    assert [s.attributes["train.dataloader"] for s in predicted] == ["predict"]
    for span in tested + predicted:
        assert span.attributes["train.phase.kind"] == "monitor"
        assert span.parent_span_id is None  # a root: a trace of its own
    assert len({s.trace_id for s in tested + predicted}) == 3
    assert predicted[0].attributes["train.run.id"] == predict_run.run_id
    # Validation inside fit stayed a validation span of the fit's run.
    assert {s.attributes["train.dataloader"] for s in monitor_roots(spans, "val_loss")
            if s.attributes["train.run.id"] == fit_run.run_id} == {"val"}


def test_validate_test_and_predict_loaders_take_the_names_given(tmp_path) -> None:
    with GrpcOtlpReceiver() as recv:
        run = receiver_run(recv, tmp_path)
        cb = LightningStepTraceCallback(run=run, test_loader_names=["clean", "noisy"],
                                        predict_loader_names=["batch_job"])
        trainer = _trainer(cb)
        module = TinyWithTestAndPredict()
        trainer.validate(module, {"held_out": _loader(8)}, verbose=False)
        trainer.test(module, [_loader(8), _loader(8)], verbose=False)
        trainer.predict(module, [_loader(4)])
        run.shutdown()
        spans = recv.spans()
    assert cb.hook_failures() == {}
    assert [s.attributes["train.dataloader"] for s in monitor_roots(spans, "val_loss")] == [
        "held_out", "clean", "noisy"]
    assert [s.attributes["train.dataloader"] for s in monitor_roots(spans, "inference")] == [
        "batch_job"]
    assert not step_roots(spans)  # no training: no steps
