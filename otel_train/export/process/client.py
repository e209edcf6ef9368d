"""Span export in a process of its own, out of the training process's GIL.

In CPython every microsecond the background spends building ``ReadableSpan``s and encoding
OTLP holds the GIL the training thread needs (``benchmarks/bench_hot_path.py`` measures the
stall). With this client the training process only turns each step into a span record
(records/span_rows.py), feeds it to the derived metrics, and writes the records down a pipe,
one ``marshal``-ed frame per drain. A child Python process started with the run (child.py)
does the rest with the code the in-process path uses: records ->
``BoundedBatchSpanProcessor.on_records`` -> the planned exporter, with the same retries,
bounds and drop counting.

Promises kept, each in its room:

- bounded: frames the child has not read wait here up to ``max_queued_spans`` spans, the
  oldest dropped and counted beyond (outbox.py); no write ever blocks;
- counted: the child's export and drop counts land in this process's ``DropCounter``
  (reports.py), reported after each batch it sends; should it die, the frames it had not
  confirmed (kept here until it does: ``outbox.Unconfirmed``) are exported from here again, so
  delivered + dropped = emitted (the batch in flight at its death may arrive twice);
- the same exit bounds: ``shutdown(timeout)`` hands the child what is left and its share of
  the time; past the deadline the child is killed and what it held is counted;
- faults: the child ignores SIGINT/SIGTERM (launch.py) and exits when the pipe closes or the
  training process is gone; if it cannot start in time or dies, this process exports
  (fallback.py), with a warning; a forked training process's copy is inert.

The lifecycle is one state (lifecycle.py): STARTING -> READY -> FINAL, or TAKEN_OVER; then
CLOSED; FORKED from any of them.

Usage::

    client = ExportProcessClient(plan, resource, scope, run_constants, drops, options)
    client.send_record(rec, spans); client.end_drain()   # from the span worker
    client.on_end(readable_span)                      # user spans (SDK provider)
    client.force_flush(5000); client.shutdown(2.0)
"""

from __future__ import annotations

import logging
import marshal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_train.common.drop_counter import DropCounter
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.export.process.cpu import (
    METRIC_EXPORTER_CPU,
    ExporterProcessCpuCollector,
    process_cpu_seconds,
)
from otel_train.export.process.derived_link import DerivedMetricsLink
from otel_train.export.process.fallback import FallbackExport, take_over
from otel_train.export.process.launch import (
    ExporterProcess,
    exporter_config,
    import_for_exit_fallback,
)
from otel_train.export.process.lifecycle import ClientLifecycle, ClientState
from otel_train.export.process.outbox import Outbox
from otel_train.export.process.reports import ChildReports
from otel_train.export.process.ring_link import RingClientPart
from otel_train.records.span_rows import RowSpanFactory, row_from_span

__all__ = ["METRIC_EXPORTER_CPU", "ClientState", "ExportProcessClient",
           "ExporterProcessCpuCollector", "process_cpu_seconds"]

_log = logging.getLogger("otel_train")
_STARTING, _READY, _FINAL = ClientState.STARTING, ClientState.READY, ClientState.FINAL
_TAKEN_OVER, _FORKED = ClientState.TAKEN_OVER, ClientState.FORKED
# The child reads frames in these states; before, frames wait here, so that a child that
# never starts leaves them all at hand to export from this process.
_CHILD_READS = frozenset({_READY, _FINAL})
# The child's reports are read in these states (its start-up report while STARTING).
_REPORTS = frozenset({_STARTING, _READY, _FINAL})
# Of what is left of the shutdown bound: what a child still starting gets to come up (it has
# the exporter half made; this process would have to import and connect one of its own),
# and what a running child gets to export (the rest is its margin to report final counts).
_START_SHARE, _STOP_SHARE, _STOP_MARGIN_SECONDS = 0.6, 0.85, 0.05


