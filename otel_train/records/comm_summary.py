"""A step's collectives (``recording/collectives.py`` entries) as root attributes and events.

Root attributes: ``train.comm.count``, ``train.comm.bytes``, ``train.comm.seconds`` (summed
issue-to-completion time: overlapped buckets count in full, so it can exceed the step) and
``train.comm.exposed_seconds``, the time the step waited for communication:

- overlapped entries (DDP buckets): from when the last bucket was handed to the process group
  to the next phase boundary the training thread recorded (usually the end of ``backward``,
  which DDP does not let end before every bucket completed). The last bucket becomes ready when autograd has computed
  the last gradients, so its hand-over stands for "backward's compute ended"; what follows is
  the wait DDP's ``finalize_backward`` does before ``backward()`` returns, and the time the
  thread took to resume after the completion (on a busy machine, milliseconds). Work done
  after ``backward()`` inside the same phase counts as waiting. On a GPU both stamps are host
  times (see docs/telemetry.md, "Communication per step").
- blocking entries (a blocking ``dist.*`` call): their whole duration.
- async entries (``async_op=True``): none; the caller's ``work.wait()`` is not timed.

One span event ``train.comm`` per op (not per collective: a large DDP model hands over
hundreds of buckets a step, each a span or event would cost its encoding), at the op's first
hand-over, with the op's count, bytes and seconds; the metrics per op read these.

Usage::

    attrs, events = comm_summary(log.take(step.start_ns, step.end_ns), step.end_ns, offset_ns,
                                 phase_boundaries_ns)
"""

from __future__ import annotations

from collections.abc import Iterable
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


def comm_summary(entries: list[list], step_end_ns: int, offset_ns: int,
                 boundaries_ns: Iterable[int] = ()
                 ) -> tuple[dict[str, Any], tuple[tuple[str, int, dict[str, Any]], ...]]:
    """Root attributes and ``train.comm`` events (row form) of a step's entries;
    ``boundaries_ns``: the step's phase starts and ends (perf counter ns)."""
    if not entries:
        return {}, ()
    # DDP waits for every bucket before backward() returns, so the training thread resumed at
    # the first boundary it recorded after the last hand-over (backward's end). A bucket's
    # done-callback may stamp later than that: torch wakes the waiting thread before it runs
    # the callbacks, so a completion is never taken as later than the resumption.
    handovers = [e[E_START] for e in entries if e[E_KIND] == KIND_OVERLAPPED]
    resumed = waited_ns = 0
    if handovers:
        last_handover = max(handovers)
        resumed = min((t for t in boundaries_ns if t > last_handover), default=step_end_ns)
        waited_ns = resumed - last_handover
    per_op: dict[str, list[Any]] = {}  # op -> [count, bytes, seconds, first start]
    total_ns = nbytes = 0
    for entry in entries:
        start, kind = entry[E_START], entry[E_KIND]
        # Still running when the step was built (an async call nobody waited for): up to
        # the step's end.
        end = entry[E_END] or max(start, step_end_ns)
        if kind == KIND_OVERLAPPED:
            end = min(end, resumed)
        took = max(0, end - start)
        total_ns += took
        nbytes += entry[E_BYTES]
        if kind == KIND_BLOCKING:
            waited_ns += took
        agg = per_op.get(entry[E_OP])
        if agg is None:
            per_op[entry[E_OP]] = [1, entry[E_BYTES], took, start]
        else:
            agg[0] += 1
            agg[1] += entry[E_BYTES]
            agg[2] += took
    attrs = {A.COMM_COUNT: len(entries), A.COMM_BYTES: nbytes, A.COMM_SECONDS: total_ns / 1e9,
             A.COMM_EXPOSED_SECONDS: waited_ns / 1e9}
    events = tuple(
        (A.COMM_EVENT, first + offset_ns, {A.COMM_OP: op, A.COMM_COUNT: count,
                                           A.COMM_BYTES: size, A.COMM_SECONDS: ns / 1e9})
        for op, (count, size, ns, first) in per_op.items())
    return attrs, events
