"""Zero-code step traces from torch's own hooks: ``otel_train.instrument(model, optimizer)``.

An unmodified loop (``for x, y in loader: loss = model(x); loss.backward(); opt.step()``)
produces the same ``train.step`` traces as the explicit API:

- **step**: from the first training event after the previous step (a training fetch or
  forward) to the end of ``optimizer.step()`` (the optimizer's step post-hook);
- **data**: ``next()`` on an instrumented DataLoader's iterator (``DataLoader.__iter__`` is
  wrapped while instrumented), named by ``dataloader={"main": dl, ...}`` or ``"train"``;
- **forward**: the model's forward pre-hook to its forward hook (``always_call``);
- **backward**: from the first gradient reaching the model's output to the autograd
  engine's end-of-backward callback (see ``timeline.attach_backward_probe``): two Python
  calls per backward, no per-parameter hooks;
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

from otel_train.integrations.engine import HookEngine
from otel_train.run import Run

_log = logging.getLogger("otel_train")
_ACTIVE: HookEngine | None = None  # one engine at a time: hooks are process-wide state


# -- DataLoader iteration -------------------------------------------------------------------

class _TimedIterator:
    """A DataLoader iterator whose ``next()`` is timed as the data phase."""

    __slots__ = ("_it", "_engine", "_name")

    def __init__(self, it: Any, engine: HookEngine, name: str | None) -> None:
        self._it = it
        self._engine = engine
        self._name = name

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        engine = self._engine
        if engine.run is None:
            engine.prepare()  # start a lazy run before timing, not inside the first fetch
        t0 = perf_counter_ns()
        item = next(self._it)  # StopIteration ends the loop, and records nothing
        engine.fetched(self._name, t0, perf_counter_ns())
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
        engine = _ACTIVE
        if engine is None:
            return it
        name = engine.loader_names.get(self)
        if name is None and engine.only_named_loaders:
            return it
        return _TimedIterator(it, engine, name)

    DataLoader.__iter__ = __iter__  # type: ignore[method-assign]


def _unpatch_dataloader() -> None:
    global _ORIGINAL_ITER
    from torch.utils.data import DataLoader

    if _ORIGINAL_ITER is not None:
        DataLoader.__iter__ = _ORIGINAL_ITER  # type: ignore[method-assign]
        _ORIGINAL_ITER = None


# -- per-model hooks (shared with the instrumentor) -----------------------------------------

def hook_model(engine: HookEngine, model: Any) -> list[Callable[[], None]]:
    """Forward hooks, ``train``/``generate`` wrappers on ``model``; returns undo callables."""
    def pre(module: Any, args: Any) -> None:
        engine.enter_forward(module)

    def post(module: Any, args: Any, output: Any) -> None:
        engine.exit_forward(module, output)

    handles = [model.register_forward_pre_hook(pre),
               model.register_forward_hook(post, always_call=True)]
    undo: list[Callable[[], None]] = [h.remove for h in handles]
    original_train = model.train

    def train(mode: bool = True) -> Any:
        engine.mode_switch(bool(mode))
        return original_train(mode)

    # Instance attributes shadow the class's methods, also for nn.Module.eval's self.train.
    object.__setattr__(model, "train", train)
    undo.append(lambda: model.__dict__.pop("train", None))
    original_generate = getattr(model, "generate", None)
    if callable(original_generate):
        @functools.wraps(original_generate)
        def generate(*args: Any, **kwargs: Any) -> Any:
            return engine.generate(lambda: original_generate(*args, **kwargs))

        object.__setattr__(model, "generate", generate)
        undo.append(lambda: model.__dict__.pop("generate", None))
    return undo


def hook_optimizer(engine: HookEngine, optimizer: Any) -> list[Callable[[], None]]:
    """Step pre/post hooks on one optimizer; returns undo callables."""
    pre = optimizer.register_step_pre_hook(lambda opt, a, k: engine.optimizer_pre(opt))
    post = optimizer.register_step_post_hook(lambda opt, a, k: engine.optimizer_post(opt))
    return [pre.remove, post.remove]


def activate(engine: HookEngine) -> None:
    """Make ``engine`` the process's one active engine (DataLoaders report to it)."""
    global _ACTIVE
    if _ACTIVE is not None and _ACTIVE is not engine:
        raise RuntimeError("otel-train: already instrumented; call uninstrument() first")
    _ACTIVE = engine
    _patch_dataloader()


def deactivate(engine: HookEngine) -> None:
    """Undo :func:`activate`."""
    global _ACTIVE
    if _ACTIVE is engine:
        _ACTIVE = None
        _unpatch_dataloader()


class Instrumentation:
    """What :func:`instrument` installed; ``uninstrument()`` removes all of it."""

    def __init__(self, engine: HookEngine, undo: list[Callable[[], None]], owns_run: bool
                 ) -> None:
        self.engine = engine
        self._undo = undo
        self._owns_run = owns_run
        self.active = True

    @property
    def run(self) -> Run | None:
        """The run the steps go to (None until the first step when started lazily)."""
        return self.engine.run

    def uninstrument(self) -> None:
        """Remove every hook and patch; end the open step; shut down a run we started."""
        if not self.active:
            return
        self.active = False
        engine = self.engine
        engine.finish()
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception as exc:
                _log.warning("otel-train: could not undo an instrumentation step: %r", exc)
        deactivate(engine)
        if self._owns_run and engine.run is not None:
            engine.run.shutdown()

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

    engine = HookEngine((lambda: run) if run is not None else (lambda: start_run(**run_options)))
    if run is not None:
        engine.run = run
    if dataloader is not None:
        engine.only_named_loaders = True
        if isinstance(dataloader, Mapping):
            items = list(dataloader.items())
        elif isinstance(dataloader, (list, tuple)):
            items = [("train" if i == 0 else f"train{i}", dl) for i, dl in enumerate(dataloader)]
        else:
            items = [("train", dataloader)]
        for name, dl in items:
            engine.loader_names[dl] = str(name)
    engine.step_optimizer = weakref.ref(optimizer)
    activate(engine)
    undo = hook_model(engine, model) + hook_optimizer(engine, optimizer)
    return Instrumentation(engine, undo, owns_run=run is None)
