"""Integrations: bring otel-train's step traces to where people train.

- ``hooks.instrument(model, optimizer, dataloader=None)``: an unmodified loop, via torch hooks;
- ``instrumentor.TorchTrainingInstrumentor``: the same for ``opentelemetry-instrument``;
- ``hf.TrainerStepTraceCallback``: Hugging Face ``Trainer``;
- ``lightning.LightningStepTraceCallback``: Lightning ``Trainer``.

All four feed one ``step_tracker.HookStepTracker``, which turns hook and callback events
into steps, phases and monitoring spans, and guards every handler the same way (a failure
is logged and counted, never raised into training). The framework modules import their
framework, so import them by name.

Usage::

    from otel_train.integrations import instrument

    with instrument(model, optimizer, dataloader=train_loader):
        train()  # unchanged
"""

from __future__ import annotations

from otel_train.integrations.hooks import Instrumentation, instrument

__all__ = ["Instrumentation", "instrument"]
