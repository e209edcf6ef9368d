"""What building steps' span records a batch at a time reads once, not once a step.

``StepRecordBuilder.step_records`` (step_records.py) builds the step ring's steps a run at a
time in the exporter process. Two things it would otherwise work out per step:

- :func:`step_trace_ids`: ``identity.step_trace_id`` for one run, the hash of the run id's
  part made once (:func:`step_trace_head`) and copied for each step, here and in C
  (``flat_step_records``);
- :func:`may_carry_rare_fields`: whether a step's class can hold the stall watchdog's or the
  governing schedule's events at all (the ring's ``RingStep`` cannot: slots alone), read
  once per class rather than two failed attribute lookups a step;
- :func:`always_sampled`: the sampler of a builder whose every step is sampled (the exporter
  process's, where the tail sampler decides later): ``flat_step_records`` then marks each
  step sampled without a call a step.

Usage::

    trace_id_of = step_trace_ids(identity.run_id)
    trace_id_of(12) == step_trace_id(identity.run_id, 12)
    may_carry_rare_fields(RingStep)   # False
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from otel_train.common.identity import step_trace_id

__all__ = ["always_sampled", "may_carry_rare_fields", "step_trace_head", "step_trace_ids"]


def step_trace_head(run_id: str) -> Any:
    """hashlib's blake2b fed the run id's part of ``identity.step_trace_id``'s input, to be
    copied and fed each step's index; None where the run id cannot be encoded (then
    step_trace_id raises for each step, as it would)."""
    try:
        return hashlib.blake2b(f"{run_id}\x00".encode(), digest_size=16)
    except UnicodeEncodeError:
        return None


def step_trace_ids(run_id: str) -> Callable[[int], int]:
    """``identity.step_trace_id(run_id, step)`` for one run, for less CPU a step: the hash
    of the run id's part is computed once and copied for each step (``step_trace_head``,
    which ``flat_step_records`` copies in C)."""
    head = step_trace_head(run_id)
    if head is None:
        return lambda step: step_trace_id(run_id, step)
    copy, from_bytes = head.copy, int.from_bytes

    def trace_id_of(step: int) -> int:
        if type(step) is not int:  # what step_trace_id's f-string writes, for any other
            return step_trace_id(run_id, step)
        digest = copy()
        digest.update(b"%d" % step)
        return from_bytes(digest.digest(), "big") or 1  # 0 is the invalid trace id
    return trace_id_of


def may_carry_rare_fields(kind: type) -> bool:
    """Whether a step of class ``kind`` can hold the watchdog's or the schedule's events
    (``stall_events``, ``governing_events``): a class with neither, whose instances take no
    new attribute (slots alone, as the step ring's ``RingStep``), cannot."""
    return (hasattr(kind, "stall_events") or hasattr(kind, "governing_events")
            or kind.__dictoffset__ != 0)  # type: ignore[attr-defined]


def always_sampled(trace_id: int) -> bool:
    """Every trace is sampled (a builder given this is not asked step by step)."""
    return True
