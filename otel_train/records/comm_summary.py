"""A step's collectives (``recording/collectives.py`` entries) as root attributes and events.

Root attributes: ``train.comm.count``, ``train.comm.bytes``, ``train.comm.seconds`` (summed
issue-to-completion time: overlapped buckets count in full, so it can exceed the step) and
``train.comm.exposed_seconds``, the time the step waited for communication:

- overlapped entries (DDP buckets): from when the last bucket was handed to the process group
  to when the last one completed. The last bucket becomes ready when autograd has computed
  the last gradients, so its hand-over stands for "backward's compute ended"; what follows is
  the wait DDP's ``finalize_backward`` does before ``backward()`` returns. On CPU (gloo) this
  is exact up to the hook's own cost; on a GPU the hand-over is the host's enqueue time, not
  the kernel's end (see docs/telemetry.md, "Communication").
- blocking entries (a blocking ``dist.*`` call): their whole duration.
- async entries (``async_op=True``): none; the caller's ``work.wait()`` is not timed.

One span event ``train.comm`` per op (not per collective: a large DDP model hands over
hundreds of buckets a step, each a span or event would cost its encoding), at the op's first
hand-over, with the op's count, bytes and seconds; the metrics per op read these.

Usage::

    attrs, events = comm_summary(log.take(step.start_ns, step.end_ns), step.end_ns, offset_ns)
"""

from __future__ import annotations

from typing import Any

from otel_train.common import attributes as A
from otel_train.recording.collectives import (
    E_BYTES,
    E_END,
    E_KIND,
    E_OP,
    E_START,
    KIND_BLOCKING,
    KIND_OVERLAPPED,
)


def comm_summary(entries: list[list], step_end_ns: int, offset_ns: int
                 ) -> tuple[dict[str, Any], tuple[tuple[str, int, dict[str, Any]], ...]]:
    """Root attributes and ``train.comm`` events (row form) of a step's entries."""
    if not entries:
        return {}, ()
    per_op: dict[str, list[Any]] = {}  # op -> [count, bytes, seconds, first start]
    total_ns = nbytes = 0
    blocking_ns = 0
    last_handover = last_done = 0
    for entry in entries:
        start = entry[E_START]
        # Still running when the step was built (an async call nobody waited for): up to
        # the step's end.
        end = entry[E_END] or max(start, step_end_ns)
        took = max(0, end - start)
        total_ns += took
        nbytes += entry[E_BYTES]
        kind = entry[E_KIND]
        if kind == KIND_OVERLAPPED:
            last_handover = max(last_handover, start)
            last_done = max(last_done, end)
        elif kind == KIND_BLOCKING:
            blocking_ns += took
        agg = per_op.get(entry[E_OP])
        if agg is None:
            per_op[entry[E_OP]] = [1, entry[E_BYTES], took, start]
        else:
            agg[0] += 1
            agg[1] += entry[E_BYTES]
            agg[2] += took
    exposed_ns = blocking_ns + max(0, last_done - last_handover)
    attrs = {A.COMM_COUNT: len(entries), A.COMM_BYTES: nbytes, A.COMM_SECONDS: total_ns / 1e9,
             A.COMM_EXPOSED_SECONDS: exposed_ns / 1e9}
    events = tuple(
        (A.COMM_EVENT, first + offset_ns, {A.COMM_OP: op, A.COMM_COUNT: count,
                                           A.COMM_BYTES: size, A.COMM_SECONDS: ns / 1e9})
        for op, (count, size, ns, first) in per_op.items())
    return attrs, events
