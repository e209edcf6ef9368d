"""Lightning: every optimizer step of ``lightning.Trainer.fit`` a ``train.step`` trace.

``LightningStepTraceCallback`` reads the step from Lightning's own callback hooks:

- **data**: from the end of the previous batch (or epoch start, or validation end) to
  ``on_train_batch_start``: Lightning fetches the batch in that gap;
- **forward**: ``on_train_batch_start`` to ``on_before_zero_grad`` / ``on_before_backward``
  (the closure runs ``training_step`` first);
- **backward**: ``on_before_backward`` to ``on_after_backward``;
- **optimizer**: ``on_before_optimizer_step`` (gradient clipping follows it) to
  ``on_train_batch_end`` (the parameter update and the scheduler);
- **micro_step** (``accumulate_grad_batches`` > 1): one child per batch holding its
  fetch, forward and backward; the step ends at the batch whose optimizer step ran;
- the validation loop (sanity check included): a ``val_loss`` monitoring span per
  dataloader, ``on_validation_start`` to ``on_validation_end``, tagged with the
  dataloader's name (``val_loader_names=``, the keys of a dict of loaders, else ``val``,
  ``val1``, ...).

Usage::

    import lightning as L
    from otel_train.integrations.lightning import LightningStepTraceCallback

    trainer = L.Trainer(max_steps=100, callbacks=[LightningStepTraceCallback()])
    trainer.fit(module, train_loader, {"clean": val_a, "noisy": val_b})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightning.pytorch.callbacks import Callback

from otel_train.attributes import (
    DATALOADER,
    KIND_TRAIN,
    MICRO_STEP,
    PHASE_BACKWARD,
    PHASE_DATA,
    PHASE_FORWARD,
    PHASE_OPTIMIZER,
    PHASE_VAL_LOSS,
)
from otel_train.run import Run, start_run

PHASE_MICRO_STEP = "micro_step"


class LightningStepTraceCallback(Callback):
    """A Lightning ``Callback`` that records each optimizer step as a ``train.step`` trace."""

    def __init__(self, run: Run | None = None, loader: str = "train",
                 val_loader_names: Sequence[str] | None = None, **run_options: Any) -> None:
        self.run: Run | None = run
        self._run_options = run_options
        self._loader = loader
        self._val_names = list(val_loader_names) if val_loader_names else None
        self._step: Any = None
        self._global_step = 0
        self._mark = 0
        self._micro_index = 0
        self._open: list[str] = []  # names of the open phases, innermost last
        self._val: Any = None  # the open validation MonitorRecord
        self._val_index = -1

    # -- helpers --------------------------------------------------------------------------
    def _open_phase(self, name: str, t: int, attrs: dict[str, Any] | None = None) -> None:
        self._step.open_phase(name, KIND_TRAIN, t, attributes=attrs)
        self._open.append(name)

    def _close_until(self, name: str, t: int) -> None:
        """Close open phases up to and including ``name`` (if it is open)."""
        if name not in self._open:
            return
        while self._open:
            closed = self._open.pop()
            self._step.close_phase(t)
            if closed == name:
                return

    def _val_name(self, trainer: Any, index: int) -> str:
        if self._val_names and index < len(self._val_names):
            return self._val_names[index]
        loaders = getattr(trainer, "val_dataloaders", None)
        if isinstance(loaders, Mapping) and index < len(loaders):
            return str(list(loaders)[index])
        return "val" if index == 0 else f"val{index}"

    # -- fit ------------------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Start (or reuse) the run."""
        if self.run is None:
            self.run = start_run(**self._run_options)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        """The epoch's first fetch starts here."""
        if self._step is None and self.run is not None:
            self._mark = self.run.timestamp_ns()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
                             ) -> None:
        """A batch arrived: its fetch was the data phase; the forward starts."""
        run = self.run
        if run is None:
            return
        t = run.timestamp_ns()
        mark = self._mark or t
        if self._step is None:
            self._global_step = trainer.global_step
            self._step = run.step(loader=self._loader, index=trainer.global_step, start_ns=mark)
            self._micro_index = 0
        else:
            self._micro_index += 1
        if trainer.accumulate_grad_batches > 1:  # a micro-step holds its own fetch
            self._open_phase(PHASE_MICRO_STEP, mark, {MICRO_STEP: self._micro_index})
        self._step.record_phase(PHASE_DATA, mark, t, KIND_TRAIN)
        self._open_phase(PHASE_FORWARD, t)

    def on_before_zero_grad(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        """``training_step`` returned (zero_grad runs before backward)."""
        if self._step is not None:
            self._close_until(PHASE_FORWARD, self.run.timestamp_ns())

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        """The backward starts."""
        if self._step is None:
            return
        t = self.run.timestamp_ns()
        self._close_until(PHASE_FORWARD, t)
        self._open_phase(PHASE_BACKWARD, t)

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        """The backward ended (and with it the micro-step)."""
        if self._step is None:
            return
        t = self.run.timestamp_ns()
        self._close_until(PHASE_BACKWARD, t)
        self._close_until(PHASE_MICRO_STEP, t)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        """The optimizer step starts (clipping, then the update)."""
        if self._step is None:
            return
        t = self.run.timestamp_ns()
        self._close_until(PHASE_MICRO_STEP, t)
        self._open_phase(PHASE_OPTIMIZER, t)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """The batch ended; the step ends with it when an optimizer step ran."""
        if self._step is None:
            return
        t = self.run.timestamp_ns()
        if self._open:
            self._close_until(self._open[0], t)
        if trainer.global_step != self._global_step:
            self._end_step()
        self._mark = t

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Close what is open and export what was recorded."""
        if self._step is not None:
            self._end_step()
        if self.run is not None:
            self.run.flush()

    def _end_step(self) -> None:
        step, self._step = self._step, None
        self._open = []
        step.end()

    # -- validation: monitoring ------------------------------------------------------------
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        """The validation loop starts: monitoring."""
        self._val_index = -1
        self._open_val(trainer, 0)

    def _open_val(self, trainer: Any, index: int) -> None:
        run = self.run
        if run is None:
            return
        rec = run.monitor(PHASE_VAL_LOSS)
        rec.__enter__()
        rec.set_attribute(DATALOADER, self._val_name(trainer, index))
        self._val = rec
        self._val_index = index

    def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        """A validation batch of loader ``dataloader_idx``: a new loader, a new span."""
        if dataloader_idx != self._val_index and self._val is not None:
            self._val.__exit__(None, None, None)
            self._open_val(trainer, dataloader_idx)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        """The validation loop ended; the next fetch starts after it."""
        rec, self._val = self._val, None
        if rec is not None:
            rec.__exit__(None, None, None)
        if self.run is not None:
            self._mark = self.run.timestamp_ns()
