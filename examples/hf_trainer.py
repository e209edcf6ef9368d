"""Hugging Face ``Trainer`` on a tiny GPT-2 built from a config (no hub downloads), traced.

``TrainerStepTraceCallback`` turns every optimizer step into a ``train.step`` trace: with
``--accumulation 2`` each step has two ``micro_step`` children (forward + backward each),
then ``optimizer``; evaluation every ``--eval-every`` steps is a ``val_loss`` monitoring
phase of the step that triggered it, logging a ``log`` phase; ``trainer.evaluate()``
afterwards a ``val_loss`` monitoring span and ``model.generate()`` an ``inference`` one.
``--device auto`` (the default) lets the Trainer use the accelerator when one is present;
``--device cpu`` keeps it on the CPU.

With ``--govern`` the run keeps monitoring within its 5% budget by itself
(``budget_action="govern"``): the Trainer's ``eval_steps`` becomes the asked interval, and
an evaluation made expensive with ``--eval-ms`` (a sleep per evaluation batch) is stretched
to fewer steps, one console line per change (docs/governor.md).

Usage::

    python examples/hf_trainer.py --steps 20 --eval-every 5 --accumulation 2
    python examples/hf_trainer.py --device cpu
    python examples/hf_trainer.py --steps 300 --eval-every 10 --accumulation 1 \
        --eval-ms 40 --govern
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

try:
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )
except ImportError as exc:  # the 'hf' extra is not installed: say which one
    raise SystemExit(f"examples/hf_trainer.py needs {exc.name or 'transformers'!r} (the 'hf' "
                     "extra): pip install -e '.[hf]'") from None

from otel_train.common.training_device import add_device_argument, device_from_arguments
from otel_train.integrations.hf import TrainerStepTraceCallback


class RandomTokens(torch.utils.data.Dataset):
    """Token sequences with a learnable pattern (each token is the previous plus one)."""

    def __init__(self, n: int, length: int = 16, vocab: int = 64, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (n, 1), generator=g)
        self.ids = (start + torch.arange(length)) % vocab

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class SlowEvaluation(TrainerCallback):
    """``--eval-ms``: each evaluation batch takes that much longer (an expensive eval)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_prediction_step(self, args, state, control, **kwargs):  # noqa: ANN001, ANN201
        time.sleep(self.seconds)


def main(argv: list[str] | None = None) -> None:
    """Train ``--steps`` optimizer steps with evaluation every ``--eval-every``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--accumulation", type=int, default=2)
    add_device_argument(parser)
    parser.add_argument("--eval-ms", type=float, default=0.0,
                        help="extra milliseconds per evaluation batch")
    parser.add_argument("--govern", action="store_true",
                        help="budget_action=govern: stretch eval_steps to stay in budget")
    args = parser.parse_args(argv)
    device = device_from_arguments(parser, args)
    print(f"hf_trainer: training on {device.type} (--device {args.device})", flush=True)
    os.environ.setdefault("OTEL_TRAIN_SERVICE_NAME", "hf-tiny-gpt2")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                       n_positions=32))
    trace = TrainerStepTraceCallback(budget_action="govern" if args.govern else "report")
    slow = [SlowEvaluation(args.eval_ms / 1000)] if args.eval_ms else []
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=4,
            gradient_accumulation_steps=args.accumulation, eval_strategy="steps",
            eval_steps=args.eval_every, per_device_eval_batch_size=8,
            logging_steps=args.eval_every, save_strategy="no", report_to="none",
            use_cpu=device.type == "cpu", disable_tqdm=True, learning_rate=3e-3)
        trainer = Trainer(model=model, args=targs, train_dataset=RandomTokens(256),
                          eval_dataset=RandomTokens(16, seed=1), callbacks=[*slow, trace])
        trainer.train()
        metrics = trainer.evaluate()  # outside training: a val_loss monitoring span
    model.eval()
    prompt = torch.tensor([[1, 2, 3, 4]], device=model.device)
    # model.generate is hooked: an "inference" monitoring span
    out_ids = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
    print("eval loss:", round(metrics["eval_loss"], 3), "generated:", out_ids[0].tolist())
    assert trace.run is not None
    costs = trace.run.costs()
    print("monitoring:", f"{costs.get('total_percentage', 0.0):.1f}%")
    for name, op in (costs.get("governing") or {}).get("operations", {}).items():
        print(f"{name}: every {op['interval_steps']} steps (asked {op['asked_every']})")
    trace.close()


if __name__ == "__main__":
    main()
