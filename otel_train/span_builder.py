"""Off the hot path: finished step records become OpenTelemetry ``ReadableSpan``s.

A background worker drains the recorder's queue (once 256 steps wait, or every 0.5 s), builds the
root ``train.step`` span and one child per phase (recorded start/end times, the contract's
attributes, one shared Resource and scope, span ids drawn here unless a user span already
asked for one), and hands them, children first, to the span processors in order.
"""

from __future__ import annotations

import logging
import random
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from time import monotonic, perf_counter_ns, thread_time_ns, time_ns
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import StatusCode

from otel_train import attributes as A
from otel_train.attribute_values import AttributeLimits, plain_attributes
from otel_train.drop_counter import DropCounter
from otel_train.identity import RunIdentity, step_trace_id
from otel_train.rate_limited_log import RateLimitedLogger
from otel_train.recorder import (
    MonitorRecord,
    Recorder,
    Step,
    decode_events,
    flat_events,
)
from otel_train.self_cost import SelfCostMeter
from otel_train.span_rows import (
    C_FLAGS,
    RowSpanFactory,
    record_span_count,
    rows_from_record,
    view_from_record,
)
from otel_train.steps_view import SharedStepSpanProcessor
from otel_train.trace_ids import SAMPLED as _SAMPLED
from otel_train.trace_ids import operation_ids

if TYPE_CHECKING:
    from otel_train.sampling import StepTailSampler

_log = logging.getLogger("otel_train")
_SAMPLED_FLAGS = int(_SAMPLED)
_getrandbits = random.getrandbits
# Contract names bound once: the builder runs for every step.
_STEP, _PHASE, _PHASE_KIND = A.STEP, A.PHASE, A.PHASE_KIND
_DATALOADER, _SLOW, _MONITOR = A.DATALOADER, A.SLOW, A.KIND_MONITOR
_DATA = A.PHASE_DATA


def run_constant_attributes(identity: RunIdentity, device_synced: bool,
                            device_type: str) -> dict[str, Any]:
    """The attributes every span of the run carries, in the order they are written."""
    return {
        A.RUN_ID: identity.run_id,
        A.RANK: identity.rank,
        A.WORLD_SIZE: identity.world_size,
        A.DEVICE_SYNCED: device_synced,
        A.DEVICE_TYPE: device_type,
    }


