"""The exporter process: span records in, spans exported, counts and log records out.

Started by ``client.ExportProcessClient`` (launch.py) as ``python -I -c`` with two pipe
ends, SIGINT and SIGTERM ignored. The first frame is its configuration (the export plan,
resource, scope, run constants and bounds); then frames of span records and user span rows,
``derive``, ``gpu``, ``flush``, ``sync`` and ``stop``. It feeds the records to
``BoundedBatchSpanProcessor`` with the planned exporter: for OTLP each record is encoded
straight to its Span messages as it arrives (``_Encoder.record``, the bytes its rows would
give), for the span file its rows (span_rows.py) are, exactly as the training process would.
It reports its export and drop counts right after each batch's outcome (before the next
batch), every ``STATS_INTERVAL_SECONDS`` when no batch did, and its log records as they come
(reports.py reads them), and leaves when told to stop, when the pipe closes, or when the
training process is gone.
"""

from __future__ import annotations

import gc
import logging
import marshal
import os
import pickle
import sys
import threading
import time
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_train.common.drop_counter import DropCounter
from otel_train.export.process.pipe import (
    STATS_INTERVAL_SECONDS,
    FrameReader,
    frame,
    write_all,
)
from otel_train.records.span_rows import RowSpanFactory, record_span_count

_log = logging.getLogger("otel_train")
_ORPHAN_CHECK_SECONDS = 0.5
_ORPHAN_FLUSH_SECONDS = 3.0  # the training process died: what the child may still send
# The derived metrics' state goes up once a second (a flush, a sync and the stop send it at
# once): Prometheus scrapes every 15 s or so, and each exchange costs both processes CPU
# (export, marshal, load), so it goes at a scrape's pace rather than with every count report.
_STATE_INTERVAL_SECONDS = 1.0


class _StatWriter:
    """Frames from the exporter process to the training process (one writer at a time)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()

    def send(self, msg: tuple[Any, ...], block: bool = False) -> bool:
        """One frame; unless ``block``, skipped when the pipe is full (counts are cumulative,
        the next report carries them). False if it was not written."""
        data = frame(marshal.dumps(msg))
        with self._lock:
            try:
                # Frames up to PIPE_BUF (4 KiB) are written whole or not at all; a larger
                # one is written blocking, so the stream never holds half a frame.
                block = block or len(data) > 4096
                os.set_blocking(self.fd, block)
                if block:
                    write_all(self.fd, data)
                else:
                    os.write(self.fd, data)
            except OSError:
                return False
        return True


class _PipeLogHandler(logging.Handler):
    """The exporter process's log records go to the training process's ``otel_train``
    logger, where the user's logging configuration applies."""

    def __init__(self, writer: _StatWriter) -> None:
        super().__init__()
        self._writer = writer

    def emit(self, record: logging.LogRecord) -> None:
        """Send one record (its formatted message) up the pipe."""
        try:
            text = record.getMessage()
            if record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
            self._writer.send(("log", record.levelno, text[:3500]), block=True)
        except Exception:
            pass


class _ConsoleStream:
    """The console report's stream here: each printed line goes to the training process,
    which writes it to its own ``sys.stderr`` (where notebooks and tests capture it)."""

    def __init__(self, writer: _StatWriter) -> None:
        self._writer = writer
        self._parts: list[str] = []

    def write(self, text: str) -> int:
        """Keep a part of the line."""
        self._parts.append(text)
        return len(text)

    def flush(self) -> None:
        """Send the line (``print(..., flush=True)`` ends every line with this)."""
        text, self._parts = "".join(self._parts), []
        if text:
            self._writer.send(("console", text[:60000]), block=True)


class _ParentSelfCost:
    """The training process's own CPU so far, as its last frame said (for the overhead)."""

    total_ns = 0


