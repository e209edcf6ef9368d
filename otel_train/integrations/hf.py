"""Hugging Face ``transformers.Trainer``: every optimizer step a ``train.step`` trace.

``TrainerStepTraceCallback`` follows the Trainer's own events and, where the callback API
can't split a step, torch hooks on the model:

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
  ``inference`` monitoring span from the first eval forward to ``on_evaluate`` /
  ``on_predict``; ``model.generate()`` is an ``inference`` monitoring phase.

Add it last in ``callbacks`` so callbacks before it are inside the step; monitoring done
in your own callbacks can use ``callback.monitor(name)``.

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
import functools
from collections.abc import Iterator
from typing import Any

from transformers import TrainerCallback

from otel_train.attributes import (
    KIND_MONITOR,
    KIND_TRAIN,
    MICRO_STEP,
    PHASE_BACKWARD,
    PHASE_DATA,
    PHASE_FORWARD,
    PHASE_INFERENCE,
    PHASE_OPTIMIZER,
    PHASE_VAL_LOSS,
)
from otel_train.integrations.timeline import attach_backward_probe
from otel_train.run import Run, start_run

PHASE_MICRO_STEP = "micro_step"
PHASE_LOG = "log"
PHASE_CHECKPOINT = "checkpoint"
_IN_STEP = "in-step"  # monitoring open as a phase of the current step


class TrainerStepTraceCallback(TrainerCallback):
    """A ``TrainerCallback`` that records each optimizer step as a ``train.step`` trace."""

    def __init__(self, run: Run | None = None, loader: str = "train", **run_options: Any
                 ) -> None:
        self.run: Run | None = run
        self._owns_run = False
        self._run_options = run_options
        self._loader = loader
        self._undo: list[Any] = []
        self._step: Any = None
        self._mark = 0  # where the next step's data phase starts
        self._micro = False  # open phases (the step's event list holds their order)
        self._micro_index = 0
        self._forward = False
        self._backward = False
        self._last_backward_end = 0
        self._optimizer_start = 0
        self._accumulation = 1
        self._post: list[str] = []  # monitoring still expected after on_step_end
        self._post_open: Any = None  # open monitoring: _IN_STEP or a MonitorRecord
        self._eval_first_ns = 0
        self._generating = 0

    # -- model hooks ----------------------------------------------------------------------
    def _hook_model(self, model: Any) -> None:
        depth = [0]

        def pre(module: Any, args: Any) -> None:
            depth[0] += 1
            if depth[0] == 1:
                self._forward_pre(module)

        def post(module: Any, args: Any, output: Any) -> None:
            depth[0] -= 1
            if depth[0] == 0:
                self._forward_post(output)

        handles = [model.register_forward_pre_hook(pre),
                   model.register_forward_hook(post, always_call=True)]
        self._undo = [h.remove for h in handles]
        original = getattr(model, "generate", None)
        if callable(original):
            @functools.wraps(original)
            def generate(*args: Any, **kwargs: Any) -> Any:
                with self._generation():
                    return original(*args, **kwargs)

            object.__setattr__(model, "generate", generate)
            self._undo.append(lambda: model.__dict__.pop("generate", None))

    def _forward_pre(self, module: Any) -> None:
        if self._generating:
            return
        step = self._step
        if not module.training:
            if not self._eval_first_ns:
                self._eval_first_ns = self.run.timestamp_ns()  # a standalone evaluate() may follow
            return
        if step is not None and not self._post and not self._backward:
            step.open_phase(PHASE_FORWARD, KIND_TRAIN, self.run.timestamp_ns())
            self._forward = True

    def _forward_post(self, output: Any) -> None:
        if not self._forward:
            return
        self._forward = False
        self._step.close_phase(self.run.timestamp_ns())
        attach_backward_probe(output, self._backward_start, self._backward_end)

    def _backward_start(self) -> None:
        if self._step is not None and not self._backward:
            self._step.open_phase(PHASE_BACKWARD, KIND_TRAIN, self.run.timestamp_ns())
            self._backward = True

    def _backward_end(self) -> None:
        if self._backward and self._step is not None:
            self._backward = False
            self._last_backward_end = t = self.run.timestamp_ns()
            self._step.close_phase(t)

    @contextlib.contextmanager
    def _generation(self) -> Iterator[None]:
        self._generating += 1
        try:
            with self.monitor(PHASE_INFERENCE):
                yield
        finally:
            self._generating -= 1

    @contextlib.contextmanager
    def monitor(self, name: str) -> Iterator[None]:
        """Monitoring work in your own callback: a phase of the open step, else its own span."""
        run = self.run
        if run is None:
            yield
            return
        step = self._step
        if step is not None and not step.end_ns:
            with step.monitor(name):
                yield
            return
        with run.monitor(name):
            yield
        self._mark = run.timestamp_ns()  # it was not the next step's data fetch

    # -- the Trainer's events -------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       **kwargs: Any) -> None:
        """Start (or reuse) the run and hook the model."""
        if self.run is None:
            self.run = start_run(**self._run_options)
            self._owns_run = True
        self._accumulation = max(1, int(args.gradient_accumulation_steps))
        if model is not None and not self._undo:
            self._hook_model(model)
        self._mark = self.run.timestamp_ns()

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The epoch's first fetch starts here."""
        if self._step is None and self.run is not None:
            self._mark = self.run.timestamp_ns()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Open the step, backdated to the end of the previous one: the gap is data."""
        run = self.run
        if run is None:
            return
        t = run.timestamp_ns()
        if self._step is not None:
            self._end_step()  # a flagged event never came: close what is open
            self._mark = t
        step = self._step = run.step(self._loader, state.global_step, self._mark)
        step.record_phase(PHASE_DATA, self._mark, t, KIND_TRAIN)
        self._micro_index = 0
        self._last_backward_end = 0
        self._eval_first_ns = 0
        if self._accumulation > 1:
            step.open_phase(PHASE_MICRO_STEP, KIND_TRAIN, t, attributes={MICRO_STEP: 0})
            self._micro = True

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """A micro-batch ended (gradient accumulation): the next one starts."""
        step = self._step
        if step is None:
            return
        t = self.run.timestamp_ns()
        if self._micro:
            step.close_phase(t)
        self._micro_index += 1
        step.open_phase(PHASE_MICRO_STEP, KIND_TRAIN, t, attributes={MICRO_STEP: self._micro_index})
        self._micro = True

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any
                              ) -> None:
        """The last micro-batch ended with its backward; clipping and the step follow."""
        step = self._step
        if step is None:
            return
        t = self.run.timestamp_ns()
        start = self._last_backward_end or t
        if self._micro:
            step.close_phase(start)
            self._micro = False
        self._optimizer_start = start

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The optimizer phase ends; flagged logging/evaluation/saving stay in the step."""
        step = self._step
        if step is None:
            return
        t = self.run.timestamp_ns()
        step.record_phase(PHASE_OPTIMIZER, self._optimizer_start or t, t, KIND_TRAIN)
        self._optimizer_start = 0
        self._expect_post(control, t)

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Training logs computed (evaluation logs arrive inside ``val_loss``)."""
        self._advance_post(PHASE_LOG)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Evaluation ended."""
        if not self._advance_post(PHASE_VAL_LOSS):
            self._close_standalone(PHASE_VAL_LOSS)

    def on_predict(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Prediction ended."""
        self._close_standalone(PHASE_INFERENCE)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """A checkpoint was written."""
        self._advance_post(PHASE_CHECKPOINT)

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """An evaluation batch ran; outside training this opens a monitoring span."""
        run = self.run
        if run is None or self._post_open is not None or self._step is not None:
            return
        rec = run.monitor(PHASE_VAL_LOSS)
        # The loop's first forward came before this callback: start there when known.
        rec.start(self._eval_first_ns or None)
        self._post_open = rec

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Epoch-level logging/evaluation/saving are monitoring spans between steps."""
        if self.run is None:
            return
        if self._step is not None:
            self._end_step()
        self._expect_post(control, self.run.timestamp_ns())

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Close what is open and export what was recorded (hooks stay for evaluate())."""
        if self.run is None:
            return
        if self._step is not None:
            self._end_step()
        self._close_post()
        self.run.flush()

    def close(self) -> None:
        """Unhook the model; shut the run down if this callback started it."""
        for undo in reversed(self._undo):
            undo()
        self._undo = []
        if self._owns_run and self.run is not None:
            self.run.shutdown()

    # -- post-step monitoring -------------------------------------------------------------
    def _expect_post(self, control: Any, t: int) -> None:
        post = [name for flag, name in ((control.should_log, PHASE_LOG),
                                        (control.should_evaluate, PHASE_VAL_LOSS),
                                        (control.should_save, PHASE_CHECKPOINT)) if flag]
        self._post = post
        if post:
            self._open_post(post[0], t)
        elif self._step is not None:
            self._end_step()
            self._mark = t

    def _open_post(self, name: str, t: int) -> None:
        step = self._step
        if step is not None:
            step.open_phase(name, KIND_MONITOR, t)
            self._post_open = _IN_STEP
        else:
            rec = self.run.monitor(name)
            rec.start(t)
            self._post_open = rec

    def _close_post(self) -> int:
        mon, self._post_open = self._post_open, None
        t = self.run.timestamp_ns()
        if mon is _IN_STEP:
            self._step.close_phase(t)
        elif mon is not None:
            mon.__exit__(None, None, None)
        return t

    def _advance_post(self, name: str) -> bool:
        """Close monitoring phase ``name`` if it is the expected one; open the next."""
        if not self._post or self._post[0] != name:
            return False
        t = self._close_post()
        self._post.pop(0)
        if self._post:
            self._open_post(self._post[0], t)
        else:
            if self._step is not None:
                self._end_step()
            self._mark = t
        return True

    def _close_standalone(self, name: str) -> None:
        rec = self._post_open
        if rec is not None and rec is not _IN_STEP and not self._post:
            rec.name = name
            self._close_post()
        self._eval_first_ns = 0

    def _end_step(self) -> None:
        step, self._step = self._step, None
        if self._post_open is _IN_STEP:
            self._post_open = None  # ends with its step
        self._post = []
        self._micro = self._forward = self._backward = False
        step.end()