class StepSpanBuilder:
    """Turns step records into ReadableSpans that follow the telemetry contract."""

    def __init__(
        self,
        identity: RunIdentity,
        resource: Resource,
        scope: InstrumentationScope,
        device_synced: bool,
        device_type: str,
        is_sampled: Callable[[int], bool],
        epoch_offset_ns: int,
    ) -> None:
        self._identity = identity
        self._is_sampled = is_sampled
        self._offset = epoch_offset_ns
        # OTEL_*ATTRIBUTE_* limits, read once (the SDK reads them when its provider is made).
        self._limits = AttributeLimits.from_env()
        self._base = run_constant_attributes(identity, device_synced, device_type)
        # Rows leave the run constants out; the factory puts them first in every span's
        # attributes, where the OTLP encoder writes them as one cached block
        # (otlp_encoding.RunConstantAttributes). The attribute count limit counts them.
        self._room = self._limits.count - len(self._base)
        self.run_constants = dict(self._base)
        self.factory = RowSpanFactory(resource, scope, self._base)
        self.rank = identity.rank

    def build(self, record: Step | MonitorRecord) -> list[ReadableSpan]:
        """All spans of one record, children before their parents (the order spans end)."""
        return self.factory.spans(rows_from_record(self.record(record)))

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

    def _step_record(self, step: Step) -> tuple[Any, ...]:
        trace_id = step.trace_id or step_trace_id(self._identity.run_id, step.index)
        flags = _SAMPLED_FLAGS if self._is_sampled(trace_id) else 0
        ids = step.span_ids  # ids already handed to user spans (rare): keep them
        root_id = (ids and ids.get(-1)) or _getrandbits(64) or 1
        off = self._offset
        step_end = step.end_ns
        step_loader = step.loader
        phases = None if step.dev or step.phase_attrs else _flat_phases(
            step.ev, step_loader, root_id, off)
        device_seconds = None
        if phases is None:  # nested, failed, left open, with attributes or device events
            phases, device_seconds = self._phases(step, root_id)
        root_attrs: dict[str, Any] = {_STEP: step.index}
        if step_loader is not None:
            root_attrs[_DATALOADER] = step_loader
        root_attrs[_SLOW] = False  # the slow-step processor turns this on
        if device_seconds and -1 in device_seconds:
            root_attrs[A.DEVICE_DURATION] = device_seconds[-1]
        if step.attrs:
            root_attrs.update(_plain_attributes(step.attrs, self._limits,
                                                self._room - len(root_attrs)))
        status, events = _status_and_events(step.error, step_end + off)
        return (A.STEP_SPAN_NAME, trace_id, root_id, flags, step.start_ns + off, step_end + off,
                root_attrs, status, events, phases, ids or None)

    def _phases(self, step: Step, root_id: int
                ) -> tuple[list[tuple[Any, ...]], dict[int, float] | None]:
        """The record's phases, and device seconds, of any step, decoded."""
        off, step_end, step_loader = self._offset, step.end_ns, step.loader
        phase_attrs = step.phase_attrs
        decoded = decode_events(step.ev)  # the one decoder of a step's event list
        device_seconds = _device_durations(step, decoded) if step.dev else None
        limits, room = self._limits, self._room
        phases: list[tuple[Any, ...]] = []
        for ph in decoded:
            phase = ph.phase
            name = phase.name
            parent = ph.parent
            # Work nested in a monitoring phase is monitoring work (validation data).
            kind = _MONITOR if parent >= 0 and phases[parent][1] == _MONITOR else phase.kind
            # Only data spans carry a loader: a monitoring or compute phase reads none
            # itself (validation data inside val_loss is its own data span).
            loader = phase.loader or (step_loader if name == _DATA else None)
            start = ph.start_ns + off
            end = (ph.end_ns or step_end) + off  # a phase left open ends with its step
            status, events = _status_and_events(ph.error, end)
            device = device_seconds.get(ph.ordinal) if device_seconds else None
            extra = phase_attrs.get(ph.ordinal) if phase_attrs else None
            if extra:
                extra = _plain_attributes(
                    extra, limits, room - 3 - (loader is not None) - (device is not None))
            # span_rows.py's phase layout; the first six are what StepView needs.
            phases.append((name, kind, loader, end - start, ph.ordinal + 1,
                           parent + 1 if parent >= 0 else root_id, start, end, status,
                           events, extra or None, device))
        return phases, device_seconds

    def _monitor_record(self, rec: MonitorRecord) -> tuple[Any, ...]:
        trace_id, span_id = operation_ids(rec)
        flags = _SAMPLED_FLAGS if self._is_sampled(trace_id) else 0
        attrs: dict[str, Any] = {A.STEP: rec.after_step, A.PHASE: rec.name,
                                 A.PHASE_KIND: A.KIND_MONITOR}
        if rec.attrs:
            attrs.update(_plain_attributes(rec.attrs, self._limits, self._room - len(attrs)))
        off = self._offset
        status, events = _status_and_events(rec.error, rec.end_ns + off)
        return (rec.name, trace_id, span_id, flags, rec.start_ns + off, rec.end_ns + off, attrs,
                status, events, None, None)


def _device_durations(step: Step, phases: Sequence[Any]) -> dict[int, float]:
    """Device seconds per phase ordinal (-1: the step) from its timing events.

    Runs in the background: waiting for the step's last event blocks this thread only, and by
    the time a step is built its device work has usually long finished.
    """
    dev = step.dev or {}
    out: dict[int, float] = {}
    try:
        last = dev.get(-2)
        if last is not None:
            last.synchronize()
        first = dev.get(-1)
        if first is not None and last is not None:
            out[-1] = first.elapsed_time(last) / 1000.0
        for ph in phases:
            start, end = dev.get(ph.start_pos), dev.get(ph.end_pos)
            if start is not None and end is not None:
                out[ph.ordinal] = start.elapsed_time(end) / 1000.0
    except Exception as exc:  # a device error must not lose the host-timed spans
        _log.debug("device event timing unavailable: %r", exc)
    return out


def _flat_phases(ev: list[Any], step_loader: str | None, root_id: int, off: int
                 ) -> list[tuple[Any, ...]] | None:
    """The record's phases of a flat step (recorder.flat_events), None for any other.

    Most steps are flat, and read by slices with no decoding: it takes a third off the
    record's CPU (7.2 -> 5.0 us for a 5-phase step).
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
        loader = phase.loader or (step_loader if name == _DATA else None)
        phases.append((name, phase.kind, loader, end - start, ordinal, root_id, start + off,
                       end + off, None, (), None, None))
    return phases


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
                      room: int | None = None) -> dict[str, Any]:
    """Attribute values OTel accepts, within the SDK's limits (attribute_values.py)."""
    return plain_attributes(attrs, limits or AttributeLimits(), room)


