"""Governing inside the trainers: the HF Trainer's eval_steps and Lightning's
val_check_interval follow the interval in force, and nothing changes without governing.

The interval in force is set by hand here (the governor's decisions are timed, and tested
on their own in tests/derived/test_governor.py), with the governor thread kept from deciding:
what is tested is that each trainer evaluates exactly where ``run.due`` says."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F
from train_helpers import clean_env, start_in_process_run  # noqa: F401

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(autouse=True)
def _no_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("otel_train.derived.governor.DECIDE_EVERY_SECONDS", 3600.0)


def _run(tmp_path: Path, govern: bool, interval: int | None) -> Any:
    run = start_in_process_run(tmp_path, budget_action="govern" if govern else "report")
    if interval is not None:  # published at the first plan step, in force from step 25
        run._recorder.schedule.proposed = {"val_loss": (interval, 0.15)}
    return run


# -- Hugging Face ---------------------------------------------------------------------------
transformers = pytest.importorskip("transformers")


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, 64, (n, 8), generator=torch.Generator().manual_seed(n))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _hf_evaluations(tmp_path: Path, govern: bool, interval: int | None) -> list[int]:
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from otel_train.integrations.hf import TrainerStepTraceCallback

    seen: list[int] = []

    class Evaluated(TrainerCallback):
        def on_evaluate(self, args, state, control, **kwargs):  # noqa: ANN001, D102
            seen.append(state.global_step)

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64,
                                       n_positions=16))
    run = _run(tmp_path, govern, interval)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=60, per_device_train_batch_size=2,
        eval_strategy="steps", eval_steps=10, logging_strategy="no", save_strategy="no",
        report_to="none", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=_Tokens(16),
                      eval_dataset=_Tokens(2),
                      callbacks=[Evaluated(), TrainerStepTraceCallback(run=run)])
    trainer.train()
    run.shutdown()
    return seen


def test_hf_eval_steps_follow_the_interval_in_force_the_last_step_still_evaluated(
        tmp_path: Path) -> None:
    assert _hf_evaluations(tmp_path / "a", govern=False, interval=None) == [
        10, 20, 30, 40, 50, 60]
    assert _hf_evaluations(tmp_path / "b", govern=True, interval=None) == [
        10, 20, 30, 40, 50, 60]  # governed, nothing over budget: the Trainer's own steps
    # 25 in force from global step 25: 20 + 25 = 45, then the last step (forced, as HF does)
    assert _hf_evaluations(tmp_path / "c", govern=True, interval=25) == [10, 20, 45, 60]


# -- Lightning ------------------------------------------------------------------------------
L = pytest.importorskip("lightning")


class _Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 1)
        self.validated_at: list[int] = []

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201, D102
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):  # noqa: ANN001, ANN201, D102
        if batch_idx == 0:
            self.validated_at.append(self.trainer.global_step)

    def configure_optimizers(self):  # noqa: ANN201, D102
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _lightning_validations(tmp_path: Path, govern: bool, interval: int | None,
                           per_epoch: bool = False) -> list[int]:
    from otel_train.integrations.lightning import LightningStepTraceCallback

    run = _run(tmp_path, govern, interval)
    ds = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(ds, batch_size=4)  # 16 batches an epoch
    module = _Tiny()
    trainer = L.Trainer(
        max_steps=120, val_check_interval=10, check_val_every_n_epoch=1 if per_epoch else None,
        limit_val_batches=1, num_sanity_val_steps=0, accelerator="cpu", logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[LightningStepTraceCallback(run=run)])
    trainer.fit(module, loader, torch.utils.data.DataLoader(ds, batch_size=4))
    run.shutdown()
    return module.validated_at


def test_lightning_val_check_interval_follows_the_interval_in_force(tmp_path: Path) -> None:
    every_10 = list(range(10, 121, 10))
    assert _lightning_validations(tmp_path / "a", govern=False, interval=None) == every_10
    assert _lightning_validations(tmp_path / "b", govern=True, interval=None) == every_10
    # 30 in force from batch 25: 20 + 30 = 50, 80, 110
    assert _lightning_validations(tmp_path / "c", govern=True, interval=30) == [
        10, 20, 50, 80, 110]


def test_lightning_validation_counted_per_epoch_is_left_to_lightning_with_one_line(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        at = _lightning_validations(tmp_path, govern=True, interval=30, per_epoch=True)
    assert at == [10, 26, 42, 58, 74, 90, 106]  # batch 10 of each 16-batch epoch
    lines = [r.getMessage() for r in caplog.records if "leaves Lightning's validation" in
             r.getMessage()]
    assert len(lines) == 1
