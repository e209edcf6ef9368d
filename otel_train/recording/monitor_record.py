"""Monitoring work done outside any step (``run.monitor``): one root span of its own.

A ``MonitorRecord`` times one operation between steps (a final evaluation, a checkpoint)
and goes to the same queue as the steps when it ends; its span nests nothing but the user
spans opened inside it.

Usage::

    with run.monitor("final_eval") as op:   # returns a MonitorRecord
        op.set_attribute("eval.examples", 100)
        evaluate()
"""

from __future__ import annotations

from time import perf_counter_ns
from typing import Any

from otel_train.common.attributes import (
    CHECKPOINT_ACTION,
    CHECKPOINT_OPERATION,
    CHECKPOINT_SPAN_NAME,
)
from otel_train.recording.call_checks import bad_key_error

CHECKPOINT_ACTIONS = ("save", "load")


class MonitorRecord:
    """Monitoring work done outside any step (``run.monitor``): one root span."""

    span_name: str | None = None  # the span's name when not the operation's (checkpoints)

    __slots__ = ("name", "after_step", "start_ns", "end_ns", "error", "attrs", "trace_id",
                 "span_id", "_recorder", "queued_wait_ns")

    def __init__(self, recorder: Any, name: str) -> None:
        self.name = name
        self.after_step = recorder.next_index - 1
        self.error: BaseException | None = None
        self.attrs: dict[str, Any] | None = None
        self.start_ns = 0
        self.end_ns = 0
        self.trace_id = 0  # drawn when a user span inside asks for it, else when built
        self.span_id = 0
        self.queued_wait_ns: int | None = None  # monitor_sync: the wait before it started
        # The run's Recorder (recorder.py imports this module, so it is not named here).
        self._recorder = recorder

    def start(self, start_ns: int | None = None) -> MonitorRecord:
        """Start timing, at ``start_ns`` (``perf_counter_ns``) if the start was seen earlier."""
        # A run event: the step held since a loop was left goes first, in step order.
        self._recorder.release_held()
        rec = self._recorder
        sync = rec.synchronize or rec.monitor_synchronize
        if sync is not None:
            # explicit (device_sync sync or monitor_sync): the work queued before this
            # operation finishes first, so only its own device work is timed here.
            waited = sync()
            if rec.synchronize is None and type(waited) is int:
                self.queued_wait_ns = waited  # monitor_sync: the work queued before it
            now = perf_counter_ns()
            # A start seen earlier (an integration's callback) moves to after the wait: that
            # wait was the earlier work's, not this operation's.
            start_ns = now if start_ns is None else max(start_ns, now)
        elif start_ns is None:
            start_ns = perf_counter_ns()
        self.start_ns = start_ns
        self._recorder.open_record = self
        return self

    def end(self, end_ns: int | None = None, error: BaseException | None = None) -> None:
        """Stop timing (at ``end_ns`` if given) and hand the span to the background."""
        if self.end_ns:
            return
        rec = self._recorder
        sync = rec.synchronize or rec.monitor_synchronize
        if sync is not None:
            # explicit (device_sync sync or monitor_sync): this operation's device work
            # counts in this operation, even when its end was seen earlier by a callback.
            sync()
            now = perf_counter_ns()
            end_ns = now if end_ns is None else max(end_ns, now)
        elif end_ns is None:
            end_ns = perf_counter_ns()
        self.end_ns = end_ns
        self.error = error
        if rec.open_record is self:
            rec.open_record = None
        rec.submit(self)

    def __enter__(self) -> MonitorRecord:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self.end(error=exc)
        return False

    def set_attribute(self, key: str, value: Any) -> None:
        """Set an attribute on this operation's span."""
        if type(key) is not str or not key:
            raise bad_key_error(key)
        if self.attrs is None:
            self.attrs = {}
        self.attrs[key] = self._recorder.keep_value(value)

    def span_count(self) -> int:
        """One span."""
        return 1


class CheckpointRecord(MonitorRecord):
    """A checkpoint save or load between steps (``run.checkpoint``, ``run.monitor("checkpoint")``):
    span ``train.checkpoint``, operation ``checkpoint``, attribute ``train.checkpoint.action``.

    It counts as the operation ``checkpoint`` in the monitoring costs, as ``run.monitor``
    always did, and as checkpoint time in the job envelope (``derived/goodput.py``).
    """

    __slots__ = ()
    span_name = CHECKPOINT_SPAN_NAME

    def __init__(self, recorder: Any, action: str = "save") -> None:
        if action not in CHECKPOINT_ACTIONS:
            raise ValueError(f"run.checkpoint(action={action!r}): action must be one of "
                             f"{', '.join(CHECKPOINT_ACTIONS)}")
        super().__init__(recorder, CHECKPOINT_OPERATION)
        self.attrs = {CHECKPOINT_ACTION: action}