class RowRoute:
    """The row path: a step's rows go to the derived metrics as one ``StepView``, then to
    the tail sampler, then to export, with no ``ReadableSpan`` made in this process.

    ``export`` takes span records (``send_record``) and is told when a drain ends
    (``end_drain``), so it can write one batch per drain (export_process.ExportProcessClient).
    """

    def __init__(self, metrics: SharedStepSpanProcessor | None, sampler: StepTailSampler | None,
                 export: Any | None, rank: Any) -> None:
        self.metrics = metrics
        self.sampler = sampler
        self.export = export
        self.rank = rank


class SpanBuildWorker:
    """The background thread: drain records, build spans (or rows), feed the processors."""

    def __init__(
        self,
        recorder: Recorder,
        builder: StepSpanBuilder,
        processors: Sequence[SpanProcessor],
        drops: DropCounter,
        self_cost: SelfCostMeter,
        poll_interval_seconds: float = 0.05,
        route: RowRoute | None = None,
        drain_at_records: int = 256,
        max_drain_delay_seconds: float = 0.5,
        export: Any = None,
    ) -> None:
        self._recorder = recorder
        self._route = route
        # The export stage, told when a drain ends (``end_drain``) and ticked between drains
        # (``tick``) when it has those (export_process.ExportProcessClient), in both paths.
        self._export = export if export is not None else (route.export if route else None)
        self._builder = builder
        self._processors = tuple(processors)
        self._drops = drops
        self._self_cost = self_cost
        self._interval = poll_interval_seconds
        # A drain has a fixed cost, paid in the GIL: waking up with cold caches costs
        # ~0.3-0.5 ms here whatever it then does (a 10 ms step drained every 50 ms paid
        # ~140 us per step in the background, ~55 us drained every 0.5 s). So the worker
        # looks every poll interval but drains once ``drain_at_records`` steps wait, or the
        # oldest has waited ``max_drain_delay_seconds``: metrics stay fresher than any
        # scrape interval, and fast loops still drain in batches. 256 rather than 64 steps:
        # at ~1 ms steps (an MLP loop, runs side by side, blocks alternating) this process's
        # background went 37-39 -> 30-33 us per step, the training thread's GIL wait 36-37 ->
        # 27 us, the exporter process 76-77 -> 68-69 us (fewer, larger frames); a drain every
        # ~0.25 s at that pace, still fresher than any scrape.
        self._drain_at = drain_at_records
        self._max_delay = max_drain_delay_seconds
        self._stop = threading.Event()
        self._drain_lock = threading.Lock()
        self._warn = RateLimitedLogger(_log)
        self._thread = threading.Thread(target=self._run, name="otel-train-spans", daemon=True)
        self.spans_built = 0
        self.paused = False  # benchmarks pause the worker to time the hot path alone

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def _run(self) -> None:
        q = self._recorder.queue
        tick = getattr(self._export, "tick", None)
        waiting_since = 0.0  # monotonic time the queue was first seen non-empty
        while not self._stop.is_set():
            self._stop.wait(self._interval)
            if self.paused:
                continue
            if q:
                now = monotonic()
                if not waiting_since:
                    waiting_since = now
                if len(q) >= self._drain_at or now - waiting_since >= self._max_delay:
                    waiting_since = 0.0
                    self.drain()
                    continue
            if tick is not None:
                try:
                    tick()  # between drains: user spans, frames the pipe could not take yet
                except Exception as exc:
                    self._warn.warning("send", "otel-train: exporter hand-over failed: %r",
                                       exc)

    def drain(self, deadline_ns: int | None = None) -> int:
        """Build and hand on every queued record (until ``deadline_ns``); return the count."""
        # One drain at a time: the worker, and the training thread in run.costs()/flush();
        # processors are never called concurrently. With a deadline (shutdown), never wait
        # past it: a drain interrupted by a signal on this very thread holds the lock.
        if deadline_ns is None:
            with self._drain_lock:
                return self._drain_locked(deadline_ns)
        wait = max(0.0, (deadline_ns - perf_counter_ns()) / 1e9)
        if not self._drain_lock.acquire(timeout=wait):
            return 0
        try:
            return self._drain_locked(deadline_ns)
        finally:
            self._drain_lock.release()

    def _drain_locked(self, deadline_ns: int | None) -> int:
        cpu0 = thread_time_ns()
        try:
            if self._route is not None:
                return self._drain_records(self._route, deadline_ns)
            return self._drain_spans(deadline_ns)
        finally:
            end_drain = getattr(self._export, "end_drain", None)
            if end_drain is not None:
                try:
                    end_drain()  # one frame per drain to the exporter process
                except Exception as exc:
                    self._warn.warning("send", "otel-train: could not hand spans to the "
                                       "exporter: %r", exc)
            self._self_cost.add_background_ns(thread_time_ns() - cpu0)

    def _queued(self, deadline_ns: int | None) -> Iterator[Step | MonitorRecord]:
        """Pop queued records until the queue is empty or ``deadline_ns`` passed."""
        q = self._recorder.queue
        while q:
            if deadline_ns is not None and perf_counter_ns() > deadline_ns:
                return
            try:
                record = q.popleft()
            except IndexError:
                return
            yield record

    def _build_failed(self, record: Step | MonitorRecord, exc: Exception) -> None:
        self._drops.add("build_error", record.span_count())
        self._warn.warning("build", "otel-train: could not build spans: %r", exc)

    def _drain_spans(self, deadline_ns: int | None) -> int:
        """The classic path: ReadableSpans to every span processor, in order."""
        done = built = 0
        for record in self._queued(deadline_ns):
            try:
                spans = self._builder.build(record)
            except Exception as exc:
                self._build_failed(record, exc)
                continue
            built += len(spans)
            for span in spans:
                for proc in self._processors:
                    try:
                        proc.on_end(span)
                    except Exception as exc:  # a processor must never stop the flow
                        self._warn.warning(
                            f"proc-{type(proc).__name__}",
                            "otel-train: span processor %s failed: %r",
                            type(proc).__name__, exc,
                        )
            done += 1
        self.spans_built += built
        self._self_cost.add_hot_path_spans(built)  # once per drain: it takes a lock
        return done

    def _drain_records(self, route: RowRoute, deadline_ns: int | None) -> int:
        """The row path: a span record per step; the drain's views to the metrics at once
        (each processor takes the whole drain in turn: ``on_views``), then the records to
        export."""
        done = built = 0
        record_of, metrics, sampler, export = (self._builder.record, route.metrics,
                                               route.sampler, route.export)
        rank = route.rank
        made: list[tuple[tuple[Any, ...], int]] = []
        views = []
        for record in self._queued(deadline_ns):
            try:
                rec = record_of(record)
                # No metrics here: the exporter process feeds them (derived_chain.py).
                view = view_from_record(rec, rank) if metrics is not None else None
            except Exception as exc:
                self._build_failed(record, exc)
                continue
            spans = record_span_count(rec)
            built += spans
            if view is not None:
                views.append(view)
            made.append((rec, spans))
            done += 1
        if views:
            metrics.on_views(views)  # never raises; marks train.slow before the sampler reads it
        if export is not None:
            for rec, spans in made:
                # Unsampled by the SDK sampler (e.g. always_off): never exported.
                if rec[C_FLAGS] & 1 and (sampler is None or sampler.keep_record(rec)):
                    try:
                        export.send_record(rec, spans)
                    except Exception as exc:
                        self._drops.add("export_failed", spans)
                        self._warn.warning("send", "otel-train: could not queue spans for "
                                           "export: %r", exc)
        self.spans_built += built
        self._self_cost.add_hot_path_spans(built)  # once per drain: it takes a lock
        return done

    def stop(self, timeout_seconds: float) -> None:
        """Stop the thread, then drain what is left within ``timeout_seconds``."""
        deadline = perf_counter_ns() + int(timeout_seconds * 1e9)
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(max(0.0, timeout_seconds))
        if not self._thread.is_alive():
            self.drain(deadline)
        left = self._recorder.queue
        if left:
            lost = sum(r.span_count() for r in list(left))
            left.clear()
            self._drops.add("shutdown_timeout", lost)


def epoch_offset_ns() -> int:
    """time_ns() - perf_counter_ns(), to turn perf counter stamps into epoch nanoseconds."""
    return time_ns() - perf_counter_ns()
