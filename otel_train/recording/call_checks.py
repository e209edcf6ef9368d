"""What the hot path's API refuses at the call, and what it keeps of a value.

Misuse (a phase outside a step, nested steps, a phase on an ended step, a bad attribute
key, ``run.steps`` over something not iterable or with a bad ``max_steps``) raises here, at
the call, where the user can fix it: in the background it could only be dropped with a
warning. Both twins of the hot path (the C accelerator and
``pure_twin.py``) raise the same errors.
"""

from __future__ import annotations

from typing import Any


def outside_step_error(name: str) -> RuntimeError:
    """The error of phase ``name`` opened while no step runs."""
    return RuntimeError(
        f"phase {name!r} opened outside a step: open phases inside "
        "`for step in run.steps(...)` or `with run.step() as step:`")


def nested_step_error(step: Any) -> RuntimeError:
    """The error of a step started while ``step`` is still in progress."""
    return RuntimeError(
        f"step {step.index} is still in progress: steps do not nest (end it first)")


def ended_step_error(step: Any, name: str) -> RuntimeError:
    """The error of phase ``name`` opened on ``step`` after it ended."""
    return RuntimeError(
        f"phase {name!r} opened on step {step.index}, which has already ended; "
        "open phases inside the step's loop body, and time work after the loop (a final "
        f"eval) with run.monitor({name!r}) instead")


def bad_key_error(key: Any) -> ValueError:
    """The error of an attribute key that is not a non-empty string."""
    return ValueError(f"set_attribute: the key must be a non-empty string, got {key!r}")


def detached(value: Any) -> Any:
    """``value``, or a detached reference to it for a tensor (no graph, no device sync)."""
    # The background reads the tensor's value: reading it here would wait for the device.
    detach = getattr(value, "detach", None)
    return detach() if detach is not None else value


def check_iterable(iterable: Any) -> None:
    """Refuse at ``run.steps()`` what ``iter()`` would refuse in the first step's fetch."""
    kind = type(iterable)
    if not (hasattr(kind, "__iter__") or hasattr(kind, "__getitem__")):
        raise TypeError(f"run.steps(): {kind.__name__!r} object is not iterable")


def check_max_steps(max_steps: Any) -> int | None:
    """``max_steps`` as given to ``run.steps``: a positive int, or None for no limit."""
    if max_steps is None:
        return None
    if isinstance(max_steps, bool) or not hasattr(type(max_steps), "__index__"):
        raise ValueError(f"max_steps must be a positive int or None, got {max_steps!r}")
    count = int(max_steps.__index__())
    if count < 1:
        raise ValueError(f"max_steps must be a positive int or None, got {max_steps!r}")
    return count
