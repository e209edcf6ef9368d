"""Zero-code step traces from torch's own hooks: ``otel_train.instrument(model, optimizer)``.

An unmodified loop (``for x, y in loader: loss = model(x); loss.backward(); opt.step()``)
produces the same ``train.step`` traces as the explicit API. The hooks installed here feed
a :class:`~otel_train.integrations.step_tracker.HookStepTracker`, which turns them into steps:

- **step**: from the first training event after the previous step (a training fetch or
  forward) to the end of ``optimizer.step()`` (the optimizer's step post-hook);
- **data**: ``next()`` on an instrumented DataLoader's iterator (``DataLoader.__iter__`` is
  wrapped while instrumented), named by ``dataloader={"main": dl, ...}`` or ``"train"``;
- **forward**: the model's forward pre-hook to its forward hook (``always_call``);
- **backward**: from the first gradient reaching the model's output to the autograd
  engine's end-of-backward callback (see ``step_tracker.attach_backward_probe``): two
  Python calls per backward, no per-parameter hooks;
- **optimizer**: the optimizer's step pre-hook to its post-hook;
- **eval** (monitoring): ``model.eval()`` to ``model.train()`` (the model's ``train`` method is
  wrapped); inside a step it is a monitoring phase, between steps a monitoring span
  (``run.monitor``). ``model.generate(...)`` is an ``inference`` monitoring phase.

Usage::

    import otel_train

    inst = otel_train.instrument(model, opt, dataloader=train_loader)
    for x, y in train_loader:          # unchanged loop
        loss = model(x, y); loss.backward(); opt.step(); opt.zero_grad()
    inst.uninstrument()                # removes every hook, restores every patch
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable, Mapping
from time import perf_counter_ns
from typing import Any

from otel_train.integrations.step_tracker import HookStepTracker
from otel_train.run import Run

_log = logging.getLogger("otel_train")
_ACTIVE: HookStepTracker | None = None  # one at a time: hooks are process-wide state


# -- DataLoader iteration -------------------------------------------------------------------

class _TimedIterator:
    """A DataLoader iterator whose ``next()`` is timed as the data phase."""

    __slots__ = ("_it", "_name", "_tracker")

    def __init__(self, it: Any, tracker: HookStepTracker, name: str | None) -> None:
        self._it = it
        self._tracker = tracker
        self._name = name

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        tracker = self._tracker
        if tracker.run is None:
            tracker.prepare()  # start a lazy run before timing, not inside the first fetch
        t0 = perf_counter_ns()
        item = next(self._it)  # StopIteration ends the loop, and records nothing
        tracker.fetched(self._name, t0, perf_counter_ns())
        return item

    def __len__(self) -> int:
        return len(self._it)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._it, name)


_ORIGINAL_ITER: Any = None


def _patch_dataloader() -> None:
    global _ORIGINAL_ITER
    from torch.utils.data import DataLoader

    if _ORIGINAL_ITER is not None:
        return
    original = _ORIGINAL_ITER = DataLoader.__iter__

    @functools.wraps(original)
    def __iter__(self: Any) -> Any:  # noqa: N807 (the patched dunder)
        it = original(self)
        tracker = _ACTIVE
        if tracker is None:
            return it
        name = tracker.loader_names.get(self)
        if name is None and tracker.only_named_loaders:
            return it
        return _TimedIterator(it, tracker, name)

    DataLoader.__iter__ = __iter__  # type: ignore[method-assign]


def _unpatch_dataloader() -> None:
    global _ORIGINAL_ITER
    from torch.utils.data import DataLoader

    if _ORIGINAL_ITER is not None:
        DataLoader.__iter__ = _ORIGINAL_ITER  # type: ignore[method-assign]
        _ORIGINAL_ITER = None


# -- optimizer hooks and the process's one active tracker -----------------------------------

def hook_optimizer(tracker: HookStepTracker, optimizer: Any) -> list[Callable[[], None]]:
    """Step pre/post hooks on one optimizer; returns undo callables."""
    pre = optimizer.register_step_pre_hook(lambda opt, a, k: tracker.optimizer_pre(opt))
    post = optimizer.register_step_post_hook(lambda opt, a, k: tracker.optimizer_post(opt))
    return [pre.remove, post.remove]


def activate(tracker: HookStepTracker) -> None:
    """Make ``tracker`` the process's one active tracker (DataLoaders report to it)."""
    global _ACTIVE
    if _ACTIVE is not None and _ACTIVE is not tracker:
        raise RuntimeError("otel-train: already instrumented; call uninstrument() first")
    _ACTIVE = tracker
    _patch_dataloader()


def deactivate(tracker: HookStepTracker) -> None:
    """Undo :func:`activate`."""
    global _ACTIVE
    if _ACTIVE is tracker:
        _ACTIVE = None
        _unpatch_dataloader()


class Instrumentation:
    """What :func:`instrument` installed; ``uninstrument()`` removes all of it."""

    def __init__(self, tracker: HookStepTracker, undo: list[Callable[[], None]],
                 owns_run: bool) -> None:
        self.tracker = tracker
        self._undo = undo
        self._owns_run = owns_run
        self.active = True

    @property
    def run(self) -> Run | None:
        """The run the steps go to (None until the first step when started lazily)."""
        return self.tracker.run

    def hook_failures(self) -> dict[str, int]:
        """Hook calls that failed (logged, not raised into training), by handler name."""
        return self.tracker.hook_failures.counts()

    def uninstrument(self) -> None:
        """Remove every hook and patch; end the open step; shut down a run we started."""
        if not self.active:
            return
        self.active = False
        tracker = self.tracker
        try:
            tracker.finish()
        except Exception as exc:
            tracker.failed("uninstrument", exc)
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception as exc:
                _log.warning("otel-train: could not undo an instrumentation step: %r", exc)
        deactivate(tracker)
        if self._owns_run and tracker.run is not None:
            tracker.run.shutdown()

    def __enter__(self) -> Instrumentation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstrument()


def instrument(model: Any, optimizer: Any, dataloader: Any = None, run: Run | None = None,
               **run_options: Any) -> Instrumentation:
    """Trace an unmodified loop through hooks on ``model``, ``optimizer`` and ``dataloader``.

    ``dataloader``: a DataLoader (named ``"train"``), a ``{name: DataLoader}`` mapping, a
    list of DataLoaders, or None (then every DataLoader iterated while instrumented counts).
    Without ``run``, a run is started at the first step with ``run_options`` (and
    ``OTEL_TRAIN_*``), and shut down by ``uninstrument()``.
    """
    from otel_train.run import start_run

    tracker = HookStepTracker(
        (lambda: run) if run is not None else (lambda: start_run(**run_options)),
        hooks_delimit_steps=True)
    if run is not None:
        tracker.run = run
    if dataloader is not None:
        tracker.only_named_loaders = True
        if isinstance(dataloader, Mapping):
            items = list(dataloader.items())
        elif isinstance(dataloader, (list, tuple)):
            items = [("train" if i == 0 else f"train{i}", dl) for i, dl in enumerate(dataloader)]
        else:
            items = [("train", dataloader)]
        for name, dl in items:
            tracker.loader_names[dl] = str(name)
    tracker.step_optimizer = weakref.ref(optimizer)
    activate(tracker)
    undo = tracker.hook_model(model, wrap_train=True) + hook_optimizer(tracker, optimizer)
    return Instrumentation(tracker, undo, owns_run=run is None)
