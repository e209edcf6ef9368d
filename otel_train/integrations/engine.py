"""The hook engine: hook events (fetch, forward, backward, optimizer, mode switch) become
steps and phases of a run. ``hooks.py`` installs the hooks that feed it (per model, per
optimizer, DataLoader iteration); ``instrumentor.py`` installs them process-wide.

Step boundaries (what ``otel_train.instrument`` documents): a step runs from the first
training event after the previous step (a training fetch or forward) to the end of the
step optimizer's ``step()``; ``model.eval()`` .. ``model.train()`` is ``eval`` monitoring.

Usage::

    engine = HookEngine(lambda: otel_train.start_run())
    engine.fetched("train", t0, t1); engine.enter_forward(model); ...
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable
from typing import Any

from torch import is_grad_enabled

from otel_train.attributes import (
    KIND_MONITOR,
    KIND_TRAIN,
    PHASE_BACKWARD,
    PHASE_DATA,
    PHASE_FORWARD,
    PHASE_INFERENCE,
    PHASE_OPTIMIZER,
)
from otel_train.integrations.timeline import attach_backward_probe
from otel_train.rate_limited_log import RateLimitedLogger
from otel_train.run import Run

_log = logging.getLogger("otel_train")
_warn = RateLimitedLogger(_log)
PHASE_EVAL = "eval"
_IN_STEP = "in-step"  # marks monitoring open as a phase of the current step


def _guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A hook must never raise into training: log (rate-limited) and carry on."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            _warn.log(logging.WARNING, fn.__name__, "otel-train: hook %s failed: %r",
                      fn.__name__, exc)
            return None
    return wrapper


class HookEngine:
    """Turns hook events (fetch, forward, backward, optimizer, mode switch) into steps."""

    def __init__(self, get_run: Callable[[], Run]) -> None:
        self._get_run = get_run
        self.run: Run | None = None
        self.step: Any = None
        self.step_optimizer: Any = None  # the optimizer whose step ends a step
        self.loader_names: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self.only_named_loaders = False
        # Which phases are open (the step's event list knows the order; these the state).
        self._forward = False
        self._backward = False
        self._optimizer = False
        self._eval: Any = None  # _IN_STEP (a phase of the step) or a MonitorRecord
        self._quiet = 0  # > 0 inside generate(): its forwards belong to inference
        self.in_forward = 0  # depth of hooked forwards: nested models are not new forwards

    # -- lifecycle helpers ----------------------------------------------------------------
    @_guarded
    def prepare(self) -> None:
        """Start the run now if it is started lazily (before anything is timed)."""
        self._ensure_run()

    def _ensure_run(self) -> Run:
        run = self.run
        if run is None:
            run = self.run = self._get_run()
        return run

    def _ensure_step(self, loader: str | None, start_ns: int | None) -> Any:
        step = self.step
        if step is None or step.end_ns:
            step = self.step = self._ensure_run().step(loader=loader, start_ns=start_ns)
            self._forward = self._backward = self._optimizer = False
            self._eval = None
        return step

    def finish(self) -> None:
        """End what is open (at uninstrument or shutdown)."""
        self._close_eval()
        step = self.step
        if step is not None and not step.end_ns:
            step.end()
        self.step = None

    # -- events ---------------------------------------------------------------------------
    @_guarded
    def fetched(self, loader: str | None, t0: int, t1: int) -> None:
        """A batch came out of a DataLoader between ``t0`` and ``t1``."""
        if self._eval is not None:
            step = self.step
            if self._eval is _IN_STEP and step is not None and not step.end_ns:
                step.record_phase(PHASE_DATA, t0, t1, KIND_MONITOR, loader or PHASE_EVAL)
            return
        loader = loader or "train"
        fresh = self.step is None or self.step.end_ns
        step = self._ensure_step(loader, t0)
        step.record_phase(PHASE_DATA, t0, t1, KIND_TRAIN, None if fresh else loader)

    @property
    def backward_open(self) -> bool:
        """True while a recorded backward runs."""
        return self._backward

    def enter_forward(self, module: Any) -> None:
        """A hooked model's forward starts (only the outermost one counts)."""
        self.in_forward += 1
        if self.in_forward == 1:
            self.forward_pre(module)

    def exit_forward(self, module: Any, output: Any) -> None:
        """A hooked model's forward ended (also when it raised: ``always_call``)."""
        self.in_forward -= 1
        if self.in_forward == 0:
            self.forward_post(module, output)

    @_guarded
    def forward_pre(self, module: Any) -> None:
        """The outermost forward of an instrumented model starts."""
        if self._quiet or self._backward:
            return  # generate()'s own forwards; recomputation inside backward (checkpointing)
        if not module.training:
            if self._eval is None:
                self._open_eval(PHASE_EVAL)  # eval-mode forward without a seen model.eval()
            return
        if self._eval is not None:
            self._close_eval()
        run = self._ensure_run()
        step = self._ensure_step(None, None)
        step.open_phase(PHASE_FORWARD, KIND_TRAIN, run.timestamp_ns())
        self._forward = True

    @_guarded
    def forward_post(self, module: Any, output: Any) -> None:
        """The outermost forward ended: close it and watch for its backward."""
        if not self._forward:
            return
        self._forward = False
        self.step.close_phase(self.run.timestamp_ns())
        if is_grad_enabled():
            attach_backward_probe(output, self._backward_start, self._backward_end)

    @_guarded
    def _backward_start(self) -> None:
        step = self.step
        if step is not None and not step.end_ns and not self._backward:
            step.open_phase(PHASE_BACKWARD, KIND_TRAIN, self.run.timestamp_ns())
            self._backward = True

    @_guarded
    def _backward_end(self) -> None:
        if self._backward:
            self._backward = False
            step = self.step
            if step is not None and not step.end_ns:
                step.close_phase(self.run.timestamp_ns())

    @_guarded
    def optimizer_pre(self, optimizer: Any) -> None:
        """``optimizer.step()`` starts."""
        if self.step_optimizer is None or self.step_optimizer() is None:
            self.step_optimizer = weakref.ref(optimizer)  # the first optimizer seen
        if self._eval is not None:
            self._close_eval()
        run = self._ensure_run()
        step = self._ensure_step(None, None)
        step.open_phase(PHASE_OPTIMIZER, KIND_TRAIN, run.timestamp_ns())
        self._optimizer = True

    @_guarded
    def optimizer_post(self, optimizer: Any) -> None:
        """``optimizer.step()`` ended; the step optimizer's step ends the training step."""
        step = self.step
        if not self._optimizer or step is None:
            return
        self._optimizer = False
        step.close_phase(self.run.timestamp_ns())
        if self.step_optimizer() is optimizer:
            if self._eval is _IN_STEP:
                self._eval = None  # ends with its step
            step.end()
            self.step = None

    @_guarded
    def mode_switch(self, training: bool) -> None:
        """``model.train(mode)`` was called: eval() opens monitoring, train() closes it."""
        if training:
            self._close_eval()
        elif self._eval is None:
            self._open_eval(PHASE_EVAL)

    def _open_eval(self, name: str) -> None:
        run = self._ensure_run()
        step = self.step
        if step is not None and not step.end_ns:
            step.open_phase(name, KIND_MONITOR, run.timestamp_ns())
            self._eval = _IN_STEP
        else:
            rec = run.monitor(name)
            rec.__enter__()
            self._eval = rec

    def _close_eval(self) -> None:
        mon = self._eval
        if mon is None:
            return
        self._eval = None
        if mon is _IN_STEP:
            step = self.step
            if step is not None and not step.end_ns:
                step.close_phase(self.run.timestamp_ns())
        else:
            mon.__exit__(None, None, None)

    def generate(self, call: Callable[[], Any]) -> Any:
        """Run ``model.generate`` as an ``inference`` monitoring phase (its forwards inside)."""
        opened = self._eval is None
        if opened:
            try:
                self._open_eval(PHASE_INFERENCE)
            except Exception as exc:
                opened = False
                _warn.log(logging.WARNING, "generate", "otel-train: %r", exc)
        self._quiet += 1
        try:
            return call()
        finally:
            self._quiet -= 1
            if opened:
                self._close_eval()
