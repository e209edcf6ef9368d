"""Hook events become steps: the one state machine every integration feeds.

Hooks and callbacks learn phase boundaries as separate events (a forward pre-hook, then a
forward hook; ``on_before_backward``, then ``on_after_backward``), so a ``with`` block cannot
hold a phase. :class:`HookStepTracker` keeps what is open between those events (the run, the
step, a stack of open phases, the open monitoring) and records it through the core's
timestamped API (``Run.step(start_ns=)``, ``Step.open_phase`` / ``close_phase`` /
``record_phase`` / ``end``, ``Run.timestamp_ns()``, ``MonitorRecord.start`` / ``end``).

Who feeds it:

- ``hooks.instrument()`` and ``instrumentor.TorchTrainingInstrumentor``: torch hooks only,
  so the hooks also delimit steps (``hooks_delimit_steps=True``): a step runs from the first
  training event after the previous step (a training fetch or forward) to the end of the
  step optimizer's ``step()``; ``model.eval()`` .. ``model.train()`` is ``eval`` monitoring;
- ``hf.TrainerStepTraceCallback``: the Trainer's callbacks open and end steps; the model's
  forward hooks and the backward probe split them into forward and backward;
- ``lightning.LightningStepTraceCallback``: callbacks only (the stack of open phases and the
  monitoring spans of the validation loop).

Nothing here raises into training: every event handler is wrapped by :func:`guarded`, which
logs the failure (rate-limited) and counts it by handler name in ``hook_failures``.

Usage::

    tracker = HookStepTracker(lambda: otel_train.start_run(), hooks_delimit_steps=True)
    undo = tracker.hook_model(model, wrap_train=True)   # forward, train()/eval(), generate
    tracker.fetched("train", t0, t1); ...; tracker.optimizer_post(opt)
    tracker.finish()
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.autograd import Variable

from otel_train.common.attributes import (
    KIND_MONITOR,
    KIND_TRAIN,
    PHASE_BACKWARD,
    PHASE_DATA,
    PHASE_EVAL,
    PHASE_FORWARD,
    PHASE_INFERENCE,
    PHASE_OPTIMIZER,
)
from otel_train.common.drop_counter import DropCounter
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.recording.recorder import MonitorRecord, Step
from otel_train.run import Run

__all__ = ["HookStepTracker", "attach_backward_probe", "guarded"]

_log = logging.getLogger("otel_train")
_F = TypeVar("_F", bound=Callable[..., Any])


# -- the guard: a hook or callback never raises into training ------------------------------

def guarded(fn: _F) -> _F:
    """Wrap an event handler method: a failure is logged and counted, never raised.

    The handler's owner has a ``tracker`` (a :class:`HookStepTracker`) or is one; its
    ``hook_failures`` counts failures by handler name.
    """
    name = fn.__name__

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except Exception as exc:
            tracker = self if isinstance(self, HookStepTracker) else self.tracker
            tracker.failed(name, exc)
            return None
    return wrapper  # type: ignore[return-value]


# -- backward: start and end, exactly, for two hook calls per backward ----------------------

_Tensor = torch.Tensor


def _grad_tensors(output: Any, limit: int = 4) -> list[Any]:
    """Top-level tensors of a forward output that will receive a gradient."""
    if isinstance(output, _Tensor):
        return [output] if output.requires_grad else []
    if isinstance(output, dict):  # includes transformers' ModelOutput
        values = list(output.values())
    elif isinstance(output, (tuple, list)):
        values = list(output)
    else:
        return []
    return [v for v in values if isinstance(v, _Tensor) and v.requires_grad][:limit]


def attach_backward_probe(output: Any, on_start: Callable[[], None],
                          on_end: Callable[[], None]) -> bool:
    """Call ``on_start`` when backward reaches ``output`` and ``on_end`` when it finishes.

    Backward starts at the loss, which is the model's output or a few cheap ops away from
    it; the first gradient to arrive at any top-level output tensor marks the start. The end
    is the autograd engine's own "graph task finished" callback (what DDP uses to finalize
    its reduction), queued from that first hook: exact, and no per-parameter hooks.
    Returns False when nothing in ``output`` requires grad (no backward can follow).
    """
    tensors = _grad_tensors(output)
    if not tensors:
        return False
    fired = [False]

    def hook(_grad: Any) -> None:
        if fired[0]:
            return
        fired[0] = True
        on_start()
        Variable._execution_engine.queue_callback(on_end)

    for t in tensors:
        t.register_hook(hook)
    return True


# -- the tracker -----------------------------------------------------------------------------

class HookStepTracker:
    """Turns hook and callback events (fetch, forward, backward, optimizer, mode switch,
    monitoring) into the steps, phases and monitoring spans of a run."""

    def __init__(self, get_run: Callable[[], Run], hooks_delimit_steps: bool = True) -> None:
        self._get_run = get_run
        # True: a training fetch/forward opens a step and the step optimizer ends it
        # (instrument()). False: the owner (a Trainer callback) opens and ends steps.
        self.hooks_delimit_steps = hooks_delimit_steps
        self.run: Run | None = None
        self.step: Step | None = None
        self.step_optimizer: Any = None  # weakref to the optimizer whose step ends a step
        self.loader_names: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self.only_named_loaders = False
        self.hook_failures = DropCounter()  # by handler name
        self._warn = RateLimitedLogger(_log)  # per tracker: a new run warns afresh
        # The open phases of the step, innermost last (the step's event list holds their
        # times; this the names, so an event can close "backward" without knowing what else
        # is open).
        self._open: list[str] = []
        self._monitor_level = -1  # index in _open of monitoring open as a phase of the step
        self._monitor_record: Any = None  # monitoring open as its own span between steps
        self._quiet = 0  # > 0 inside generate(): its forwards belong to inference
        self.in_forward = 0  # depth of hooked forwards: nested models are not new forwards
        self.last_backward_end_ns = 0  # where the last recorded backward ended
        self.first_eval_forward_ns = 0  # the first eval-mode forward since the owner reset it

    # -- failures ---------------------------------------------------------------------------
    def failed(self, name: str, exc: BaseException) -> None:
        """Log (rate-limited) and count a failed event handler; never raises."""
        try:
            self.hook_failures.add(name)
            self._warn.log(logging.WARNING, name, "otel-train: %s failed (training goes on): %r",
                           name, exc)
        except Exception:
            pass  # the guard itself must not raise into training

    # -- run and step -----------------------------------------------------------------------
    @guarded
    def prepare(self) -> None:
        """Start the run now if it is started lazily (before anything is timed)."""
        self.ensure_run()

    def ensure_run(self) -> Run:
        """The run, started on first use."""
        run = self.run
        if run is None:
            run = self.run = self._get_run()
        return run

    def timestamp_ns(self) -> int:
        """A phase-boundary timestamp from the run (``device_sync`` honoured)."""
        return self.ensure_run().timestamp_ns()

    def begin_step(self, loader: str | None = None, index: int | None = None,
                   start_ns: int | None = None) -> Step:
        """Open a new step (backdated to ``start_ns``); nothing of the last one stays open."""
        step = self.step = self.ensure_run().step(loader, index, start_ns)
        if self._open:
            self._open.clear()
        self._monitor_level = -1
        return step

    def _ensure_step(self, loader: str | None, start_ns: int | None) -> Step:
        step = self.step
        if step is None or step.end_ns:
            step = self.begin_step(loader, None, start_ns)
        return step

    def end_step(self) -> None:
        """End the open step; phases still open (monitoring included) end with it."""
        step, self.step = self.step, None
        if self._open:
            self._open.clear()
        self._monitor_level = -1
        if step is not None and not step.end_ns:
            step.end()

    def finish(self) -> None:
        """End what is open (at uninstrument, train end or shutdown)."""
        self.close_monitoring()
        self.end_step()

    # -- phases of the open step ------------------------------------------------------------
    def open_phase(self, name: str, start_ns: int, kind: str = KIND_TRAIN,
                   attributes: dict[str, Any] | None = None) -> None:
        """Open phase ``name`` at ``start_ns``, inside the innermost open one."""
        step: Any = self.step
        step.open_phase(name, kind, start_ns, attributes=attributes)
        self._open.append(name)

    def close_phase(self, name: str, end_ns: int) -> bool:
        """Close open phases up to and including ``name``; False when it is not open."""
        open_ = self._open
        if open_ and open_[-1] == name:  # the usual case, once per phase: keep it short
            open_.pop()
            self.step.close_phase(end_ns)  # type: ignore[union-attr]
            if self._monitor_level >= len(open_):
                self._monitor_level = -1
            return True
        if name not in open_:
            return False
        self._close_down_to(len(open_) - 1 - open_[::-1].index(name), end_ns)  # innermost
        return True

    def close_phases(self, end_ns: int) -> None:
        """Close every open phase of the step."""
        self._close_down_to(0, end_ns)

    def _close_down_to(self, index: int, end_ns: int) -> None:
        """Close the open phases from the innermost down to ``_open[index]`` included."""
        open_, step = self._open, self.step
        while len(open_) > index:
            open_.pop()
            step.close_phase(end_ns)  # type: ignore[union-attr]
        if self._monitor_level >= len(open_):
            self._monitor_level = -1  # the monitoring phase was among them

    # -- monitoring: a phase of the open step, else its own span ----------------------------
    @property
    def monitoring_open(self) -> bool:
        """True while monitoring opened here is open."""
        return self._monitor_level >= 0 or self._monitor_record is not None

    @property
    def monitor_record(self) -> MonitorRecord | None:
        """The open monitoring span between steps (None inside a step or when none is open)."""
        rec = self._monitor_record
        return rec if isinstance(rec, MonitorRecord) else None

    def open_monitoring(self, name: str, start_ns: int | None = None,
                        attributes: dict[str, Any] | None = None) -> None:
        """Open monitoring ``name``: a phase of the open step, else a span of its own."""
        run = self.ensure_run()
        step = self.step
        if step is not None and not step.end_ns:
            level = len(self._open)
            self.open_phase(name, run.timestamp_ns() if start_ns is None else start_ns,
                            KIND_MONITOR, attributes)
            self._monitor_level = level
            return
        rec = run.monitor(name)
        if isinstance(rec, MonitorRecord):
            rec.start(start_ns)
        else:
            rec.__enter__()  # a step opened elsewhere is current: a phase of it
        if attributes:
            for key, value in attributes.items():
                rec.set_attribute(key, value)
        self._monitor_record = rec

    def close_monitoring(self, end_ns: int | None = None) -> None:
        """Close the monitoring opened by :meth:`open_monitoring` (if still open)."""
        rec = self._monitor_record
        if rec is not None:
            self._monitor_record = None
            if isinstance(rec, MonitorRecord):
                rec.end(end_ns)
            else:
                rec.__exit__(None, None, None)
            return
        level = self._monitor_level
        if level >= 0 and self.step is not None and not self.step.end_ns:
            end = self.timestamp_ns() if end_ns is None else end_ns
            self._close_down_to(level, end)
        self._monitor_level = -1

    # -- hook events ------------------------------------------------------------------------
    @guarded
    def fetched(self, loader: str | None, t0: int, t1: int) -> None:
        """A batch came out of a DataLoader between ``t0`` and ``t1`` (hooks delimit steps)."""
        if self._monitor_level >= 0 or self._monitor_record is not None:  # monitoring_open
            step = self.step
            if self._monitor_level >= 0 and step is not None and not step.end_ns:
                step.record_phase(PHASE_DATA, t0, t1, KIND_MONITOR, loader or PHASE_EVAL)
            return
        loader = loader or "train"
        fresh = self.step is None or self.step.end_ns
        step = self._ensure_step(loader, t0)
        step.record_phase(PHASE_DATA, t0, t1, KIND_TRAIN, None if fresh else loader)

    @property
    def backward_open(self) -> bool:
        """True while a recorded backward runs."""
        return PHASE_BACKWARD in self._open

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

    # The handlers below run a few times per step: they call the core directly (no helper
    # layers in between), and ``run`` is set whenever a step is open.
    @guarded
    def forward_pre(self, module: Any) -> None:
        """The outermost forward of an instrumented model starts."""
        if self._quiet or PHASE_BACKWARD in self._open:
            return  # generate()'s own forwards; recomputation inside backward (checkpointing)
        if not module.training:
            if self.hooks_delimit_steps:
                if not self.monitoring_open:
                    self.open_monitoring(PHASE_EVAL)  # eval-mode forward, no eval() seen
            elif not self.first_eval_forward_ns and self.run is not None:
                # A Trainer's evaluation loop announces itself after its first forward.
                self.first_eval_forward_ns = self.run.timestamp_ns()
            return
        if self.hooks_delimit_steps:
            if self._monitor_level >= 0 or self._monitor_record is not None:
                self.close_monitoring()
            step = self._ensure_step(None, None)
        else:
            step = self.step
            if step is None or self.monitoring_open:
                return  # the Trainer opens steps; forwards of its monitoring are not training
        run: Any = self.run
        step.open_phase(PHASE_FORWARD, KIND_TRAIN, run.timestamp_ns())
        self._open.append(PHASE_FORWARD)

    @guarded
    def forward_post(self, module: Any, output: Any) -> None:
        """The outermost forward ended: close it and watch for its backward."""
        if PHASE_FORWARD not in self._open:
            return
        run: Any = self.run
        self.close_phase(PHASE_FORWARD, run.timestamp_ns())
        if torch.is_grad_enabled():
            attach_backward_probe(output, self._backward_start, self._backward_end)

    @guarded
    def _backward_start(self) -> None:
        step = self.step
        if step is not None and not step.end_ns and PHASE_BACKWARD not in self._open:
            run: Any = self.run
            step.open_phase(PHASE_BACKWARD, KIND_TRAIN, run.timestamp_ns())
            self._open.append(PHASE_BACKWARD)

    @guarded
    def _backward_end(self) -> None:
        if PHASE_BACKWARD in self._open:
            step = self.step
            if step is not None and not step.end_ns:
                run: Any = self.run
                t = self.last_backward_end_ns = run.timestamp_ns()
                self.close_phase(PHASE_BACKWARD, t)
            else:  # the run ended the step (shutdown): nothing of it is open any more
                self._open.clear()
                self._monitor_level = -1

    @guarded
    def optimizer_pre(self, optimizer: Any) -> None:
        """``optimizer.step()`` starts."""
        if self.step_optimizer is None or self.step_optimizer() is None:
            self.step_optimizer = weakref.ref(optimizer)  # the first optimizer seen
        if self._monitor_level >= 0 or self._monitor_record is not None:
            self.close_monitoring()
        run = self.ensure_run()
        step = self._ensure_step(None, None)
        step.open_phase(PHASE_OPTIMIZER, KIND_TRAIN, run.timestamp_ns())
        self._open.append(PHASE_OPTIMIZER)

    @guarded
    def optimizer_post(self, optimizer: Any) -> None:
        """``optimizer.step()`` ended; the step optimizer's step ends the training step."""
        if PHASE_OPTIMIZER not in self._open:
            return
        run: Any = self.run
        self.close_phase(PHASE_OPTIMIZER, run.timestamp_ns())
        if self.step_optimizer() is optimizer:
            self.end_step()

    @guarded
    def mode_switch(self, training: bool) -> None:
        """``model.train(mode)`` was called: eval() opens monitoring, train() closes it."""
        if training:
            self.close_monitoring()
        elif not self.monitoring_open:
            self.open_monitoring(PHASE_EVAL)

    def generate(self, call: Callable[[], Any]) -> Any:
        """Run ``model.generate`` as ``inference`` monitoring (its forwards inside it)."""
        opened = not self.monitoring_open
        if opened:
            try:
                self.open_monitoring(PHASE_INFERENCE)
            except Exception as exc:
                opened = False
                self.failed("generate", exc)
        self._quiet += 1
        try:
            return call()
        finally:
            self._quiet -= 1
            if opened:
                try:
                    self.close_monitoring()
                except Exception as exc:
                    self.failed("generate", exc)

    # -- per-model hooks ----------------------------------------------------------------------
    def hook_model(self, model: Any, wrap_train: bool) -> list[Callable[[], None]]:
        """Forward hooks and a ``generate`` wrapper on ``model`` (and a ``train`` wrapper,
        so ``eval()``/``train()`` open and close monitoring, when ``wrap_train``); returns
        the undo callables."""
        def pre(module: Any, args: Any) -> None:
            self.enter_forward(module)

        def post(module: Any, args: Any, output: Any) -> None:
            self.exit_forward(module, output)

        handles = [model.register_forward_pre_hook(pre),
                   model.register_forward_hook(post, always_call=True)]
        undo: list[Callable[[], None]] = [h.remove for h in handles]
        if wrap_train:
            original_train = model.train

            def train(mode: bool = True) -> Any:
                self.mode_switch(bool(mode))
                return original_train(mode)

            # Instance attributes shadow the class's methods, also for nn.Module.eval's
            # self.train.
            object.__setattr__(model, "train", train)
            undo.append(lambda: model.__dict__.pop("train", None))
        original_generate = getattr(model, "generate", None)
        if callable(original_generate):
            @functools.wraps(original_generate)
            def generate(*args: Any, **kwargs: Any) -> Any:
                return self.generate(lambda: original_generate(*args, **kwargs))

            object.__setattr__(model, "generate", generate)
            undo.append(lambda: model.__dict__.pop("generate", None))
        return undo
