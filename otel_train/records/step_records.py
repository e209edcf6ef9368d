"""Step records become span records (``records/span_rows.py``), the one currency of spans.

Off the hot path, each finished ``Step`` or ``MonitorRecord`` becomes one span record: the
root ``train.step`` span's fields and one row per phase, with the contract's attributes, device
timings resolved and user attribute values made plain. Span ids of phases are drawn where the
record is turned into rows or bytes (``span_rows.rows_from_record``).
"""

from __future__ import annotations

import logging
import random
import traceback
from collections.abc import Callable, Sequence
from time import perf_counter_ns, time_ns
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import StatusCode

from otel_train.common import attributes as A
from otel_train.common.drop_counter import DropCounter
from otel_train.common.identity import RunIdentity
from otel_train.common.trace_ids import SAMPLED as _SAMPLED
from otel_train.common.trace_ids import operation_ids
from otel_train.recording.recorder import (
    FLAT_PHASE_ROWS,
    FLAT_STEP_RECORD,
    MonitorRecord,
    _recorder_c,
    Step,
    decode_events,
    flat_events,
)
from otel_train.recording.collectives import CollectiveLog
from otel_train.recording.step_ring_reader import RingStep
from otel_train.recording.device import TIMING_EVENTS, TIMING_HOST, TIMING_SYNC
from otel_train.records.attribute_values import AttributeLimits, plain_attributes
from otel_train.records.device_readings import (
    BOUND_INPUT_SHARE,
    HostRss,
    device_readings,
    device_verdict,
    label_step,
)
from otel_train.records.comm_summary import comm_summary
from otel_train.records.step_batch import always_sampled, may_carry_rare_fields
from otel_train.records.step_batch import step_trace_head, step_trace_ids
from otel_train.records.span_rows import (
    C_ATTRS,
    C_END,
    C_PHASES,
    C_ROOT_ID,
    C_START,
    P_DEVICE_SECONDS,
    P_END,
    P_EXTRA,
    P_KIND,
    P_START,
    RowSpanFactory,
    draw_span_ids,
)

_log = logging.getLogger("otel_train")
_SAMPLED_FLAGS = int(_SAMPLED)
_getrandbits = random.getrandbits
# Contract names bound once: the builder runs for every step.
_STEP, _STEP_SPAN_NAME = A.STEP, A.STEP_SPAN_NAME
_DATALOADER, _SLOW, _MONITOR = A.DATALOADER, A.SLOW, A.KIND_MONITOR
_DATA = A.PHASE_DATA
_TRUNCATED, _TRUNCATED_REASON = A.TRUNCATED, A.TRUNCATED_REASON
_COMM = A.COMM_EXPOSED


# ``train.device.synced`` and ``train.device.timing`` of a span whose timing is its own
# (device_sync events and monitor_sync): shared dicts, never changed.
_SPAN_HOST = {A.DEVICE_SYNCED: False, A.DEVICE_TIMING: TIMING_HOST}
_SPAN_EVENTS = {A.DEVICE_SYNCED: False, A.DEVICE_TIMING: TIMING_EVENTS}
_SPAN_SYNC = {A.DEVICE_SYNCED: True, A.DEVICE_TIMING: TIMING_SYNC}


def run_constant_attributes(identity: RunIdentity, device_synced: bool,
                            device_type: str, span_timing: str | None = TIMING_HOST
                            ) -> dict[str, Any]:
    """The attributes every span of the run carries, in the order they are written.

    ``span_timing`` is ``train.device.timing`` when every span has the same one; None when
    each span carries its own, with its ``train.device.synced`` (``DeviceTiming.span_timing``).
    """
    constants: dict[str, Any] = {
        A.RUN_ID: identity.run_id,
        A.RANK: identity.rank,
        A.WORLD_SIZE: identity.world_size,
    }
    if span_timing is not None:
        constants[A.DEVICE_SYNCED] = device_synced
        constants[A.DEVICE_TIMING] = span_timing
    constants[A.DEVICE_TYPE] = device_type
    return constants


