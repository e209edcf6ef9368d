"""The ``train.startup`` span record: from the process's start to the first step's start.

Built once, off the hot path, by the span worker when it meets the run's first step
(``pipeline/span_worker.py``), and handed on with that step's record: it goes wherever steps
go (exporter process, in-process export, the derived metrics). Its children are the parts
that can be told apart without asking the user:

- ``before_start_run``: process start -> ``start_run`` called (interpreter, imports, whatever
  the script built before it: often the model);
- ``start_run``: otel-train's own set-up;
- ``to_first_step``: ``start_run`` returned -> the first step's start (model build, compile,
  resuming from a checkpoint, ...; the first batch is the first step's ``data`` phase).

The span is made with the option ``startup_span`` on; a resumed run's first step carries
``train.attempt`` and the restart's attributes either way. When the process's start cannot be
read (``common/process_start.py``), or this is not the process's first run, the span starts at
``start_run`` (``train.startup.from``: ``start_run``) and has no ``before_start_run`` child. Its kind is ``envelope``: neither training nor
monitoring, the derived metrics count it in the job envelope only (``derived/goodput.py``).

Usage::

    maker = StartupRecordMaker(process_start_epoch_ns, "process", start_run_ns, offset_ns,
                               {"train.attempt": 1})
    rec = maker.record(first_step.start_ns, ready_ns)   # perf_counter_ns -> a span record
"""

from __future__ import annotations

import random
from typing import Any

from otel_train.common import attributes as A
from otel_train.common.trace_ids import SAMPLED, new_span_id

STARTUP_PHASE = "startup"


class StartupRecordMaker:
    """Makes the one ``train.startup`` record of a run, at its first step."""

    def __init__(self, start_epoch_ns: int, source: str, start_run_ns: int, offset_ns: int,
                 attributes: dict[str, Any] | None = None, emit_span: bool = True) -> None:
        self.emit_span = emit_span  # option startup_span
        self.start_epoch_ns = start_epoch_ns
        self.source = source
        self.offset_ns = offset_ns  # perf_counter_ns -> epoch ns (the step builder's)
        self.start_run_epoch_ns = start_run_ns + offset_ns
        self.attributes = dict(attributes or {})
        self.trace_id = random.getrandbits(128) or 1
        self.span_id = new_span_id()
        self.done = False
        # A resumed run's first step carries the restart too (the span is optional).
        self.first_step_attributes = {k: v for k, v in self.attributes.items()
                                      if int(self.attributes.get(A.ATTEMPT, 1)) > 1}

    def record(self, first_step_start_ns: int, ready_ns: int | None) -> tuple[Any, ...] | None:
        """The span record, ending where the first step started; ``ready_ns``: when
        ``start_run`` returned (both ``perf_counter_ns``). None with the span off."""
        self.done = True
        if not self.emit_span:
            return None
        end = first_step_start_ns + self.offset_ns
        start = min(self.start_epoch_ns, end)
        run_start = min(max(self.start_run_epoch_ns, start), end)
        ready = run_start if ready_ns is None else ready_ns + self.offset_ns
        ready = min(max(ready, run_start), end)
        cuts = [("before_start_run", start, run_start), ("start_run", run_start, ready),
                ("to_first_step", ready, end)]
        phases = []
        for name, ph_start, ph_end in cuts:
            if name == "before_start_run" and self.source != "process":
                continue
            phases.append((name, A.KIND_ENVELOPE, None, ph_end - ph_start, len(phases) + 1,
                           self.span_id, ph_start, ph_end, None, None, None, None))
        attrs: dict[str, Any] = {A.STEP: -1, A.PHASE: STARTUP_PHASE,
                                 A.PHASE_KIND: A.KIND_ENVELOPE, A.STARTUP_FROM: self.source}
        attrs.update(self.attributes)
        return (A.STARTUP_SPAN_NAME, self.trace_id, self.span_id, int(SAMPLED), start, end,
                attrs, None, None, phases, None)


def startup_maker(envelope: dict[str, Any], start_run_ns: int, offset_ns: int,
                  emit_span: bool = True) -> StartupRecordMaker:
    """The maker for a run's envelope settings (``derived/goodput.envelope_settings``)."""
    attrs: dict[str, Any] = {A.ATTEMPT: int(envelope.get("attempt", 1))}
    previous = envelope.get("previous_startup_trace_id")
    if int(envelope.get("attempt", 1)) > 1:
        attrs[A.RESTART_LOST_SECONDS] = float(envelope.get("restart_lost_seconds") or 0.0)
        if previous:
            attrs[A.RESTART_PREVIOUS_ATTEMPT] = str(previous)
    return StartupRecordMaker(int(envelope["job_start_epoch_ns"]),
                              str(envelope.get("start_from") or "start_run"), start_run_ns,
                              offset_ns, attrs, emit_span)
