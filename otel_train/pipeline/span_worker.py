"""The span worker: the background thread that drains the recorder's queue.

Once 256 steps wait, the oldest ended 0.5 s ago, or (console on) a step the console prints a
fast line for is queued (``drain_schedule.py``, which also says how long it sleeps between
looks), it turns each step into a span record
(``records/step_records.py``), hands the drain's ``StepView``s to the derived metrics, then the
records, with the rows of user spans that ended meanwhile (``user_spans.py``), to the route's
sink (``record_sinks.py``). No ``ReadableSpan`` is made here.

Usage::

    route = RowRoute(derived.shared, SinkExport([StageSink(stage, sampler)]), rank, user_rows)
    worker = SpanBuildWorker(recorder, builder, route, drops, self_cost)
    worker.start(); ...; worker.stop(1.0)
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from time import perf_counter_ns, thread_time_ns
from typing import TYPE_CHECKING, Any

from otel_train.common.drop_counter import DropCounter
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.common.self_cost import SelfCostMeter, is_cold_step
from otel_train.export.process.cpu import ProcessCpuReader
from otel_train.pipeline.drain_schedule import ConsoleDrainClock, DrainSchedule
from otel_train.pipeline.ring_source import RingSource
from otel_train.recording.call_checks import detached
from otel_train.recording.device_values import VALUE_WAIT_SECONDS, record_ready
from otel_train.recording.recorder import MonitorRecord, Recorder, Step
from otel_train.records.envelope_records import StartupRecordMaker
from otel_train.records.span_rows import C_ATTRS, record_span_count, view_from_record
from otel_train.records.step_records import StepRecordBuilder
from otel_train.records.steps_view import SharedStepSpanProcessor

from otel_train.pipeline.record_sinks import Export, NullExport

if TYPE_CHECKING:
    from otel_train.pipeline.user_spans import UserSpanRows

_log = logging.getLogger("otel_train")

# The oldest queued step waits at most this long for a drain; with the console on, less, so
# a breakdown or a slow step's line (which ConsoleDrainClock does not foresee) prints within
# ~0.4 s of its step.
MAX_DRAIN_DELAY_SECONDS = 0.5
CONSOLE_MAX_DRAIN_DELAY_SECONDS = 0.35
_VALUE_WAIT_NS = int(VALUE_WAIT_SECONDS * 1e9)
# A look between drains samples the own cost when the last sample is this old.
_SAMPLE_EVERY_NS = 250_000_000


class RowRoute:
    """Where a drain goes: its ``StepView``s to the derived metrics (``metrics.on_views``;
    None where the exporter process feeds them), then its records and the user spans' rows
    to ``export`` (``NullExport()``: nothing is exported)."""

    def __init__(self, metrics: SharedStepSpanProcessor | None, export: Export | None,
                 rank: Any, user_rows: UserSpanRows | None = None) -> None:
        self.metrics = metrics
        self.export: Export = NullExport() if export is None else export
        self.rank = rank
        self.user_rows = user_rows


class SpanBuildWorker:
    """The background thread: drain records, build spans (or rows), feed the processors."""

    def __init__(
        self,
        recorder: Recorder,
        builder: StepRecordBuilder,
        route: RowRoute,
        drops: DropCounter,
        self_cost: SelfCostMeter,
        poll_interval_seconds: float = 0.05,
        drain_at_records: int = 256,
        max_drain_delay_seconds: float = MAX_DRAIN_DELAY_SECONDS,
        console_every_steps: int | None = None,
        console_min_interval_seconds: float = 0.0,
        startup: StartupRecordMaker | None = None,
        ring_source: RingSource | None = None,
    ) -> None:
        self._recorder = recorder
        self._ring_source = ring_source  # step_ring="on": the ring, merged with the queue
        # On an accelerator, records may hold device values or events still on their way
        # (device_values.py): checked before each is built. Never on CPU.
        probes = recorder.probes  # None when no probe is active
        self._wait_device = (recorder.keep_value is not detached
                             or (probes is not None and probes.make_event is not None))
        self._route = route
        # The route's one export: told when a drain ends (``end_drain``: the exporter
        # process's frame) and ticked between drains (``tick``: user spans, the child's counts).
        self._export = route.export
        self._builder = builder
        # The train.startup record, made with the first step's (records/envelope_records.py).
        self._startup = startup
        self._drops = drops
        self._self_cost = self_cost
        # A drain has a fixed cost, paid in the GIL: waking up with cold caches costs more
        # than the records themselves at a fast step pace. So the worker drains once
        # ``drain_at_records`` steps wait, or the oldest ended ``max_drain_delay_seconds``
        # ago: metrics stay fresher than any scrape interval, and fast loops drain in
        # batches large enough that the exporter process gets few, large frames. With the
        # console on, a step it prints a fast line for is drained at the next look, not
        # after the delay (ConsoleDrainClock). Between looks it sleeps until one of those
        # can come true (DrainSchedule), ``poll_interval_seconds`` at least; the exporter
        # process's reports (console lines) wake it at once.
        self._schedule = DrainSchedule(
            poll_interval_seconds, drain_at_records, max_drain_delay_seconds,
            ConsoleDrainClock(console_every_steps, console_min_interval_seconds)
            if console_every_steps else None)
        self._stop = threading.Event()
        # Wakes a worker sleeping on the exporter process's pipes (``wait_for_io``) at stop.
        self._wake_r = self._wake_w = -1
        if self._export.waits_on_io:
            self._wake_r, self._wake_w = os.pipe()
            os.set_blocking(self._wake_w, False)
        self._drain_lock = threading.Lock()
        self._warn = RateLimitedLogger(_log)
        self._thread = threading.Thread(target=self._run, name="otel-train-spans", daemon=True)
        self.spans_built = 0
        self._cpu_mark = 0  # this thread's CPU at the last own-cost sample
        self._sampled_ns = 0  # perf_counter_ns of the last own-cost sample
        self._seen_step_end = 0
        self._exporter_cpu: ProcessCpuReader | None = None  # the exporter's /proc stat, kept open
        self.paused = False  # benchmarks pause the worker to time the hot path alone

    @property
    def ring_source(self) -> RingSource | None:
        """The step ring's source (step_ring="on"), None without a ring."""
        return self._ring_source

    @property
    def _records(self) -> Any:
        """The records to drain, in order: the ring's merged with the queue, or the queue
        (read each time: a forked child's run swaps the queue out)."""
        source = self._ring_source
        return source.records if source is not None else self._recorder.queue

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def _run(self) -> None:
        self._cpu_mark = thread_time_ns()
        rec = self._recorder
        ring = self._ring_source is not None
        user_rows = self._route.user_rows
        export = self._export
        reads = export.waits_on_io  # the exporter process: ticked between drains
        schedule = self._schedule
        poll = schedule.poll_ns / 1e9
        rows_since = 0  # perf_counter_ns the user spans' rows were first seen waiting
        wait = poll
        while not self._stop.is_set():
            if self.paused:  # nothing is read while paused: a readable pipe must not wake it
                self._stop.wait(poll)
                continue
            reports = self._sleep(wait, reads)
            if self.paused or self._stop.is_set():
                wait = poll
                continue
            now = perf_counter_ns()
            if ring:  # (the child reading it: only its start_run time, once)
                self._refill(look=True)
            q = self._records  # the queue, the merged ring, or the ring taken over
            schedule.observe(q)
            rows = user_rows is not None and user_rows.waiting
            if rows and not rows_since:
                rows_since = now
            drain = schedule.drain_due(q, now) or (
                rows and now - rows_since >= schedule.max_delay_ns)
            # The own-cost sample reads two /proc files, and each read lets go of the GIL
            # (the training thread then waits to take it back): around each drain, and at
            # a look only once its interval is long enough to say something.
            if drain or now - self._sampled_ns >= _SAMPLE_EVERY_NS:
                self._sample_cost()
            if drain:
                rows_since = 0
                self.drain()
                # The drain's interval apart: the training thread's wait in it is bounded
                # by the drain's own CPU, not by the whole look's.
                self._sample_cost()
                now = perf_counter_ns()
            elif reads:
                try:
                    export.tick(reports)  # between drains: user spans, frames the pipe could not take
                except Exception as exc:
                    self._warn.warning("send", "otel-train: exporter hand-over failed: %r",
                                       exc)
                    self._stop.wait(poll)  # what woke it may still be unread: no busy loop
            if ring:
                self._send_collectives()
            ended = rec.last_step_end_ns
            active = rec.current is not None or (ended and now - ended < schedule.max_delay_ns)
            wait = schedule.wait_seconds(q, now, bool(active), stepped=bool(ended))
            if rows_since:
                wait = max(poll, min(wait, (rows_since + schedule.max_delay_ns - now) / 1e9))

    def _refill(self, look: bool = False) -> None:
        """What the step ring holds now into the records to drain (step_ring="on"; a look
        between drains leaves a take-over from the exporter process to the next drain);
        never raises (a drain may run on the training thread: run.flush(), run.costs())."""
        source = self._ring_source
        if source is None:
            return
        try:
            if source.in_child:  # (a drain too: run.costs() before the worker's first look)
                source.look(self._self_cost.ready_ns)
            source.refill(may_take_over=not look)
        except Exception as exc:
            self._warn.warning("ring", "otel-train: reading the step ring: %r", exc)

    def _sleep(self, seconds: float, reads: bool) -> bool:
        """Until ``seconds`` pass, the worker is stopped, or (with the exporter process, whose
        reports the next look reads: ``reads``) the child reports or the pipe takes what
        waits; True when the child's reports are readable."""
        if self._wake_r < 0 or not reads:
            self._stop.wait(seconds)
            return False
        try:
            return bool(self._export.wait_for_io(seconds, self._wake_r))
        except Exception as exc:  # never a busy loop: sleep the time instead
            self._warn.warning("wait", "otel-train: waiting on the exporter process: %r", exc)
            self._stop.wait(seconds)
            return True

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

    def reads_ring_in_child(self) -> bool:
        """The exporter process reads the step ring (not given up)."""
        source = self._ring_source
        return source is not None and source.in_child

    def _send_collectives(self) -> None:
        """While the exporter process reads the ring: the collectives timed since the last
        look go to its builder (the ring's steps' train.comm.*); never raises."""
        source = self._ring_source
        if source is None or not source.in_child or self._builder.collectives is None:
            return
        try:
            source.send_collectives(self._builder.collectives)
        except Exception as exc:
            self._warn.warning("ring", "otel-train: sending the collectives: %r", exc)

    def _sample_cost(self) -> None:
        """Own cost: this thread's CPU since the last sample, and the training thread's wait
        in that interval (``SelfCostMeter.sample``); never raises."""
        self._sampled_ns = perf_counter_ns()
        try:
            cpu = thread_time_ns()
            used, self._cpu_mark = cpu - self._cpu_mark, cpu
            exporter = self._exporter_cpu_ns()
            rec = self._recorder
            end = rec.last_step_end_ns
            # Training ran in the interval: a step is open, or one ended since the last look.
            active = rec.current is not None or end != self._seen_step_end
            self._seen_step_end = end
            begun = rec.next_index
            self._self_cost.sample(used, exporter, active,
                                   begun if isinstance(begun, int) else None)
        except Exception as exc:
            self._warn.warning("cost", "otel-train: own-cost sample failed: %r", exc)

    def _exporter_cpu_ns(self) -> int | None:
        """The exporter process's CPU so far (ns), None without one or where unreadable."""
        pid = self._export.pid
        if pid is None:
            return None
        reader = self._exporter_cpu
        if reader is None or reader.pid != pid:  # the first poll, or a restarted exporter
            if reader is not None:
                reader.close()
            reader = self._exporter_cpu = ProcessCpuReader(pid)
        return reader.cpu_ns()

    def _drain_locked(self, deadline_ns: int | None) -> int:
        cpu0 = thread_time_ns()
        try:
            self._refill()
            return self._drain_records(self._route, deadline_ns)
        finally:
            self._send_collectives()  # after the queued steps took theirs
            try:
                self._export.end_drain()  # one frame per drain to the exporter process
            except Exception as exc:
                self._warn.warning("send", "otel-train: could not hand spans to the "
                                   "exporter: %r", exc)
            used = thread_time_ns() - cpu0
            if threading.current_thread() is self._thread:
                pass  # the worker's own CPU is counted by _sample_cost, with its wait
            elif self._self_cost.on_training_thread() and not self._stop.is_set():
                self._self_cost.add_training_thread_ns(used)  # run.costs(), run.flush()
            else:  # another thread's, or the last drain at shutdown (teardown, not a step's)
                self._self_cost.add_background_ns(used)

    def _queued(self, deadline_ns: int | None) -> Iterator[Step | MonitorRecord]:
        """Pop queued records until the queue is empty or ``deadline_ns`` passed.

        On an accelerator, a record whose device values or events are still on their way
        stops the drain there (it and those after it go in a later one, in order), unless it
        ended ``VALUE_WAIT_SECONDS`` ago or the worker is stopping: then it is built without
        them, and they are counted (records/attribute_values.py).
        """
        q = self._records
        wait_device = self._wait_device
        while q:
            if deadline_ns is not None and perf_counter_ns() > deadline_ns:
                return
            if wait_device:
                try:
                    head = q[0]
                except IndexError:
                    return
                if not self._stop.is_set():
                    if (not record_ready(head)
                            and perf_counter_ns() - head.end_ns < _VALUE_WAIT_NS):
                        return  # never a wait: the next drain looks again
                else:
                    # Stopping: training is over, no later work queues behind these
                    # values; look again every millisecond, within the shutdown's bound.
                    until = head.end_ns + _VALUE_WAIT_NS
                    if deadline_ns is not None:
                        until = min(until, deadline_ns)
                    while not record_ready(head) and perf_counter_ns() < until:
                        time.sleep(0.001)
            try:
                record = q.popleft()
            except IndexError:
                return
            yield record

    def _build_failed(self, record: Step | MonitorRecord, exc: Exception,
                      ordinal: int = -1) -> None:
        self._drops.add("build_error", record.span_count())
        self._warn.warning("build", "otel-train: could not build spans: %r", exc)
        if ordinal >= 0 and self._ring_source is not None:  # its marker waits for nothing
            self._ring_source.skip([ordinal])

    def _drain_records(self, route: RowRoute, deadline_ns: int | None) -> int:
        """A span record per step; the drain's views to the metrics at once (each processor
        takes the whole drain in turn: ``on_views``), then the records to export."""
        # User spans first: one that ended inside a step of this drain is then in the same
        # hand-over as its step's record (the tail sampler decides them together).
        rows = route.user_rows.take() if route.user_rows is not None else []
        record_of, metrics, rank = self._builder.record, route.metrics, route.rank
        source = self._ring_source
        # The exporter process reads the ring: each queued record goes with its ordinal, and
        # train.startup is made there (its first step may be a ring step).
        ordinals: list[int] | None = [] if source is not None and source.in_child else None
        made: list[tuple[Any, ...]] = []
        views = []
        built = steps = cold = 0
        first_start: int | None = None
        first_attrs: dict[str, Any] | None = None
        for record in self._queued(deadline_ns):
            # (the record just taken: the n-th queued since the ring was attached)
            ordinal = source.take_ordinal() if source is not None and ordinals is not None else -1
            if not isinstance(record, MonitorRecord):  # a Step, or a RingStep
                steps += 1
                if first_start is None:
                    first_start = record.start_ns
                    if self._startup is not None and not self._startup.done \
                            and ordinals is None:
                        built += self._add_startup(record, made, views, metrics, rank)
                        first_attrs = self._startup.first_step_attributes
            try:
                rec = record_of(record)
                if first_attrs:  # a resumed run's first step: which attempt, what it lost
                    rec[C_ATTRS].update(first_attrs)
                    first_attrs = None
                # No metrics here when the exporter process feeds them (derived/chain.py).
                view = view_from_record(rec, rank) if metrics is not None else None
            except Exception as exc:
                self._build_failed(record, exc, ordinal)
                continue
            spans = record_span_count(rec)
            built += spans
            # A step long enough for its work to evict the hot path from the caches: its
            # spans cost the cold figure (recording/hot_path_cost.py).
            if is_cold_step(record.end_ns - record.start_ns, spans):
                cold += spans
            if view is not None:
                views.append(view)
            made.append(rec)
            if ordinals is not None:
                ordinals.append(ordinal)
        if views:
            metrics.on_views(views)  # never raises; marks train.slow before the sampler reads it
        if made or rows:
            self._hand_on(self._export, made, rows, ordinals)
        self.spans_built += built
        self._self_cost.add_hot_path_spans(built - cold, cold)  # once per drain: a lock
        self._self_cost.note_steps(steps, first_start, self._recorder.last_step_end_ns)
        return len(made)

    def _add_startup(self, first: Step, made: list[tuple[Any, ...]], views: list[Any],
                     metrics: Any, rank: Any) -> int:
        """The run's train.startup record, ahead of its first step's; its span count."""
        try:
            rec = self._startup.record(first.start_ns, self._self_cost.ready_ns)  # type: ignore[union-attr]
            if rec is None:  # option startup_span off
                return 0
            rec = self._builder.host_timed(rec)
            view = view_from_record(rec, rank) if metrics is not None else None
        except Exception as exc:
            self._drops.add("build_error", 1)
            self._warn.warning("build", "otel-train: could not build train.startup: %r", exc)
            return 0
        if view is not None:
            views.append(view)
        made.append(rec)
        return record_span_count(rec)

    def _hand_on(self, export: Export, made: list[tuple[Any, ...]],
                 rows: list[tuple[Any, ...]], ordinals: list[int] | None = None) -> None:
        try:
            if ordinals is not None:  # only the exporter process's route reads the ring
                export.on_records(made, rows, ordinals=ordinals)  # type: ignore[call-arg]
            else:
                export.on_records(made, rows)
        except Exception as exc:  # an export must never stop the flow
            self._drops.add("export_failed", sum(map(record_span_count, made)) + len(rows))
            self._warn.warning("send", "otel-train: could not queue spans for export: %r", exc)

    def stop(self, timeout_seconds: float) -> None:
        """Stop the thread, then drain what is left within ``timeout_seconds``."""
        deadline = perf_counter_ns() + int(timeout_seconds * 1e9)
        self._stop.set()
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass  # full: the worker wakes all the same
        if self._thread.is_alive():
            self._thread.join(max(0.0, timeout_seconds))
        if not self._thread.is_alive():
            self._close_wake_pipe()
        route = self._route
        if route.user_rows is not None:
            route.user_rows.close()  # a span ending from now on is counted, not kept
        source = self._ring_source
        if source is not None and source.in_child and not self._thread.is_alive():
            try:  # no child to read the ring after all: the last drain reads it here
                source.before_last_drain(max(0.0, (deadline - perf_counter_ns()) / 1e9))
            except Exception as exc:
                self._warn.warning("ring", "otel-train: the exporter process: %r", exc)
        if not self._thread.is_alive():
            self.drain(deadline)
            try:
                self._export.close()
            except Exception as exc:
                self._warn.warning("send", "otel-train: could not hand the last spans "
                                   "to export: %r", exc)
        lost = 0
        if source is not None:
            try:
                source.detach()  # from now on a late record is queued, and counted below
                lost += source.waiting_spans()
            except Exception as exc:
                self._warn.warning("ring", "otel-train: reading the step ring: %r", exc)
            source.pending.clear()
        left = self._recorder.queue
        if left:
            lost += sum(r.span_count() for r in list(left))
            left.clear()
        if lost:
            self._drops.add("shutdown_timeout", lost)

    def _close_wake_pipe(self) -> None:
        for fd in (self._wake_r, self._wake_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._wake_r = self._wake_w = -1
