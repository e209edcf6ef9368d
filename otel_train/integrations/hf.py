"""Hugging Face ``transformers.Trainer``: every optimizer step a ``train.step`` trace.

``TrainerStepTraceCallback`` follows the Trainer's own events and, where the callback API
can't split a step, torch hooks on the model; both feed one
:class:`~otel_train.integrations.step_tracker.HookStepTracker`:

- **data**: from the end of the previous step (or epoch start) to ``on_step_begin``; the
  Trainer fetches all of a step's micro-batches in that gap (``get_batch_samples``);
- **micro_step** (gradient accumulation > 1): one child of the step per micro-batch, each
  holding its forward and backward (``train.micro_step`` = 0, 1, ...);
- **forward**: the model's forward pre-hook to its forward hook (training mode only);
- **backward**: first gradient at the model output to the end of the autograd pass;
- **optimizer**: end of the last backward (so gradient clipping counts) to ``on_step_end``
  (``optimizer.step()``, the LR scheduler, ``zero_grad``);
- monitoring after the step, flagged by the Trainer's control at ``on_step_end``: ``log``
  (to ``on_log``), ``val_loss`` (evaluation, to ``on_evaluate``), ``checkpoint`` (to
  ``on_save``), as monitoring phases of that step (epoch-end ones as monitoring spans);
- ``trainer.evaluate()`` / ``trainer.predict()`` outside training: a ``val_loss`` /
  ``inference`` monitoring span, its own trace, from the first eval forward to
  ``on_evaluate`` / ``on_predict``, its loader ``eval`` / ``predict``
  (``train.dataloader``); called before any ``train()``, the run starts (and the model is
  hooked) at the first evaluation batch, which the span then starts after;
  ``model.generate()`` is an ``inference`` monitoring phase.

Evaluation, prediction, logging and saving are the run's monitoring: with the default
``device_sync`` on an accelerator they are where the device is synchronized (at their start
and end), never the training phases.

Add it last in ``callbacks`` so callbacks before it are inside the step; monitoring done
in your own callbacks can use ``callback.monitor(name)``. A failure inside the callback is
logged and counted (``callback.hook_failures()``), never raised into the Trainer.

Usage::

    from otel_train.integrations.hf import TrainerStepTraceCallback

    trace = TrainerStepTraceCallback(service_name="tiny-gpt2")
    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[trace])
    trainer.train()
    trace.close()                      # unhook; shut down the run it started
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from transformers import TrainerCallback

from otel_train.common.attributes import (
    DATALOADER,
    KIND_TRAIN,
    MICRO_STEP,
    PHASE_CHECKPOINT,
    PHASE_DATA,
    PHASE_INFERENCE,
    PHASE_LOG,
    PHASE_MICRO_STEP,
    PHASE_OPTIMIZER,
    PHASE_VAL_LOSS,
)
from otel_train.integrations.governed_eval import govern_hf_evaluation
from otel_train.integrations.step_tracker import HookStepTracker, guarded
from otel_train.run import Run, start_run


class TrainerStepTraceCallback(TrainerCallback):
    """A ``TrainerCallback`` that records each optimizer step as a ``train.step`` trace."""

    def __init__(self, run: Run | None = None, loader: str = "train", **run_options: Any
                 ) -> None:
        # The Trainer's callbacks open and end steps; the model's hooks split them.
        self.tracker = HookStepTracker(lambda: start_run(**run_options),
                                       hooks_delimit_steps=False)
        self.tracker.run = run
        self._owns_run = run is None
        self._loader = loader
        self._undo: list[Any] = []
        self._mark = 0  # where the next step's data phase starts
        self._micro_index = 0
        self._optimizer_start = 0
        self._accumulation = 1
        self._post: list[str] = []  # monitoring still expected after on_step_end

    @property
    def run(self) -> Run | None:
        """The run the steps go to (started at ``on_train_begin`` unless one was given)."""
        return self.tracker.run

    def hook_failures(self) -> dict[str, int]:
        """Callback and hook calls that failed (logged, not raised), by handler name."""
        return self.tracker.hook_failures.counts()

    @contextlib.contextmanager
    def monitor(self, name: str) -> Iterator[None]:
        """Monitoring work in your own callback: a phase of the open step, else its own span."""
        run = self.tracker.run
        if run is None:
            yield
            return
        step = self.tracker.step
        if step is not None and not step.end_ns:
            with step.monitor(name):
                yield
            return
        with run.monitor(name):
            yield
        self._mark = run.timestamp_ns()  # it was not the next step's data fetch

    # -- the Trainer's events -------------------------------------------------------------
    @guarded
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        """Start (or reuse) the run and hook the model."""
        run = self.tracker.ensure_run()
        self._accumulation = max(1, int(args.gradient_accumulation_steps))
        # The Trainer's own token count (include_num_input_tokens_seen): a step's share of it
        # is its train.tokens, no sync of ours (the Trainer already read it).
        self._tokens_seen = getattr(state, "num_input_tokens_seen", 0) or 0
        if model is not None and not self._undo:
            self._undo = self.tracker.hook_model(model, wrap_train=False)
        self._mark = run.timestamp_ns()

    @guarded
    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The epoch's first fetch starts here."""
        if self.tracker.step is None and self.tracker.run is not None:
            self._mark = self.tracker.run.timestamp_ns()

    @guarded
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Open the step, backdated to the end of the previous one: the gap is data."""
        tracker = self.tracker
        run = tracker.run
        if run is None:
            return
        t = run.timestamp_ns()
        if tracker.step is not None:
            self._end_step()  # a flagged event never came: close what is open
            self._mark = t
        step = tracker.begin_step(self._loader, state.global_step, self._mark)
        step.record_phase(PHASE_DATA, self._mark, t, KIND_TRAIN)
        self._micro_index = 0
        tracker.last_backward_end_ns = 0
        tracker.first_eval_forward_ns = 0
        if self._accumulation > 1:
            tracker.open_phase(PHASE_MICRO_STEP, t, attributes={MICRO_STEP: 0})

    @guarded
    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """A micro-batch ended (gradient accumulation): the next one starts."""
        tracker = self.tracker
        if tracker.step is None:
            return
        t = tracker.timestamp_ns()
        tracker.close_phase(PHASE_MICRO_STEP, t)
        self._micro_index += 1
        tracker.open_phase(PHASE_MICRO_STEP, t, attributes={MICRO_STEP: self._micro_index})

    @guarded
    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any
                              ) -> None:
        """The last micro-batch ended with its backward; clipping and the step follow."""
        tracker = self.tracker
        if tracker.step is None:
            return
        t = tracker.timestamp_ns()
        start = tracker.last_backward_end_ns or t
        tracker.close_phase(PHASE_MICRO_STEP, start)
        self._optimizer_start = start

    @guarded
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The optimizer phase ends; flagged logging/evaluation/saving stay in the step."""
        step = self.tracker.step
        if step is None:
            return
        t = self.tracker.timestamp_ns()
        step.record_phase(PHASE_OPTIMIZER, self._optimizer_start or t, t, KIND_TRAIN)
        self._optimizer_start = 0
        seen = getattr(state, "num_input_tokens_seen", 0) or 0
        if seen > getattr(self, "_tokens_seen", seen):
            step.count(tokens=int(seen - self._tokens_seen))
        self._tokens_seen = seen
        govern_hf_evaluation(self.tracker.run, args, state, control)  # budget_action=govern
        self._expect_post(control, t)

    @guarded
    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Training logs computed (evaluation logs arrive inside ``val_loss``)."""
        self._advance_post(PHASE_LOG)

    @guarded
    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Evaluation ended."""
        if not self._advance_post(PHASE_VAL_LOSS):
            self._close_standalone(PHASE_VAL_LOSS, "eval")

    @guarded
    def on_predict(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Prediction ended."""
        self._close_standalone(PHASE_INFERENCE, "predict")

    @guarded
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """A checkpoint was written."""
        self._advance_post(PHASE_CHECKPOINT)

    @guarded
    def on_prediction_step(self, args: Any, state: Any, control: Any, model: Any = None,
                           **kwargs: Any) -> None:
        """An evaluation batch ran; outside training this opens a monitoring span."""
        tracker = self.tracker
        if tracker.monitoring_open or tracker.step is not None:
            return
        if tracker.run is None:  # evaluate()/predict() before any train(): start here
            tracker.ensure_run()
            if model is not None and not self._undo:
                self._undo = tracker.hook_model(model, wrap_train=False)
        # The loop's first forward came before this callback: start there when known.
        tracker.open_monitoring(PHASE_VAL_LOSS, tracker.first_eval_forward_ns or None)

    @guarded
    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Epoch-level logging/evaluation/saving are monitoring spans between steps."""
        run = self.tracker.run
        if run is None:
            return
        if self.tracker.step is not None:
            self._end_step()
        self._expect_post(control, run.timestamp_ns())

    @guarded
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Close what is open and export what was recorded (hooks stay for evaluate())."""
        run = self.tracker.run
        if run is None:
            return
        self._end_step()
        self.tracker.close_monitoring()
        run.flush()

    def close(self) -> None:
        """Unhook the model; shut the run down if this callback started it."""
        for undo in reversed(self._undo):
            undo()
        self._undo = []
        run = self.tracker.run
        if self._owns_run and run is not None:
            run.shutdown()

    # -- post-step monitoring -------------------------------------------------------------
    def _expect_post(self, control: Any, t: int) -> None:
        post = [name for flag, name in ((control.should_log, PHASE_LOG),
                                        (control.should_evaluate, PHASE_VAL_LOSS),
                                        (control.should_save, PHASE_CHECKPOINT)) if flag]
        self._post = post
        if post:
            self.tracker.open_monitoring(post[0], t)
        elif self.tracker.step is not None:
            self._end_step()
            self._mark = t

    def _advance_post(self, name: str) -> bool:
        """Close monitoring phase ``name`` if it is the expected one; open the next."""
        if not self._post or self._post[0] != name:
            return False
        tracker = self.tracker
        t = tracker.timestamp_ns()
        tracker.close_monitoring(t)
        self._post.pop(0)
        if self._post:
            tracker.open_monitoring(self._post[0], t)
        else:
            if tracker.step is not None:
                self._end_step()
            self._mark = t
        return True

    def _close_standalone(self, name: str, loader: str) -> None:
        tracker = self.tracker
        rec = tracker.monitor_record
        if rec is not None and not self._post:
            rec.name = name
            rec.set_attribute(DATALOADER, loader)
            tracker.close_monitoring(tracker.timestamp_ns())
        tracker.first_eval_forward_ns = 0

    def _end_step(self) -> None:
        self._post = []
        self.tracker.end_step()
