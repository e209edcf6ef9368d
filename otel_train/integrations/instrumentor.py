"""``opentelemetry-instrument python train.py``: step traces for a script that imports nothing.

``TorchTrainingInstrumentor`` is registered under the ``opentelemetry_instrumentor`` entry
point (``otel_train``), so OpenTelemetry's auto-instrumentation loads it. It installs the
same hooks and step tracker (``step_tracker.HookStepTracker``) as
:func:`otel_train.instrument`, process-wide:

- optimizers: torch's global step hooks (``register_optimizer_step_pre_hook`` /
  ``_post_hook``) see every optimizer, also those created later; the first optimizer that
  steps ends the training steps, others record ``optimizer`` phases inside them;
- models: a global forward pre-hook finds each outermost call of a module that has
  parameters (not a loss function) and adopts that module: it gets the per-model hooks
  (forward, ``train``/``eval``, ``generate``), after which the global hook returns at once
  for calls inside it. It stays installed to find models created later: every module call
  pays one early-returning Python call (see ``benchmarks/bench_hooks.py``);
- DataLoaders: iteration is timed as the ``data`` phase (``train``, or ``eval`` while
  evaluating).

The run starts at the first step with options from ``OTEL_TRAIN_*`` (and the standard
``OTEL_*`` variables) and shuts down at exit; ``uninstrument()`` removes every hook and
restores every patch.

Usage::

    OTEL_TRAIN_SERVICE_NAME=tiny OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 \\
        opentelemetry-instrument python train.py
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Collection
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from otel_train.integrations.hooks import activate, deactivate
from otel_train.integrations.step_tracker import HookStepTracker


class TorchTrainingInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Hook-based step traces for any PyTorch training loop in the process."""

    _tracker: HookStepTracker | None = None
    _undo: list[Callable[[], None]]

    def instrumentation_dependencies(self) -> Collection[str]:
        """The packages (and versions) this instrumentation needs."""
        return ("torch >= 2.1",)

    @property
    def tracker(self) -> HookStepTracker | None:
        """The active step tracker (its ``run`` once the first step started)."""
        return self._tracker

    def _instrument(self, **kwargs: Any) -> None:
        import torch.nn.modules.module as module_hooks
        import torch.optim.optimizer as optimizer_hooks

        from otel_train.run import start_run

        options = kwargs.get("run_options") or {}
        tracker = HookStepTracker(lambda: start_run(**options), hooks_delimit_steps=True)
        activate(tracker)
        self._tracker = tracker
        self._undo = []
        adopted: weakref.WeakSet[Any] = weakref.WeakSet()
        ignored: weakref.WeakSet[Any] = weakref.WeakSet()
        undo = self._undo

        def global_pre(module: Any, args: Any) -> None:
            # Hot: runs for every module call while instrumented. Calls inside an adopted
            # model, and modules already judged, return at once.
            if tracker.in_forward or module in adopted or module in ignored:
                return
            try:
                if tracker.backward_open or next(module.parameters(), None) is None:
                    ignored.add(module)  # parameterless (a loss function): not a model
                    return
                adopted.add(module)
                undo.extend(tracker.hook_model(module, wrap_train=True))
            except Exception as exc:  # the same guard as every handler: never into training
                tracker.failed("adopt_model", exc)
                return
            # Hooks added now do not run for this call: start its forward by hand. Its
            # forward hook (added now) does run when this call returns.
            tracker.enter_forward(module)

        undo.append(module_hooks.register_module_forward_pre_hook(global_pre).remove)
        undo.append(optimizer_hooks.register_optimizer_step_pre_hook(
            lambda opt, a, k: tracker.optimizer_pre(opt)).remove)
        undo.append(optimizer_hooks.register_optimizer_step_post_hook(
            lambda opt, a, k: tracker.optimizer_post(opt)).remove)

    def _uninstrument(self, **kwargs: Any) -> None:
        tracker = self._tracker
        if tracker is None:
            return
        self._tracker = None
        try:
            tracker.finish()
        except Exception as exc:
            tracker.failed("uninstrument", exc)
        for undo in reversed(self._undo):
            undo()
        self._undo = []
        deactivate(tracker)
        if tracker.run is not None:
            tracker.run.shutdown()