class StepRecordBuilder:
    """Turns the recorder's steps and monitoring operations into span records (span_rows.py)
    that follow the telemetry contract."""

    def __init__(
        self,
        identity: RunIdentity,
        resource: Resource,
        scope: InstrumentationScope,
        device_synced: bool,
        device_type: str,
        is_sampled: Callable[[int], bool],
        epoch_offset_ns: int,
        span_timing: str | None = TIMING_HOST,
        host_rss_every_steps: int = 0,
    ) -> None:
        self._identity = identity
        # None: each span says its own timing (device_sync events / monitor_sync): ``sync``
        # for the monitoring spans a synchronize opened (the recorder notes each one's wait),
        # ``events`` for phases with device time, else ``host``.
        self._own_timing = span_timing is None
        # Device tensors given to set_attribute that never reached the host in time, by
        # reason (shown under ``dropped_attributes`` in run.costs() / monitoring_costs.json).
        self.attribute_drops = DropCounter()
        self.is_sampled = is_sampled
        self._offset = epoch_offset_ns
        # OTEL_*ATTRIBUTE_* limits, read once (the SDK reads them when its provider is made).
        self._limits = AttributeLimits.from_env()
        self._base = run_constant_attributes(identity, device_synced, device_type, span_timing)
        # Rows leave the run constants out; the encoders and the row factory put them first
        # in every span's attributes, the encoders as one cached block. The attribute count
        # limit counts them.
        self._room = self._limits.count - len(self._base)
        self.run_constants = dict(self._base)
        self.factory = RowSpanFactory(resource, scope, self._base)
        self.rank = identity.rank
        # CPU's fallback for memory (memory_peaks): host RSS on every N-th step's root, read
        # here in the background when the step is built (0: never).
        self.host_rss_every_steps = host_rss_every_steps
        self.host_rss = HostRss()
        # The last sampled step's compute/host verdict: the steps after it take it over.
        self._device_bound: str | None = None
        # Timestamps of collectives (Run.collective_log): None until something times them.
        self.collectives: CollectiveLog | None = None
        self._trace_id_of = step_trace_ids(identity.run_id)
        self._rare_fields: dict[type, bool] = {}  # step_records: per step class
        # What flat_step_records copies and feeds each step's index (step_trace_id's hash).
        self._trace_head = step_trace_head(identity.run_id)

    @property
    def offset_ns(self) -> int:
        """What turns this builder's ``perf_counter_ns`` stamps into epoch nanoseconds."""
        return self._offset

    def take_device_verdict(self, rec: tuple[Any, ...]) -> None:
        """A step record another builder made (the training process's, for a step the ring
        could not carry): its device verdict carries over to the steps built here after it,
        as it does in the builder that made it."""
        verdict = device_verdict(rec[C_ATTRS], rec[C_PHASES], rec[C_END] - rec[C_START],
                                 rec[C_ROOT_ID])
        if verdict is not None:
            self._device_bound = verdict

    def record(self, record: Step | MonitorRecord) -> tuple[Any, ...]:
        """The span record (span_rows.py) of one step or monitoring operation.

        Everything that needs this process is done here: the step's events decoded, the
        effective kind and loader of each phase, user attribute values made plain (tensors
        read), device timings resolved, exceptions formatted. Span ids of phases and their
        attribute dicts are left to :func:`span_rows.rows_from_record`, wherever it runs.
        """
        if isinstance(record, MonitorRecord):
            return self._monitor_record(record)
        return self._step_record(record)

    def step_records(self, steps: Sequence[Step],
                     failed: Callable[[Step, Exception], None]) -> list[tuple[Any, ...]]:
        """The span records of ``steps`` (no monitoring operations), in order: the records
        :meth:`record` makes of each, for less CPU a step (the step ring's reader builds its
        steps a batch at a time). The root span ids are drawn at once, the same ids as a draw
        a step (``span_rows.draw_span_ids``). Where the accelerator was built, runs of common
        flat steps (no attributes, no fields but the ring's) are built in one C call, their
        trace ids hashed there too (``flat_step_records``); any other step here, one at a
        time. A step that cannot be built is handed to ``failed`` and left out, the others
        go on."""
        steps = list(steps)
        kinds = set(map(type, steps))
        ids = draw_span_ids(len(steps) if kinds <= _RING_STEP_TYPES else sum(
            1 for s in steps if not (s.span_ids and s.span_ids.get(-1))))
        out: list[tuple[Any, ...]] = []
        flat = _flat_record
        # What sends every step of the run to the Python path (``_plain``), read once; a
        # step whose root reads the host's memory (every N-th) is sent there one by one.
        if self._own_timing or self.collectives:
            flat = None
        every = self.host_rss_every_steps
        many = _flat_records if flat is not None and self._trace_head is not None else None
        if many is not None and any(self._carries_rare(kind) for kind in kinds):
            many = None  # a class that may hold a stall's or a schedule's events: one by one
        k = used = 0
        n = len(steps)
        while k < n:
            if many is not None:
                j = many(steps, k, ids, self._trace_head, None if self.is_sampled is
                         always_sampled else self.is_sampled, self._offset,
                         self._device_bound, _STEP_SPAN_NAME, _FLAT_CONSTANTS, out, every,
                         used)
                used += j - k
                k = j
                if k >= n:
                    break
            step = steps[k]  # one the C did not build: here, with the next root id
            k += 1
            try:
                own = step.span_ids and step.span_ids.get(-1)
                if not own:
                    used += 1
                out.append(self._one_step_record(step, own or ids[used - 1], flat))
            except Exception as exc:
                failed(step, exc)
        return out

    def _carries_rare(self, kind: type) -> bool:
        carries = self._rare_fields.get(kind)
        if carries is None:
            carries = self._rare_fields[kind] = may_carry_rare_fields(kind)
        return carries

    def _one_step_record(self, step: Step, root_id: int, flat: Any) -> tuple[Any, ...]:
        """One step of ``step_records``: the flat step without attributes straight to C
        (``flat``: None where the run's conditions send every step to ``_step_record``)."""
        every = self.host_rss_every_steps
        if (flat is not None and step.error is None and not (
                step.dev or step.phase_attrs or step.queued_waits or step.span_ids
                or step.attrs or (every and step.index % every == 0))) and (
                not self._carries_rare(type(step)) or not (
                    getattr(step, "stall_events", None)
                    or getattr(step, "governing_events", None))):
            trace_id = step.trace_id or self._trace_id_of(step.index)
            rec = flat(step.ev, step.loader, step.index, step.start_ns, step.end_ns, trace_id,
                       _SAMPLED_FLAGS if self.is_sampled(trace_id) else 0, root_id,
                       self._offset, self._device_bound, _STEP_SPAN_NAME, _FLAT_CONSTANTS)
            if rec is not None:
                return rec  # type: ignore[no-any-return]
        return self._step_record(step, root_id)

    def _step_record(self, step: Step, root_id: int = 0) -> tuple[Any, ...]:
        trace_id = step.trace_id or self._trace_id_of(step.index)
        flags = _SAMPLED_FLAGS if self.is_sampled(trace_id) else 0
        ids = step.span_ids  # ids already handed to user spans (rare): keep them
        root_id = (ids and ids.get(-1)) or root_id or _getrandbits(64) or 1  # 0: drawn here
        off = self._offset
        if _flat_record is not None and not ids and self._plain(step):
            rec = self._flat_step(step, trace_id, flags, root_id)
            if rec is not None:
                return rec
        step_end = step.end_ns
        step_loader = step.loader
        phases = None if step.dev or step.phase_attrs or step.queued_waits else _flat_rows(
            step.ev, step_loader, root_id, off, _DATA)
        device_root = None
        synced: frozenset[int] = frozenset()  # a flat step synchronized none of its phases
        if phases is None:  # nested, failed, left open, with attributes or device readings
            phases, device_root, synced = self._phases(step, root_id)
        root_attrs: dict[str, Any] = {_STEP: step.index}
        if step_loader is not None:
            root_attrs[_DATALOADER] = step_loader
        root_attrs[_SLOW] = False  # the slow-step processor turns this on
        if device_root:
            root_attrs.update(device_root)
        if self._own_timing:
            root_attrs.update(_SPAN_EVENTS if device_root and (
                A.DEVICE_DURATION in device_root or A.DEVICE_BUSY in device_root)
                else _SPAN_HOST)
            phases = self._phase_timings(phases, synced)
        if self.host_rss_every_steps and step.index % self.host_rss_every_steps == 0:
            rss = self.host_rss.read_bytes()
            if rss is not None:
                root_attrs[A.HOST_RSS] = rss
        # Collectives first: the bound label reads the exposed communication time.
        log = self.collectives
        comm_events: tuple[Any, ...] = ()
        if log:  # None, or nothing timed since the last step: one check
            comm_attrs, comm_events = comm_summary(
                log.take(step.start_ns, step_end), step_end, off,
                [t - off for ph in phases for t in (ph[P_START], ph[P_END])])
            root_attrs.update(comm_attrs)
        verdict = label_step(root_attrs, phases, step_end - step.start_ns, root_id, step.attrs,
                             self._device_bound)
        if verdict is not None:
            self._device_bound = verdict
        if step.attrs:
            root_attrs.update(_plain_attributes(step.attrs, self._limits,
                                                self._room - len(root_attrs),
                                                self.attribute_drops))
        status, events = _status_and_events(step.error, step_end + off)
        if comm_events:
            events = events + comm_events
        stall = getattr(step, "stall_events", None)  # set by the stall watchdog, rarely
        if stall:
            events = events + tuple(stall)
        governing = getattr(step, "governing_events", None)  # an interval changed (schedule.py)
        if governing:
            events = events + tuple(governing)
        return (A.STEP_SPAN_NAME, trace_id, root_id, flags, step.start_ns + off, step_end + off,
                root_attrs, status, events, phases, ids or None)

    def _flat_step(self, step: Step, trace_id: int, flags: int, root_id: int
                   ) -> tuple[Any, ...] | None:
        """The common flat step's record, whole in C (``_plain`` said it applies); None when
        its events are not flat (the Python decoder builds it, with the same ids)."""
        rec = _flat_record(step.ev, step.loader, step.index, step.start_ns,  # type: ignore[misc]
                           step.end_ns, trace_id, flags, root_id, self._offset,
                           self._device_bound, A.STEP_SPAN_NAME, _FLAT_CONSTANTS)
        if rec is not None and step.attrs:
            root_attrs = rec[C_ATTRS]
            root_attrs.update(_plain_attributes(step.attrs, self._limits,
                                                self._room - len(root_attrs),
                                                self.attribute_drops))
        return rec

    def _plain(self, step: Step) -> bool:
        """The step needs nothing but its flat phases, root attributes and the host clock's
        bound (``flat_step_record`` builds it): no device readings, failure, rare field,
        own timing, memory reading, collectives, nor exposed communication time of its own.
        """
        every = self.host_rss_every_steps
        attrs = step.attrs
        return not (step.error is not None or step.dev or step.phase_attrs
                    or step.queued_waits or self._own_timing or self.collectives
                    or (every and step.index % every == 0)
                    or getattr(step, "stall_events", None)
                    or getattr(step, "governing_events", None)
                    or (attrs and _COMM in attrs))

    def _phases(self, step: Step, root_id: int
                ) -> tuple[list[tuple[Any, ...]], dict[str, Any] | None, frozenset[int]]:
        """The record's phases, the root's device attributes and the ordinals of the phases
        a synchronize opened (monitor_sync), of any step, decoded."""
        off, step_end, step_loader = self._offset, step.end_ns, step.loader
        phase_attrs = step.phase_attrs
        waits = step.queued_waits  # monitor_sync: the wait before each monitoring phase
        # A step cut off (recording/truncation.py): its phases still open carry the mark too.
        cut = step.attrs.get(_TRUNCATED_REASON) if step.attrs else None
        decoded = decode_events(step.ev)  # the one decoder of a step's event list
        device_extra, device_root, device_seconds = (
            device_readings(step, decoded) if step.dev else (None, None, None))
        limits, room = self._limits, self._room
        phases: list[tuple[Any, ...]] = []
        for ph in decoded:
            phase = ph.phase
            name = phase.name
            parent = ph.parent
            # Work nested in a monitoring phase is monitoring work (validation data).
            kind = _MONITOR if parent >= 0 and phases[parent][P_KIND] == _MONITOR else phase.kind
            # Only data spans carry a loader: a monitoring or compute phase reads none
            # itself (validation data inside val_loss is its own data span).
            loader = phase.loader or (step_loader if name == _DATA else None)
            start = ph.start_ns + off
            end = (ph.end_ns or step_end) + off  # a phase left open ends with its step
            status, events = _status_and_events(ph.error, end)
            device = device_seconds.get(ph.ordinal) if device_seconds else None
            extra = phase_attrs.get(ph.ordinal) if phase_attrs else None
            if waits and ph.start_pos in waits:
                extra = {A.DEVICE_QUEUED_WAIT: waits[ph.start_pos] / 1e9, **(extra or {})}
            if device_extra and ph.ordinal in device_extra:
                extra = {**device_extra[ph.ordinal], **(extra or {})}
            if cut is not None and not ph.end_ns:
                extra = {**(extra or {}), _TRUNCATED: True, _TRUNCATED_REASON: cut}
            if extra:
                extra = _plain_attributes(
                    extra, limits, room - 3 - (loader is not None) - (device is not None),
                    self.attribute_drops)
            # span_rows.py's phase layout; the first six are what StepView needs.
            phases.append((name, kind, loader, end - start, ph.ordinal + 1,
                           parent + 1 if parent >= 0 else root_id, start, end, status,
                           events, extra or None, device))
        synced = (frozenset(ph.ordinal for ph in decoded if ph.start_pos in waits) if waits
                  else frozenset())
        return phases, device_root, synced

    def host_timed(self, rec: tuple[Any, ...]) -> tuple[Any, ...]:
        """A record made elsewhere (``train.startup``), its spans marked host-timed when each
        span of the run says its own timing (the run constants say it otherwise)."""
        if not self._own_timing:
            return rec
        rec[C_ATTRS].update(_SPAN_HOST)
        phases = rec[C_PHASES]
        if not phases:
            return rec
        marked = [ph[:P_EXTRA] + ({**_SPAN_HOST, **ph[P_EXTRA]} if ph[P_EXTRA] else _SPAN_HOST,)
                  + ph[P_EXTRA + 1:] for ph in phases]
        return rec[:C_PHASES] + (marked,) + rec[C_PHASES + 1:]

    def _phase_timings(self, phases: list[tuple[Any, ...]], synced: frozenset[int]
                       ) -> list[tuple[Any, ...]]:
        """Each phase's ``train.device.synced`` / ``timing``, first among its own attributes.

        ``synced``: the ordinals of the phases a synchronize opened (monitor_sync's monitoring
        phases); a phase nested in one (validation data) is monitoring work but was not
        itself synchronized, nor was a phase recorded afterwards by its timestamps."""
        out = []
        for i, ph in enumerate(phases):
            timing = (_SPAN_SYNC if i in synced
                      else _SPAN_EVENTS if ph[P_DEVICE_SECONDS] is not None else _SPAN_HOST)
            extra = ph[P_EXTRA]
            out.append(ph[:P_EXTRA] + ({**timing, **extra} if extra else timing,
                                       ph[P_DEVICE_SECONDS]))
        return out

    def _monitor_record(self, rec: MonitorRecord) -> tuple[Any, ...]:
        trace_id, span_id = operation_ids(rec)
        flags = _SAMPLED_FLAGS if self.is_sampled(trace_id) else 0
        attrs: dict[str, Any] = {A.STEP: rec.after_step, A.PHASE: rec.name,
                                 A.PHASE_KIND: A.KIND_MONITOR}
        if self._own_timing:  # synchronized at its start (and end) with monitor_sync
            attrs.update(_SPAN_SYNC if rec.queued_wait_ns is not None else _SPAN_HOST)
        if rec.queued_wait_ns is not None:
            attrs[A.DEVICE_QUEUED_WAIT] = rec.queued_wait_ns / 1e9
        if rec.attrs:
            attrs.update(_plain_attributes(rec.attrs, self._limits, self._room - len(attrs),
                                           self.attribute_drops))
        off = self._offset
        status, events = _status_and_events(rec.error, rec.end_ns + off)
        return (rec.span_name or rec.name, trace_id, span_id, flags, rec.start_ns + off,
                rec.end_ns + off, attrs, status, events, None, None)


