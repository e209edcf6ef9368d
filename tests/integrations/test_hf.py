"""The real transformers Trainer on a tiny GPT-2 (from a config), traced by the callback."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

import torch  # noqa: E402
from integration_support import children, monitor_roots, receiver_run, step_roots  # noqa: E402
from otlp_receivers import GrpcOtlpReceiver  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

import otel_train  # noqa: E402
from otel_train.integrations.hf import TrainerStepTraceCallback  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 64, (n, 16), generator=torch.Generator().manual_seed(n))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class UserSpanCallback(TrainerCallback):
    """A user's callback that opens its own OTel span in on_step_end, before ours runs."""

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001, D102
        from opentelemetry import trace
        with trace.get_tracer("user").start_as_current_span("user.after_step"):
            pass


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):
    """Train 4 optimizer steps (2 micro-batches each, eval every 2), evaluate, generate."""
    tmp = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                       n_positions=32))
    with GrpcOtlpReceiver() as recv:
        run = receiver_run(recv, tmp)
        cb = TrainerStepTraceCallback(run=run)
        args = TrainingArguments(
            output_dir=str(tmp / "out"), max_steps=4, per_device_train_batch_size=2,
            gradient_accumulation_steps=2, eval_strategy="steps", eval_steps=2,
            logging_steps=2, save_strategy="no", report_to="none", use_cpu=True,
            disable_tqdm=True, include_num_input_tokens_seen=True)
        trainer = Trainer(model=model, args=args, train_dataset=Tokens(32),
                          eval_dataset=Tokens(4), callbacks=[cb])
        trainer.train()
        trainer.evaluate()
        model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, pad_token_id=0)
        cb.close()
        run.shutdown()
        yield recv.spans(), model


def test_every_optimizer_step_is_one_train_step_trace(trained) -> None:
    spans, _ = trained
    roots = step_roots(spans)
    assert sorted(roots) == [0, 1, 2, 3]
    assert len({r.trace_id for r in roots.values()}) == 4


def test_each_step_carries_its_share_of_the_trainers_token_count(trained) -> None:
    spans, _ = trained
    # 2 micro-batches of 2 sequences of 16 tokens (include_num_input_tokens_seen)
    assert {r.attributes.get("train.tokens") for r in step_roots(spans).values()} == {64}


def test_micro_steps_are_children_of_their_step_holding_forward_and_backward(trained) -> None:
    spans, _ = trained
    for root in step_roots(spans).values():
        top = children(spans, root)
        assert [s.name for s in top[:4]] == ["data", "micro_step", "micro_step", "optimizer"]
        assert [s.attributes["train.micro_step"] for s in top[1:3]] == [0, 1]
        for micro in top[1:3]:
            assert [s.name for s in children(spans, micro)] == ["forward", "backward"]
            fw, bw = children(spans, micro)
            assert fw.end_time_unix_nano <= bw.start_time_unix_nano
        assert top[2].end_time_unix_nano <= top[3].start_time_unix_nano  # clip in optimizer


def test_evaluation_during_training_is_a_monitoring_phase_of_its_step(trained) -> None:
    spans, _ = trained
    roots = step_roots(spans)
    for index in (1, 3):  # global steps 2 and 4 log and evaluate
        post = children(spans, roots[index])[4:]
        assert [s.name for s in post] == ["log", "val_loss"]
        assert all(s.attributes["train.phase.kind"] == "monitor" for s in post)
        assert post[-1].end_time_unix_nano <= roots[index].end_time_unix_nano
    assert [s.name for s in children(spans, roots[0])][4:] == []


def test_standalone_evaluate_and_generate_are_monitoring_spans(trained) -> None:
    spans, _ = trained
    names = [s.name for s in monitor_roots(spans)]
    assert names == ["val_loss", "inference"]
    assert all(s.attributes["train.phase.kind"] == "monitor" for s in monitor_roots(spans))
    assert monitor_roots(spans, "val_loss")[0].attributes["train.dataloader"] == "eval"


def test_close_removes_the_hooks_and_the_generate_wrapper(trained) -> None:
    _, model = trained
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert "generate" not in model.__dict__


def test_spans_a_users_callback_opens_nest_in_the_step(tmp_path) -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64,
                                       n_positions=32))
    with GrpcOtlpReceiver() as recv:
        run = receiver_run(recv, tmp_path)
        cb = TrainerStepTraceCallback(run=run)
        args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=2,
                                 per_device_train_batch_size=2, save_strategy="no",
                                 report_to="none", use_cpu=True, disable_tqdm=True)
        Trainer(model=model, args=args, train_dataset=Tokens(8),
                callbacks=[UserSpanCallback(), cb]).train()
        cb.close()
        run.shutdown()
        spans = recv.spans()
    roots = step_roots(spans)
    user = [s for s in spans if s.name == "user.after_step"]
    assert len(user) == 2
    assert {u.trace_id for u in user} == {r.trace_id for r in roots.values()}
    assert all(u.parent_span_id in {r.span_id for r in roots.values()} for u in user)


def _refuse_steps(*args, **kwargs):
    raise RuntimeError("the run refuses to open a step")


def test_an_exception_in_the_callback_is_logged_and_counted_never_raised_into_the_trainer(
        tmp_path, caplog) -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64,
                                       n_positions=32))
    run = otel_train.start_run(exporter="none", prometheus_port=None, console=False,
                               status_dir=str(tmp_path))
    run.step = _refuse_steps  # our callback's step_begin now fails inside the Trainer
    cb = TrainerStepTraceCallback(run=run)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=2,
                             per_device_train_batch_size=2, save_strategy="no",
                             report_to="none", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(8), callbacks=[cb])
    with caplog.at_level("WARNING", logger="otel_train"):
        trainer.train()  # does not raise
    cb.close()
    run.shutdown()
    assert trainer.state.global_step == 2
    assert cb.hook_failures() == {"on_step_begin": 2}
    assert any("on_step_begin failed" in r.getMessage() and "refuses" in r.getMessage()
               for r in caplog.records)


def test_evaluate_and_predict_without_training_start_the_run_and_are_their_own_traces(
        tmp_path) -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64,
                                       n_positions=32))
    with GrpcOtlpReceiver() as recv:
        # The callback starts its own run: no train() ever calls on_train_begin.
        cb = TrainerStepTraceCallback(
            exporter="otlp", otlp_endpoint=recv.endpoint, otlp_protocol="grpc",
            prometheus_port=None, console=False, status_dir=str(tmp_path))
        args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_eval_batch_size=2,
                                 report_to="none", use_cpu=True, disable_tqdm=True)
        trainer = Trainer(model=model, args=args, eval_dataset=Tokens(6), callbacks=[cb])
        metrics = trainer.evaluate()
        output = trainer.predict(Tokens(4))
        run = cb.run
        cb.close()  # shuts down the run it started: everything exported
        spans = recv.spans()
    assert "eval_loss" in metrics and output.predictions is not None
    assert run is not None and cb.hook_failures() == {}
    assert not step_roots(spans)
    roots = monitor_roots(spans)
    assert [(s.name, s.attributes["train.dataloader"]) for s in roots] == [
        ("val_loss", "eval"), ("inference", "predict")]
    assert all(s.attributes["train.phase.kind"] == "monitor" for s in roots)
    assert roots[0].trace_id != roots[1].trace_id
    assert roots[0].end_time_unix_nano <= roots[1].start_time_unix_nano
    # The model's hooks were added for it and removed by close().
    assert not model._forward_hooks and "generate" not in model.__dict__
