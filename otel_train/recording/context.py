"""User spans nest under the active phase, at no per-phase cost.

One ``ActivePhaseSpan`` is attached to the OpenTelemetry context once, when the run starts.
It is a non-recording span whose ``SpanContext`` is resolved only when someone asks for it
(a user's ``tracer.start_as_current_span(...)`` inside a phase): then the active phase of
the current step gets its span id drawn (once) and the user's span becomes its child.
Between steps it resolves to a running ``run.monitor(...)`` operation, if any; otherwise it
reports an invalid context, so user spans start their own traces.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    NonRecordingSpan,
    SpanContext,
)

from otel_train.common.identity import step_trace_id
from otel_train.common.trace_ids import NOT_SAMPLED, SAMPLED, operation_ids

if TYPE_CHECKING:
    from collections.abc import Callable

    from otel_train.recording.recorder import Recorder


class ActivePhaseSpan(NonRecordingSpan):
    """A stand-in parent that resolves to the active phase (or step) when asked."""

    def __init__(
        self,
        recorder: Recorder,
        run_id: str,
        new_span_id: Callable[[], int],
        is_sampled: Callable[[int], bool],
    ) -> None:
        super().__init__(INVALID_SPAN_CONTEXT)
        self._recorder = recorder
        self._run_id = run_id
        self._new_span_id = new_span_id
        self._is_sampled = is_sampled

    def get_span_context(self) -> SpanContext:
        """The active phase's context, drawing its span id now if nobody asked before."""
        rec = self._recorder
        step = rec.current
        if step is None or step.end_ns:
            record = rec.open_record  # run.monitor() between steps: nest under it
            if record is None or record.end_ns:
                return INVALID_SPAN_CONTEXT
            trace_id, span_id = operation_ids(record)
            flags = SAMPLED if self._is_sampled(trace_id) else NOT_SAMPLED
            return SpanContext(trace_id, span_id, False, flags)
        if not step.trace_id:
            step.trace_id = step_trace_id(self._run_id, step.index)
        ordinal = step._active_span_ordinal()  # -1: no phase open, the root
        ids = step.span_ids
        if ids is None:
            ids = step.span_ids = {}
        span_id = ids.get(ordinal)
        if not span_id:
            span_id = ids[ordinal] = self._new_span_id()
        flags = SAMPLED if self._is_sampled(step.trace_id) else NOT_SAMPLED
        return SpanContext(step.trace_id, span_id, False, flags)

    def is_recording(self) -> bool:
        """Never recording: the real spans are built in the background."""
        return False

    def __repr__(self) -> str:
        return "ActivePhaseSpan()"
