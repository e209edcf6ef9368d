"""Governing inside the trainers: their own evaluation interval is ``step.due``'s ``every``.

With ``budget_action="govern"`` (otherwise nothing here changes a trainer's decisions):

- **Hugging Face** (``hf.py``): at ``on_step_end``, after the Trainer's ``DefaultFlowCallback``
  set ``control.should_evaluate`` from ``eval_steps``, the callback sets it from
  ``run.due("val_loss", every=state.eval_steps, index=state.global_step)`` -- the Trainer's
  own ``global_step % eval_steps == 0`` while the interval is the asked one -- forced at the
  last step as the Trainer does (``global_step >= max_steps``). Only for
  ``eval_strategy="steps"``, after ``eval_delay``.
- **Lightning** (``lightning.py``): with ``val_check_interval`` a number of batches counted
  over the whole fit (``check_val_every_n_epoch=None``: Lightning's ``(total batches) %
  val_check_batch == 0``), the callback reads Lightning's ``trainer.val_check_batch`` once as
  the asked interval and, at each ``on_train_batch_end`` (just before Lightning's own check),
  sets ``trainer.val_check_batch`` to 1 when ``run.due`` says the validation is due and to a
  count never reached otherwise, so Lightning's unchanged check runs it or not. Epoch-relative
  or time-based validation is left to Lightning, with one line saying why.

Usage::

    govern_hf_evaluation(run, args, state, control)     # in on_step_end
    govern_lightning_validation(run, trainer, memo)      # in on_train_batch_end
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from otel_train.common.attributes import PHASE_VAL_LOSS
from otel_train.run import Run

_log = logging.getLogger("otel_train")

# Lightning's val_check_batch when the validation is not due: a batch count never reached.
_NEVER = sys.maxsize


def _governing(run: Run | None) -> bool:
    return run is not None and run.options.budget_action == "govern"


def govern_hf_evaluation(run: Run | None, args: Any, state: Any, control: Any) -> None:
    """Set ``control.should_evaluate`` from ``run.due`` (see the module docstring)."""
    strategy = getattr(args, "eval_strategy", "no")
    if not _governing(run) or getattr(strategy, "value", strategy) != "steps":
        return
    every = getattr(state, "eval_steps", None) or getattr(args, "eval_steps", None)
    if not isinstance(every, int) or every < 1 or args.eval_delay > state.global_step:
        return
    last = bool(state.max_steps) and state.global_step >= state.max_steps
    control.should_evaluate = run.due(  # type: ignore[union-attr]
        PHASE_VAL_LOSS, every=every, force=last, index=state.global_step)


def govern_lightning_validation(run: Run | None, trainer: Any, memo: dict[str, Any]) -> None:
    """Set ``trainer.val_check_batch`` from ``run.due`` (see the module docstring); ``memo``
    keeps the asked interval across calls."""
    if not _governing(run) or memo.get("off"):
        return
    asked = memo.get("asked")
    if asked is None:
        asked = trainer.val_check_batch
        if (trainer.check_val_every_n_epoch is not None or isinstance(asked, bool)
                or not isinstance(asked, int)):
            memo["off"] = True
            _log.warning("otel-train: budget_action=govern leaves Lightning's validation as "
                         "it is: governing needs val_check_interval=<batches> with "
                         "check_val_every_n_epoch=None (validation every N batches of the "
                         "whole fit)")
            return
        memo["asked"] = asked
    done = trainer.fit_loop.epoch_loop.total_batch_idx + 1  # batches done, as Lightning counts
    due = run.due(PHASE_VAL_LOSS, every=asked, index=done)  # type: ignore[union-attr]
    trainer.val_check_batch = 1 if due else _NEVER