class ExportProcessClient(RingClientPart, SpanProcessor):
    """The training process's side: rows down a pipe to the exporter process, counts back."""

    def __init__(self, plan: Any, resource: Resource, scope: InstrumentationScope,
                 run_constants: dict[str, Any], drops: DropCounter, max_queued_spans: int,
                 max_batch_size: int, interval_seconds: float,
                 fallback: Callable[[], Any] | None = None, nice: int = 0,
                 cpus: frozenset[int] | None = None, ring: Any = None) -> None:
        self._drops = drops
        self._warn = RateLimitedLogger(_log)
        self._lock = threading.Lock()  # the pending records and user spans (worker, training)
        self._io_lock = threading.Lock()  # the lifecycle, the pipe, the outbox and the counts
        self._recs: list[tuple[Any, ...]] = []  # span records (span_rows.py) of steps
        self._rec_spans = 0
        self._user_spans: list[ReadableSpan] = []  # SDK spans, made rows in end_drain
        # step_ring="on" in scope (pipeline/assembly.py): the child reads the ring
        # (ring_feed.py); each queued record sent carries its ordinal, the n-th record
        # queued since the ring was attached matching the ring's n-th QUEUED marker.
        self._ring = ring
        self._ordinals: list[int] = []
        self._lifecycle = ClientLifecycle()
        self._outbox = Outbox(max_queued_spans, drops, self._warn)
        if fallback is None:  # nothing to send again with: keep no frame for it
            self._outbox.unconfirmed.forget()
        self._metrics = DerivedMetricsLink(self._warn)
        self._reports = ChildReports(self._lifecycle, drops, self._metrics, self._warn,
                                     ring=ring is not None)
        # ``fallback`` makes the in-process export stage should the child not start or die.
        self._fallback = FallbackExport(
            fallback, RowSpanFactory(resource, scope, run_constants), drops)
        self._process = ExporterProcess(exporter_config(
            plan, resource, scope, run_constants, max_queued_spans, max_batch_size,
            interval_seconds), nice=nice, cpus=cpus,
            ring_fd=ring.fd if ring is not None else None)
        self.pid: int | None = self._process.pid
        # Spans the child never confirmed, exported again here after it died.
        self.resent_spans = 0
        if fallback is not None and getattr(plan, "protocol", None) == "grpc":
            import_for_exit_fallback()

    # -- what the rest of the library reads ------------------------------------------------
    @property
    def state(self) -> ClientState:
        """The lifecycle state (lifecycle.py)."""
        return self._lifecycle.state

    @property
    def sent_spans(self) -> int:
        """Spans whose frame went wholly into the pipe."""
        return self._outbox.sent_spans

    @property
    def exported(self) -> int:
        """Spans exported, as the child last reported."""
        return self._reports.exported

    @property
    def delivered(self) -> int:
        """Spans delivered: as the child last reported, and from here after a take-over."""
        stage = self._fallback.stage
        return self._reports.exported + (int(stage.exported) if stage is not None else 0)

    @property
    def export_failures(self) -> int:
        """Failed export requests, as the child last reported."""
        return self._reports.export_failures

    @property
    def startup_cpu_seconds(self) -> float | None:
        """The child's CPU until it was ready (None until it reports)."""
        return self._reports.startup_cpu_seconds

    @property
    def corrupt_report_frames(self) -> int:
        """Frames from the child that could not be read (counted, never silently lost)."""
        return self._reports.corrupt_frames

    @property
    def _proc(self) -> subprocess.Popen[bytes]:
        """The exporter process (tests wait on it)."""
        return self._process.proc

    # -- the derived metrics in the exporter process ---------------------------------------
    def derive_metrics(self, settings: dict[str, Any], self_cost: Any, on_state: Any,
                       feed: Any, take_state: Any = None) -> None:
        """Run the derived-metrics chain (derived/chain.py) in the exporter process.

        From here on every span record sent also feeds the child's chain; its state comes
        back to ``on_state`` once a second and before every flush, sync and stop.
        Should the child die, ``feed`` takes the records it will never see, so the chain
        in this process goes on from the last state. With ``take_state``, records sent
        before the child is ready go through ``feed`` too, and the child gets
        ``take_state()`` once it is (the console prints on time from the first step).
        """
        # The console's lines come back up the pipe: they wake the span worker
        # (``wait_for_io``), so they print on time.
        if self._ring is not None:
            # The ring's steps reach no chain here: the child feeds it from the first step.
            take_state = None
        with self._io_lock:
            self._metrics.attach(self_cost, on_state, feed, take_state)
            if self._lifecycle.child_expected:
                self._outbox.queue(marshal.dumps(("derive", settings)), 0)
            elif self._lifecycle.state is _TAKEN_OVER:
                self._metrics.fed_here = True  # no child to run them

    def sample_when_taken_over(self, sampler: Any) -> None:
        """The tail sampler of this process's chain: it decides what the in-process stage
        exports should the child be given up (until then the child's sampler decides)."""
        self._fallback.sampler = sampler
        # The child's sampler holds user spans back and leaves spans out: it settles spans
        # out of the order they came, so what it did not confirm is no longer the last spans
        # sent. Those are counted lost at its death rather than sent again.
        if sampler is not None:
            with self._io_lock:
                self._outbox.unconfirmed.forget()

    @property
    def derives_metrics(self) -> bool:
        """The child runs the derived metrics now (it was asked to and is alive)."""
        return (self._metrics.attached and not self._metrics.fed_here
                and self._lifecycle.state is not _FORKED)

    def send_gpu_round(self, row: tuple[Any, ...]) -> None:
        """One GPU sampling round for the child's GPU step attributes (sampler thread)."""
        if self._lifecycle.inert:
            return
        with self._io_lock:
            if self._lifecycle.child_expected:
                self._outbox.queue(marshal.dumps(("gpu", tuple(row))), 0)

    def sync(self, timeout_seconds: float) -> bool:
        """Wait until the child's chain has taken every record handed over so far and its
        state is loaded here; False past the timeout (the last state stays)."""
        if not self.derives_metrics or self._lifecycle.inert:
            return True
        deadline = time.monotonic() + max(0.0, timeout_seconds)
        self.end_drain()
        with self._io_lock:
            if not self._lifecycle.child_expected:
                return True
            token = self._reports.next_token()
            self._outbox.queue(marshal.dumps(("sync", token)), 0)
        if self._wait(deadline, lambda: self._reports.answered(token)):
            return self._reports.answer(token)
        return self._lifecycle.state is _TAKEN_OVER  # fed here from the last state

    # -- from the span worker and the training thread ----------------------------------------
    def send_record(self, rec: tuple[Any, ...], spans: int, ordinal: int = -1) -> None:
        """Queue one step's span record (``spans`` spans; with the ring read by the child,
        ``ordinal``: its place among the queued records, -1: none); it goes out at the end
        of the drain."""
        if self._lifecycle.state is _FORKED:
            return
        with self._lock:
            self._recs.append(rec)
            self._rec_spans += spans
            if self._ring is not None:
                self._ordinals.append(ordinal)

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        """Nothing to do at start."""

    def on_end(self, span: ReadableSpan) -> None:
        """A user span from the SDK provider (or held by the sampler): queue it as it is.

        This runs on the thread that ended the span, usually the training thread: its row is
        made at the end of the next drain, in the span worker.
        """
        if self._lifecycle.state is _FORKED:
            return
        ctx = span.context
        if ctx is None or not ctx.trace_flags.sampled:
            return
        with self._lock:
            self._user_spans.append(span)

    def end_drain(self) -> None:
        """Frame what was queued and write what the pipe takes now; read the child's reports."""
        lifecycle = self._lifecycle
        if lifecycle.inert:
            return
        with self._lock:
            recs, user_spans, spans = self._recs, self._user_spans, self._rec_spans
            self._recs, self._user_spans, self._rec_spans = [], [], 0
            ordinals, self._ordinals = self._ordinals, []
        rows = self._rows_of(user_spans)
        link = self._metrics
        if link.fed_here and recs:
            link.feed_here(recs)
        with self._io_lock:
            if lifecycle.state is _TAKEN_OVER:
                self._fallback.send(recs, rows)
                return
            # Until the child is ready, this process feeds the chain (the console's first
            # lines print on time, not when the child is up); the child takes these frames
            # for export only and gets the chain's state once it is ready (``_read``).
            fed = bool(recs) and lifecycle.state is _STARTING and link.feeds_until_ready
            if fed:
                link.feed_here(recs)
            if recs or rows:
                msg: tuple[Any, ...] = ("spans", recs, rows, link.self_cost_ns(), fed)
                if self._ring is not None:
                    msg += (ordinals,)
                self._outbox.queue(marshal.dumps(msg), spans + len(rows))
            self._write()
            self._read()
            self._check_exit()

    def _check_exit(self) -> None:
        """Take over if the child exited unasked (under the I/O lock). Its end of the
        report pipe closed first, so only then is ``waitpid`` asked: each syscall lets go
        of the GIL, and the training thread waits to take it back."""
        if (self._lifecycle.child_expected and self._process.reader.eof
                and self._process.exited()):
            self._child_died()

    def tick(self, reports: bool = True) -> None:
        """Between drains (each look of the span worker): hand over what waits, if anything;
        read the child's reports (counts, console lines, log records) when ``reports`` (the
        report pipe was readable)."""
        if self._user_spans or self._outbox.frames:
            self.end_drain()
        elif self._lifecycle.state in _REPORTS and (reports or self._process.reader.eof):
            with self._io_lock:
                if reports:
                    self._read()
                self._check_exit()

    def wait_for_io(self, seconds: float, wake_fd: int) -> bool:
        """The span worker's sleep: until the child reports (a console line prints on time),
        the pipe takes frames waiting here, ``wake_fd`` is readable, or ``seconds`` pass;
        True when the child's reports are readable."""
        lifecycle = self._lifecycle
        if lifecycle.state not in _REPORTS:
            self._process.wait_for_io(False, seconds, wake_fd, want_reports=False)
            return False
        want_write = bool(self._outbox.frames) and lifecycle.state in _CHILD_READS
        return self._process.wait_for_io(want_write, seconds, wake_fd)

    def _rows_of(self, user_spans: list[ReadableSpan]) -> list[tuple[Any, ...]]:
        """User spans as rows; one that cannot be made a row is counted (``build_error``)."""
        rows = []
        for span in user_spans:
            try:
                row = row_from_span(span)
            except Exception as exc:
                self._drops.add("build_error")
                self._warn.warning("row", "otel-train: could not export a span: %r", exc)
                continue
            if row is not None:
                rows.append(row)
        return rows

    # -- the pipe (under the I/O lock) ---------------------------------------------------------
    def _write(self) -> bool:
        """Write what the pipe takes once the child reads; True when the outbox is empty."""
        if self._lifecycle.state not in _CHILD_READS:
            return not self._outbox.frames
        return self._outbox.write_to(self._process.cmd_fd)

    def _read(self) -> None:
        """Apply the child's reports readable now; once the child is ready, hand it the
        chain's state this process reached (before any frame it is to feed itself)."""
        self._reports.take(self._process.reader.read_available())
        self._outbox.unconfirmed.settled(self._reports.unaccounted(self._outbox.sent_spans))
        if self._lifecycle.state is _READY:
            state = self._metrics.hand_over()
            if state is not None:
                self._outbox.queue(marshal.dumps(("chain_state", state)), 0)

    def _wait(self, deadline: float, done: Callable[[], bool]) -> bool:
        """Write and read until ``done()`` or the deadline, never past it; False if the
        child died or export was taken over meanwhile."""
        lifecycle = self._lifecycle
        while True:
            with self._io_lock:
                if lifecycle.state is _TAKEN_OVER:
                    return False
                empty = self._write()
                self._read()
                if done():
                    return True
                if lifecycle.child_expected and self._process.exited():
                    self._read()  # its last reports may have come with its exit
                    if done():
                        return True
                    self._child_died()  # the caller goes on with the fallback
                    return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._process.wait_for_io(not empty and lifecycle.state in _CHILD_READS,
                                      min(left, 0.05))

    # -- the child gone: this process exports (under the I/O lock) -------------------------
    def _child_died(self) -> None:
        """The child exited unasked: what it never confirmed is exported here again (the
        batch in flight at its death may so reach the collector twice, never not at all);
        what is no longer at hand to send again is counted; export here from now on."""
        code = self._process.proc.returncode
        self._read()
        unaccounted = self._reports.unaccounted(self._outbox.sent_spans)
        # Frames kept since they went into the pipe (none kept in a sampled run, or with no
        # fallback): those the child did not confirm, and what is no longer among them.
        resend, skip, lost = self._outbox.unconfirmed.take(unaccounted)
        self._drops.add("export_failed", lost)
        self._outbox.sent_spans -= unaccounted
        self.resent_spans += unaccounted - lost
        self._warn.warning("died", "otel-train: the exporter process exited (code %s); %d "
                           "spans it had not confirmed delivered are sent again from the "
                           "training process, %d lost (counted); exporting from the training "
                           "process from now on", code, unaccounted - lost, lost)
        self._take_over(resend, skip)

    def _take_over(self, resend: list[tuple[Any, ...]] | None = None, skip: int = 0) -> None:
        """Export from this process from now on, starting with what the child never
        confirmed (``resend``, its first ``skip`` spans settled) and never got."""
        take_over(self._lifecycle, self._process, self._outbox, self._metrics, self._fallback,
                  resend or [], skip)

    # -- flush and shutdown ----------------------------------------------------------------
    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Hand over everything queued and wait until the child has exported it."""
        lifecycle = self._lifecycle
        if lifecycle.inert:
            return True
        deadline = time.monotonic() + timeout_millis / 1000.0
        self.end_drain()
        with self._io_lock:
            token = None
            if lifecycle.state is not _TAKEN_OVER:
                token = self._reports.next_token()
                self._outbox.queue(
                    marshal.dumps(("flush", token, timeout_millis / 1000.0)), 0)
        if token is not None and self._wait(deadline, lambda: self._reports.answered(token)):
            return self._reports.answer(token)
        if lifecycle.state is _TAKEN_OVER:  # before the flush, or the child died meanwhile
            return self._fallback.force_flush(
                max(0, int((deadline - time.monotonic()) * 1000)))
        return False

    def shutdown(self, timeout_seconds: float = 2.0) -> None:  # type: ignore[override]
        """Send what is left, let the child export it within ``timeout_seconds``, then stop it.

        Whatever could not be handed over or exported in time is counted as
        ``shutdown_timeout``; the child is killed if it outlives the deadline.
        """
        lifecycle = self._lifecycle
        if lifecycle.inert:
            return
        deadline = time.monotonic() + max(0.0, timeout_seconds)
        self.end_drain()
        if lifecycle.state is _STARTING and self._fallback.possible:
            self._await_start(deadline)
        if lifecycle.state is not _TAKEN_OVER:
            self._stop_child(deadline)
        if lifecycle.state is _TAKEN_OVER:  # before the stop, or the child died meanwhile
            with self._io_lock:
                lifecycle.close()
            self._fallback.shutdown(deadline - time.monotonic())
        if self._ring is not None:  # the ring's spans no count read here covers: counted
            self._drops.add("shutdown_timeout", self.unsettled_ring_spans())

    def _await_start(self, deadline: float) -> None:
        """A child still starting (a short run, a slow import) gets most of the time left;
        if it is not up by then, it is killed and this process exports what is left."""
        share = max(0.0, deadline - time.monotonic()) * _START_SHARE
        self._wait(time.monotonic() + share, lambda: self._lifecycle.state is not _STARTING)
        with self._io_lock:
            if self._lifecycle.state is _STARTING:
                _log.info("otel-train: the exporter process did not start in time; "
                          "exporting the last spans from the training process")
                self._process.kill()
                self._take_over()

    def _stop_child(self, deadline: float) -> None:
        """Ask the child to export what it holds and stop; count what it did not report."""
        lifecycle = self._lifecycle
        with self._io_lock:
            share = max(0.0, (deadline - time.monotonic()) * _STOP_SHARE - _STOP_MARGIN_SECONDS)
            self._outbox.queue(marshal.dumps(("stop", share)), 0)
        self._wait(deadline, lambda: lifecycle.state is _FINAL)
        if lifecycle.state is _TAKEN_OVER:
            return  # the child died meanwhile: the caller shuts the fallback down
        with self._io_lock:
            lifecycle.close()
            unsent = self._outbox.clear()
        # Ended (killed past the deadline) before its last reports are read: what it
        # counted and settled afterwards cannot be missed here, nor counted twice.
        self._process.stop(deadline - time.monotonic() + 0.05)
        with self._io_lock:
            self._read()
            lost = self._reports.unaccounted(self._outbox.sent_spans)
            self._drops.add("shutdown_timeout", unsent + lost)
            self._process.close_pipes()
        if lost or unsent:
            self._warn.warning("shutdown", "otel-train: %d spans not exported before the "
                               "shutdown deadline (counted)", lost + unsent)

    def after_fork_in_child(self) -> None:
        """In a forked training process: never touch the parent's exporter, close our ends."""
        self._lifecycle.fork()
        self._recs, self._user_spans, self._rec_spans = [], [], 0
        self._ordinals = []
        self._ring = None  # the parent's: never read nor counted here
        self._outbox.forget()
        # Closed so the exporter process sees end-of-file when the parent closes its end,
        # even while forked workers (DataLoader) live on.
        self._process.close_pipes()
