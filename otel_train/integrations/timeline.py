"""The backward pass's exact start and end, for integrations that see it only through hooks.

Hooks and callbacks learn phase boundaries as separate events, so the integrations record
phases with the core's timestamped API (``Step.open_phase`` / ``close_phase`` /
``record_phase``, ``Run.step(start_ns=)``, ``Run.timestamp_ns()``). What the core cannot give
them is where backward starts and ends: :func:`attach_backward_probe` finds both with two
Python calls per backward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.autograd import Variable

__all__ = ["attach_backward_probe"]


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