class _Child:
    """The exporter process: rows in, spans exported, counts out."""

    def __init__(self, writer: _StatWriter, config: dict[str, Any]) -> None:
        from otel_train.export.exporters import create_exporter
        from otel_train.export.stage import BoundedBatchSpanProcessor

        self.send = writer.send
        self.drops = DropCounter()
        attrs, schema = config["resource"]
        factory = RowSpanFactory(Resource(attrs, schema), InstrumentationScope(*config["scope"]),
                                 config["run_constants"])
        self.export = BoundedBatchSpanProcessor(
            create_exporter(config["plan"]), self.drops, config["max_queue"], config["batch"],
            config["interval"])
        # The OTLP exporters encode each record straight to its spans' bytes, the span file
        # its rows: no ReadableSpan is made here, the costliest object of the span path.
        self.export.use_rows(factory)
        # Each batch's outcome is reported as soon as it is known, blocking: should this
        # process be killed, the training process knows every span the collector confirmed.
        self.export.on_settled = lambda: self.stats(block=True)
        self._stats_lock = threading.Lock()  # the export and watch threads both report
        self.parent_pid = config["parent_pid"]
        self._last_counts: Any = None  # the counts last sent
        # When the counts were last reported (or found unchanged): the watch thread adds a
        # report only when none went out since its last wake.
        self._counts_at = 0.0
        self._done = threading.Event()
        # Held until the stop: the watch thread waits on it (a lock's timed acquire is one C
        # call; an Event's wait runs a Condition's Python each wake, ~25 us of CPU cold).
        self._watch_sleep = threading.Lock()
        self._watch_sleep.acquire()
        self._writer = writer
        # The derived metrics, when the training process hands them over ("derive").
        self.chain: Any = None
        self.shared: Any = None
        self.sampler: Any = None  # the chain's tail sampler, when the run samples
        self._feed_records: Any = None
        self.rank: Any = None
        self.parent_cost = _ParentSelfCost()
        self._version = 0  # frames fed to the chain
        self._sent_version = 0
        self._state_lock = threading.Lock()
        # step_ring="on" in scope: the ring's descriptor (launch.py passes it), read by a
        # ChildRingFeed made when the "ring" frame comes (ring_feed.py).
        self._ring_fd: int | None = config.get("ring_fd")
        self._resource, self._scope = config["resource"], config["scope"]
        self.ring_feed: Any = None

    def derive(self, settings: dict[str, Any]) -> None:
        """Build the run's derived-metrics chain here, as the training process would."""
        from otel_train.derived.chain import StepChain, feed_records
        from otel_train.records.steps_view import SharedStepSpanProcessor

        self._feed_records = feed_records  # imported only when the chain runs here
        self.chain = StepChain(settings, self.parent_cost,
                               console_stream=_ConsoleStream(self._writer))  # type: ignore[arg-type]
        self.shared = SharedStepSpanProcessor(self.chain.processors)
        self.sampler = self.chain.sampler
        self.rank = settings["rank"]

    def send_state(self) -> None:
        """The chain's state to the training process (only when it changed)."""
        if self.shared is None:
            return
        # One sender at a time (the watch thread, and this thread before a flush, sync or
        # stop), so states reach the training process in the order they were taken.
        with self._state_lock:
            with self.shared.lock:
                version = self._version
                if version == self._sent_version:
                    return
                state = self.chain.export_state()
            self._sent_version = version
            self.send(("derived", state), block=True)

    def stats(self, kind: str = "stats", block: bool = False) -> None:
        """The cumulative counts (sent only when they changed, unless final)."""
        # Spans the tail sampler left out were taken, not lost: the training process counts
        # them as accounted for.
        sampled_out = self.sampler.sampled_out_spans if self.sampler is not None else 0
        # Taken and sent under one lock: counts reach the training process in the order
        # they were taken, never a later one overtaken by an earlier.
        feed = self.ring_feed
        with self._stats_lock:
            # Read once: the ring's settlement and the counts reported agree exactly.
            exported, drops = self.export.exported, self.drops.counts()
            ring = None
            if feed is not None:  # what the stage settled of the ring, freed after the report
                feed.settlement.settle(exported + sum(drops.values()),
                                       partial=self.sampler is None)
                ring = feed.counts()
            now = (exported, self.export.export_failures, drops, sampled_out, ring)
            if kind == "stats" and now == self._last_counts:
                self._counts_at = time.monotonic()
                return
            if not self.send((kind, *now), block):
                return  # not written: the next report carries it, and frees the room
            self._last_counts = now
            self._counts_at = time.monotonic()
            if feed is not None:
                feed.settlement.release_settled()

    def spans(self, recs: list[tuple[Any, ...]], rows: list[tuple[Any, ...]],
              parent_cost_ns: int, fed: bool = False, count: bool = False) -> int:
        """One frame: the steps' records through the chain (if here; not when the training
        process ``fed`` them, before this process was ready), then exported with the user
        spans' rows (unsampled records feed the metrics only). With ``count``: the spans
        handed to the export stage (0 without)."""
        if self.shared is not None and (recs or rows):
            self.parent_cost.total_ns = parent_cost_ns
            with self.shared.lock:
                if not fed:
                    self._feed_records(self.shared, recs, self.rank)  # marks train.slow first
                    self._version += 1
                if self.sampler is not None:  # then the tail decision, on the marked steps
                    recs, rows = self.sampler.filter_frame(recs, rows)
        handed = sum(map(record_span_count, recs)) + len(rows) if count else 0
        self.export.on_records(recs, rows)
        return handed

    def _derive_or_leave(self, settings: dict[str, Any]) -> None:
        """The derived metrics here; if they cannot run, the training process is told, and
        a process given the step ring exits: the ring's steps, built here, would reach no
        metrics, so the training process takes over, reads the ring and feeds its own."""
        try:
            self.derive(settings)
        except Exception as exc:
            self.chain = self.shared = None
            self.send(("derive_failed", repr(exc)), block=True)
            if self._ring_fd is not None:
                self.send(("error", "the step ring is left to the training process"),
                          block=True)
                os._exit(4)

    def read_ring(self, settings: dict[str, Any]) -> None:
        """Read the step ring here from now on (ring_feed.py)."""
        from otel_train.export.process.ring_feed import ChildRingFeed

        if self._ring_fd is None or self.ring_feed is not None:
            return
        feed = ChildRingFeed(self, self._ring_fd, settings, self._resource, self._scope)
        self.ring_feed = feed
        feed.start()

    def take_chain_state(self, state: dict[str, Any]) -> None:
        """The training process fed the chain until this process was ready: go on from its
        state (the tail sampler's own, which decided on those frames here, is kept)."""
        if self.shared is None:
            return
        with self.shared.lock:
            self.chain.load_state({k: v for k, v in state.items() if k != "sampler"})
            self._version += 1

    def stop(self, timeout_seconds: float) -> None:
        """Export what is queued within ``timeout_seconds``, report the final counts."""
        if self._done.is_set():
            return
        self._done.set()
        self._watch_sleep.release()  # the watch thread leaves
        deadline = time.monotonic() + timeout_seconds
        if self.ring_feed is not None:  # the ring to its head, then every frame at hand
            self.ring_feed.finish(time.monotonic() + timeout_seconds * 0.5)
        if self.sampler is not None:  # spans still waiting for their step: exported
            with self.shared.lock:
                left = self.sampler.release_held()
                summaries = self.sampler.take_summaries(final=True)  # summary mode's last
            self.export.on_records(summaries, left)
        self.send_state()  # final: no step comes after a stop
        self.export.shutdown(max(0.0, deadline - time.monotonic()))
        self.stats("final", block=True)

    def handle(self, msg: tuple[Any, ...]) -> bool:
        """One frame from the training process; False once it said stop."""
        kind = msg[0]
        feed = self.ring_feed
        if kind in ("flush", "sync") and feed is not None:
            # The ring's steps so far are part of what is flushed (or synced): bounded.
            feed.catch_up(time.monotonic() + (min(1.0, msg[2] / 2) if kind == "flush"
                                              else 0.5))
        if kind == "spans":
            if feed is not None:  # in order with the ring's steps, at their markers
                feed.add_frame(msg[1], msg[2], msg[3], msg[5] if len(msg) > 5 else None)
            else:
                self.spans(msg[1], msg[2], msg[3], len(msg) > 4 and msg[4])
        elif kind == "chain_state":
            self.take_chain_state(msg[1])
        elif kind == "flush":
            self.send_state()
            ok = self.export.force_flush(int(msg[2] * 1000))
            self.stats(block=True)
            self.send(("flushed", msg[1], ok), block=True)
        elif kind == "sync":  # run.costs(): the chain's state now, nothing exported
            self.send_state()
            if feed is not None:  # the ring's steps' own cost, before the answer
                self.stats(block=True)
            self.send(("flushed", msg[1], True), block=True)
        elif kind == "derive":
            self._derive_or_leave(msg[1])
            gc.freeze()  # the chain's modules and objects too (see child_main)
        elif kind == "ring":
            try:
                self.read_ring(pickle.loads(msg[1]))
            except Exception as exc:
                # Nobody else would read the ring: exit, so that the training process takes
                # over and reads it itself (what this process held is sent again from there).
                self.send(("error", f"could not read the step ring: {exc!r}"), block=True)
                os._exit(4)
        elif kind == "ring_skip":
            if feed is not None:
                feed.skip(msg[1])
        elif kind == "collectives":
            if feed is not None:
                feed.add_collectives(msg[1], msg[2])
        elif kind == "ring_ready":
            if feed is not None:
                feed.set_ready(msg[1])
        elif kind == "gpu":
            if self.chain is not None:
                self.chain.gpu_steps.add_round(tuple(msg[1]))
        elif kind == "stop":
            self.stop(msg[1])
            return False
        return True

    def watch(self) -> None:
        """Every 0.25 s: the counts, unless a report went out since the last wake (the
        export thread reports after each batch), so they are never more than two wakes old;
        the derived state every second; if the training process is gone, flush briefly
        and exit."""
        state_every = max(1, round(_STATE_INTERVAL_SECONDS / STATS_INTERVAL_SECONDS))
        orphan_every = max(1, int(_ORPHAN_CHECK_SECONDS / STATS_INTERVAL_SECONDS))
        checks = 0
        woke = time.monotonic()
        while not self._watch_sleep.acquire(True, STATS_INTERVAL_SECONDS):
            if self._counts_at < woke:  # no report since the last wake's
                self.stats()
            woke = time.monotonic()
            checks += 1
            if checks % state_every == 0:
                self.send_state()
            if checks % orphan_every == 0 and os.getppid() != self.parent_pid:
                self.stop(_ORPHAN_FLUSH_SECONDS)
                os._exit(0)


