"""Lightning: every optimizer step of ``lightning.Trainer.fit`` a ``train.step`` trace.

``LightningStepTraceCallback`` reads the step from Lightning's own callback hooks and
records it through a :class:`~otel_train.integrations.step_tracker.HookStepTracker`:

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
  ``val1``, ...);
- ``trainer.test()``: the test loop is evaluation too, a ``val_loss`` monitoring span per
  test dataloader named ``test``, ``test1``, ... (or ``test_loader_names=``, or the dict's
  keys); ``trainer.predict()``: an ``inference`` monitoring span per predict dataloader
  (``predict``, ...; ``predict_loader_names=``); each its own trace (a span of its own
  between steps, as ``run.monitor`` makes);
- ``teardown`` (the end of ``fit``, ``validate``, ...): what is open ends and a run the
  callback started is shut down (flushed and exported), not left to interpreter exit.

These loops are the run's monitoring: with the default ``device_sync`` on an accelerator
they are where the device is synchronized (at their start and end), never the training
phases. A failure inside the callback is logged and counted (``callback.hook_failures()``),
never raised into the Trainer.

Usage::

    import lightning as L
    from otel_train.integrations.lightning import LightningStepTraceCallback

    trainer = L.Trainer(max_steps=100, callbacks=[LightningStepTraceCallback()])
    trainer.fit(module, train_loader, {"clean": val_a, "noisy": val_b})
    trainer.test(module, test_loader)        # a val_loss span, train.dataloader=test
    trainer.predict(module, predict_loader)  # an inference span, train.dataloader=predict
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightning.pytorch.callbacks import Callback

from otel_train.common.attributes import (
    DATALOADER,
    KIND_TRAIN,
    MICRO_STEP,
    PHASE_BACKWARD,
    PHASE_DATA,
    PHASE_FORWARD,
    PHASE_INFERENCE,
    PHASE_MICRO_STEP,
    PHASE_OPTIMIZER,
    PHASE_VAL_LOSS,
)
from otel_train.integrations.governed_eval import govern_lightning_validation
from otel_train.integrations.step_tracker import HookStepTracker, guarded
from otel_train.run import Run, start_run


class LightningStepTraceCallback(Callback):
    """A Lightning ``Callback`` that records each optimizer step as a ``train.step`` trace."""

    def __init__(self, run: Run | None = None, loader: str = "train",
                 val_loader_names: Sequence[str] | None = None,
                 test_loader_names: Sequence[str] | None = None,
                 predict_loader_names: Sequence[str] | None = None,
                 **run_options: Any) -> None:
        self._run_options = run_options
        # Lightning's callbacks open and end steps; no model hooks are needed.
        self.tracker = HookStepTracker(self._start_run, hooks_delimit_steps=False)
        self.tracker.run = run
        self._owns_run = False
        self._run_shut_down = False  # our run was shut down by teardown
        self._loader = loader
        # loop -> (monitoring name, names given, the Trainer's loaders attribute)
        self._loops: dict[str, tuple[str, list[str] | None, str]] = {
            "val": (PHASE_VAL_LOSS, _names(val_loader_names), "val_dataloaders"),
            "test": (PHASE_VAL_LOSS, _names(test_loader_names), "test_dataloaders"),
            "predict": (PHASE_INFERENCE, _names(predict_loader_names), "predict_dataloaders"),
        }
        self._global_step = 0
        self._mark = 0
        self._micro_index = 0
        self._loop_index = -1  # the dataloader of the evaluation loop open now
        self._governed: dict[str, Any] = {}  # governed_eval.py's memo

    @property
    def run(self) -> Run | None:
        """The run the steps go to (started at ``setup`` unless one was given)."""
        return self.tracker.run

    def hook_failures(self) -> dict[str, int]:
        """Callback calls that failed (logged, not raised into the Trainer), by hook name."""
        return self.tracker.hook_failures.counts()

    def _start_run(self) -> Run:
        run = start_run(**self._run_options)
        self._owns_run = True  # so teardown shuts it down
        return run

    def _loader_name(self, loop: str, trainer: Any, index: int) -> str:
        """Dataloader ``index`` of ``loop``: the name given, the dict's key, else ``val``,
        ``val1``, ... (``test``, ``predict``, ...)."""
        _, given, attribute = self._loops[loop]
        if given and index < len(given):
            return given[index]
        loaders = getattr(trainer, attribute, None)
        if isinstance(loaders, Mapping) and index < len(loaders):
            return str(list(loaders)[index])
        return loop if index == 0 else f"{loop}{index}"

    # -- fit ------------------------------------------------------------------------------
    @guarded
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Start (or reuse) the run; after our run was shut down by teardown, a new one."""
        if self._run_shut_down:
            self.tracker.run = None
            self._run_shut_down = False
        self.tracker.ensure_run()

    @guarded
    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        """The epoch's first fetch starts here."""
        run = self.tracker.run
        if self.tracker.step is None and run is not None:
            self._mark = run.timestamp_ns()

    @guarded
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
                             ) -> None:
        """A batch arrived: its fetch was the data phase; the forward starts."""
        tracker = self.tracker
        run = tracker.run
        if run is None:
            return
        t = run.timestamp_ns()
        mark = self._mark or t
        step = tracker.step
        if step is None:
            self._global_step = trainer.global_step
            step = tracker.begin_step(self._loader, trainer.global_step, mark)
            self._micro_index = 0
        else:
            self._micro_index += 1
        if trainer.accumulate_grad_batches > 1:  # a micro-step holds its own fetch
            tracker.open_phase(PHASE_MICRO_STEP, mark,
                               attributes={MICRO_STEP: self._micro_index})
        step.record_phase(PHASE_DATA, mark, t, KIND_TRAIN)
        step.count(batch=batch)  # tokens/samples from its shape or the options (no sync)
        tracker.open_phase(PHASE_FORWARD, t)

    @guarded
    def on_before_zero_grad(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        """``training_step`` returned (zero_grad runs before backward)."""
        tracker = self.tracker
        if tracker.step is not None:
            tracker.close_phase(PHASE_FORWARD, tracker.timestamp_ns())

    @guarded
    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        """The backward starts."""
        tracker = self.tracker
        if tracker.step is None:
            return
        t = tracker.timestamp_ns()
        tracker.close_phase(PHASE_FORWARD, t)
        tracker.open_phase(PHASE_BACKWARD, t)

    @guarded
    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        """The backward ended (and with it the micro-step)."""
        tracker = self.tracker
        if tracker.step is None:
            return
        t = tracker.timestamp_ns()
        tracker.close_phase(PHASE_BACKWARD, t)
        tracker.close_phase(PHASE_MICRO_STEP, t)

    @guarded
    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        """The optimizer step starts (clipping, then the update)."""
        tracker = self.tracker
        if tracker.step is None:
            return
        t = tracker.timestamp_ns()
        tracker.close_phase(PHASE_MICRO_STEP, t)
        tracker.open_phase(PHASE_OPTIMIZER, t)

    @guarded
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        """The batch ended; the step ends with it when an optimizer step ran."""
        tracker = self.tracker
        if tracker.step is None:
            return
        t = tracker.timestamp_ns()
        tracker.close_phases(t)
        # budget_action=govern: whether Lightning validates next (governed_eval.py)
        govern_lightning_validation(tracker.run, trainer, self._governed)
        if trainer.global_step != self._global_step:
            tracker.end_step()
        self._mark = t

    @guarded
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Close what is open and export what was recorded."""
        self.tracker.end_step()
        if self.tracker.run is not None:
            self.tracker.run.flush()

    @guarded
    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """``fit``/``validate``/... ended: end what is open; shut down a run we started."""
        tracker = self.tracker
        tracker.finish()
        run = tracker.run
        if self._owns_run and run is not None and not self._run_shut_down:
            # ``callback.run`` stays readable (costs()); a later fit() starts a new run.
            self._run_shut_down = True
            run.shutdown()

    # -- validation, test and predict loops: monitoring ----------------------------------
    @guarded
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        """The validation loop starts: monitoring."""
        self._open_loop("val", trainer, 0)

    @guarded
    def on_validation_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                                  batch_idx: int, dataloader_idx: int = 0) -> None:
        """A validation batch of loader ``dataloader_idx``: a new loader, a new span."""
        self._next_loader("val", trainer, dataloader_idx)

    @guarded
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        """The validation loop ended; the next fetch starts after it."""
        self._close_loop()

    @guarded
    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        """``trainer.test()``'s loop starts: evaluation, monitoring."""
        self._open_loop("test", trainer, 0)

    @guarded
    def on_test_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        """A test batch of loader ``dataloader_idx``: a new loader, a new span."""
        self._next_loader("test", trainer, dataloader_idx)

    @guarded
    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        """The test loop ended."""
        self._close_loop()

    @guarded
    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        """``trainer.predict()``'s loop starts: inference, monitoring."""
        self._open_loop("predict", trainer, 0)

    @guarded
    def on_predict_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                               batch_idx: int, dataloader_idx: int = 0) -> None:
        """A predict batch of loader ``dataloader_idx``: a new loader, a new span."""
        self._next_loader("predict", trainer, dataloader_idx)

    @guarded
    def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
        """The predict loop ended."""
        self._close_loop()

    def _open_loop(self, loop: str, trainer: Any, index: int) -> None:
        """Open ``loop``'s monitoring for its dataloader ``index``: a phase of the open step
        (validation inside fit), else its own span."""
        self._loop_index = -1
        if self.tracker.run is None:
            return
        self.tracker.open_monitoring(
            self._loops[loop][0], attributes={DATALOADER: self._loader_name(loop, trainer,
                                                                            index)})
        self._loop_index = index

    def _next_loader(self, loop: str, trainer: Any, index: int) -> None:
        if index != self._loop_index and self.tracker.monitoring_open:
            self.tracker.close_monitoring()
            self._open_loop(loop, trainer, index)

    def _close_loop(self) -> None:
        self.tracker.close_monitoring()
        self._loop_index = -1
        if self.tracker.run is not None:
            self._mark = self.tracker.run.timestamp_ns()


def _names(names: Sequence[str] | None) -> list[str] | None:
    return list(names) if names else None