def _flat_phases(ev: list[Any], step_loader: str | None, root_id: int, off: int,
                 data_name: str = _DATA) -> list[tuple[Any, ...]] | None:
    """The record's phases of a flat step (recorder.flat_events), None for any other.

    Most steps are flat, and read by slices with no decoding, which is cheaper than the
    general decoder. The pure-Python twin of the C accelerator's ``flat_phase_rows``, which
    the builder calls where it was built (``_flat_rows``).
    """
    flat = flat_events(ev)
    if flat is None:
        return None
    phases = []
    ordinal = 0
    for phase, start, end in zip(*flat):
        ordinal += 1
        name = phase.name
        # As decoded: only data spans carry a loader; the kind is the phase's own.
        loader = phase.loader or (step_loader if name == data_name else None)
        phases.append((name, phase.kind, loader, end - start, ordinal, root_id, start + off,
                       end + off, None, (), None, None))
    return phases


# A flat step's whole record in C where the accelerator was built (``_step_record`` says
# when; its own code below is the twin): the phase rows and the root attributes with the host
# clock's ``train.step.bound`` (device_readings.label_step without device time).
_flat_record: Callable[..., tuple[Any, ...] | None] | None = FLAT_STEP_RECORD
# Runs of ring steps in one call, their trace ids hashed in C (``step_records``), where the
# accelerator was built: ``flat_step_record`` and ``step_trace_id`` are its twins.
_flat_records: Callable[..., int] | None = getattr(_recorder_c, "flat_step_records", None)
# The ring readers' step classes: a step of these never holds span ids of its own (none was
# handed to a user span), so a run of them draws a root id each.
_RING_STEP_TYPES = frozenset(t for t in (RingStep, getattr(_recorder_c, "RingStep", None))
                             if t is not None)
