"""Phases with explicit timestamps, for integrations whose events split a with-block.

The explicit API times a phase with ``with step.phase(name):``. Callbacks and torch hooks
learn boundaries as separate events (a forward pre-hook, then a forward hook; a fetch that
is only known to start a step once it returned), so they record phases here with timestamps
taken at those events. They use the core's timestamped phase API
(``Step.open_phase`` / ``close_phase`` / ``record_phase``, ``Run.step(start_ns=)``), so phases
nest by order exactly as ``with`` blocks do, and spans a user opens inside nest under them.

Usage::

    t0 = stamp(run)
    step = begin_step(run, index=3, loader="train", start_ns=t0)
    open_phase(step, "forward", KIND_TRAIN, stamp(run))
    ...
    close_phase(step, stamp(run))       # closes the innermost open phase
    end_step(step)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.autograd import Variable

from otel_train.attributes import KIND_MONITOR, KIND_TRAIN
from otel_train.recorder import Step

if TYPE_CHECKING:
    from otel_train.run import Run

__all__ = [
    "KIND_MONITOR", "KIND_TRAIN", "add_phase", "attach_backward_probe", "begin_step",
    "close_phase", "end_step", "open_phase", "stamp",
]


def stamp(run: Run) -> int:
    """A phase-boundary timestamp, synchronizing the device first when the run says so."""
    return run.timestamp_ns()


def begin_step(run: Run, index: int | None, loader: str | None, start_ns: int | None = None
               ) -> Step:
    """Start a step; ``start_ns`` backdates it to an event already timed (e.g. a fetch)."""
    return run.step(loader=loader, index=index, start_ns=start_ns)


def open_phase(step: Step, name: str, kind: str, start_ns: int, loader: str | None = None,
               attrs: dict[str, Any] | None = None) -> None:
    """Open a phase at ``start_ns`` inside the innermost open one."""
    step.open_phase(name, kind, start_ns, loader, attrs)


def close_phase(step: Step, end_ns: int, error: BaseException | None = None) -> None:
    """Close the innermost open phase at ``end_ns``."""
    step.close_phase(end_ns, error)


def add_phase(step: Step, name: str, kind: str, start_ns: int, end_ns: int,
              loader: str | None = None, attrs: dict[str, Any] | None = None) -> None:
    """Record a finished phase inside the innermost open one."""
    step.record_phase(name, start_ns, end_ns, kind, loader, attrs)


def end_step(step: Step, error: BaseException | None = None) -> None:
    """End the step now (phases still open end with it)."""
    step.__exit__(None if error is None else type(error), error, None)


# -- backward: start and end, exactly, for two hook calls per backward -------------------------

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
