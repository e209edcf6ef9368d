"""Trace and span ids, and the sampled flag, in one place.

Step N of a run has a derived trace id (``identity.step_trace_id``: every rank agrees without
talking); a monitoring operation between steps gets a random one, drawn once, by whoever asks
first (a user span nested in it, or the span builder).
"""

from __future__ import annotations

import random
from typing import Any

from opentelemetry.trace import TraceFlags

SAMPLED = TraceFlags(TraceFlags.SAMPLED)
NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)


def new_span_id() -> int:
    """A random non-zero 64-bit span id."""
    return random.getrandbits(64) or 1


def operation_ids(record: Any) -> tuple[int, int]:
    """(trace id, span id) of a ``MonitorRecord``, drawn on first use and kept on it."""
    if not record.trace_id:
        record.trace_id = random.getrandbits(128) or 1
    if not record.span_id:
        record.span_id = new_span_id()
    return record.trace_id, record.span_id