_FLAT_CONSTANTS = (_DATA, _STEP, _DATALOADER, _SLOW, A.STEP_BOUND, A.BOUND_INPUT,
                   A.BOUND_COMPUTE, BOUND_INPUT_SHARE)
# Most of a record's Python was its flat phase rows: in C where the accelerator was built
# (benchmarks/bench_processors.py measures both).
_flat_rows: Callable[..., list[tuple[Any, ...]] | None] = FLAT_PHASE_ROWS or _flat_phases


def _status_and_events(
    error: BaseException | None, at_ns: int
) -> tuple[tuple[int, str] | None, tuple[tuple[str, int, dict[str, Any]], ...]]:
    """A failed span's status and exception event, in row form (span_rows.py)."""
    if error is None:
        return None, ()
    stack = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    event = ("exception", at_ns, {
        "exception.type": type(error).__qualname__,
        "exception.message": str(error),
        "exception.stacktrace": stack,
        "exception.escaped": True,
    })
    return (StatusCode.ERROR.value, f"{type(error).__name__}: {error}"), (event,)


def _plain_attributes(attrs: dict[str, Any], limits: AttributeLimits | None = None,
                      room: int | None = None, drops: DropCounter | None = None
                      ) -> dict[str, Any]:
    """Attribute values OTel accepts, within the SDK's limits (attribute_values.py)."""
    return plain_attributes(attrs, limits or AttributeLimits(), room, drops)


def epoch_offset_ns() -> int:
    """time_ns() - perf_counter_ns(), to turn perf counter stamps into epoch nanoseconds."""
    return time_ns() - perf_counter_ns()