def child_main(cmd_fd: int, stat_fd: int) -> None:
    """Entry point of the exporter process (launch.py's ``python -I -c``)."""
    reader = FrameReader(cmd_fd)
    raw = reader.read_one()
    if raw is None:
        return
    config = pickle.loads(raw)
    writer = _StatWriter(stat_fd)
    log = logging.getLogger("otel_train")
    log.setLevel(config.get("log_level", logging.WARNING))
    log.addHandler(_PipeLogHandler(writer))
    log.propagate = False
    try:
        child = _Child(writer, config)
    except Exception as exc:
        writer.send(("error", f"could not start: {exc!r}"), block=True)
        sys.exit(3)
    # Start-up (interpreter, imports, the exporter) apart from the per-step work after it.
    writer.send(("startup", time.process_time()), block=True)
    child.stats("stats", block=True)  # ready: the exporter is made
    # What start-up made (modules, the exporter) lives as long as the process: kept out of
    # the collector's passes, whose full pass would otherwise walk all of it every ~15,000
    # steps (~20 ms each). The per-step objects (a frame's records, views, encoded spans)
    # are freed by reference counting; a young pass every 700 allocations only walked the
    # frame in flight again and again, so it runs every 50,000. Together 1.3-4.4 -> 0.4 us
    # a step (benchmarks/bench_processors.py --live prints the collector's share).
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    threading.Thread(target=child.watch, name="otel-train-export-watch", daemon=True).start()
    while True:
        raw = reader.read_one()
        if raw is None:  # the training process closed the pipe without a stop (it died)
            child.stop(_ORPHAN_FLUSH_SECONDS)
            break
        if not child.handle(marshal.loads(raw)):
            break
    os._exit(0)  # skip interpreter teardown: everything is flushed and reported
