"""The span worker: the background thread that drains the recorder's queue.

Once 256 steps wait, or the oldest has waited 0.5 s, it turns each step into a span record
(``records/step_records.py``), hands the drain's ``StepView``s to the derived metrics, and the
records the tail sampler keeps to export.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Iterator, Sequence
from time import monotonic, perf_counter_ns, thread_time_ns
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace import SpanProcessor

from otel_train.common import attributes as A
from otel_train.common.drop_counter import DropCounter
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.common.self_cost import SelfCostMeter
from otel_train.common.trace_ids import SAMPLED as _SAMPLED
from otel_train.recording.recorder import (
    MonitorRecord,
    Recorder,
    Step,
)
from otel_train.records.span_rows import (
    C_FLAGS,
    record_span_count,
    view_from_record,
)
from otel_train.records.step_records import StepSpanBuilder
from otel_train.records.steps_view import SharedStepSpanProcessor

if TYPE_CHECKING:
    from otel_train.derived.sampling import StepTailSampler

_log = logging.getLogger("otel_train")
_SAMPLED_FLAGS = int(_SAMPLED)
_getrandbits = random.getrandbits
# Contract names bound once: the builder runs for every step.
_STEP, _PHASE, _PHASE_KIND = A.STEP, A.PHASE, A.PHASE_KIND
_DATALOADER, _SLOW, _MONITOR = A.DATALOADER, A.SLOW, A.KIND_MONITOR
_DATA = A.PHASE_DATA


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
