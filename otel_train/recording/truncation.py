"""Steps cut off: the step still open when the run ends is ended now and marked so.

A step (and the phases open in it) that a shutdown, a signal or an escaping exception ends
is exported with ``train.truncated = True`` and ``train.truncated.reason``: its start is
the real one, its end the instant it was cut. The mark is two root attributes on the step;
the record builder (records/step_records.py) copies it onto every phase still open at the
cut. Nothing here runs on the hot path: only on the ways a run ends, including the copy of
the recorder a fork leaves in the child, which records nothing.

Usage::

    cut_open_step(recorder, "sigterm", error)      # the step in progress, if any
    release_held_cut(recorder, "exception", exc)   # the step a loop left as it unwound
    inert_after_fork(recorder)                     # in a forked child
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from otel_train.common import attributes as A
from otel_train.common.drop_counter import DropCounter

if TYPE_CHECKING:
    from otel_train.recording.recorder import Recorder


def mark_truncated(step: Any, reason: str) -> None:
    """Mark ``step`` as cut off by ``reason`` (kept if already marked)."""
    attrs = step.attrs
    if attrs is None:
        attrs = step.attrs = {}
    if A.TRUNCATED not in attrs:
        attrs[A.TRUNCATED] = True
        attrs[A.TRUNCATED_REASON] = reason


def cut_open_step(recorder: Recorder, reason: str, error: BaseException | None = None) -> bool:
    """End the step in progress now, marked cut off by ``reason``; True if one was open."""
    step = recorder.current
    if step is None or step.end_ns:
        return False
    mark_truncated(step, reason)
    recorder.finish_step(step, error)
    return True


def release_held_cut(recorder: Recorder, reason: str, error: BaseException | None) -> None:
    """Submit the held step (a loop left it as it unwound); with ``error`` it was cut off."""
    held = recorder.held
    if held is not None and error is not None:
        mark_truncated(held, reason)
    recorder.release_held(error)


def reason_of(error: BaseException | None, default: str) -> str:
    """The reason an exception cut a step: ``sigint`` for Ctrl-C, else ``exception``."""
    if error is None:
        return default
    if isinstance(error, KeyboardInterrupt):
        return A.TRUNCATED_SIGINT
    return A.TRUNCATED_EXCEPTION


def inert_after_fork(rec: Recorder) -> None:
    """In a forked child: this copy of the recorder records nothing and never takes a lock
    it inherited (a background thread of the parent may have held it at the fork)."""
    rec.closed = True
    rec.queue = deque(maxlen=0)  # the parent exports its steps
    rec.ring = None  # nor writes into the parent's step ring, shared memory it maps too
    rec.drops = DropCounter()  # fresh: the inherited lock may be held by a lost thread
    rec.held = None
    rec._held_lock = threading.RLock()
