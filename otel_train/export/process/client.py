"""Span export in a process of its own, out of the training process's GIL.

In CPython every microsecond the background spends building ``ReadableSpan``s and encoding
OTLP holds the GIL the training thread needs: measured here, 100-250 µs of stall per step on
a ~1 ms step (``benchmarks/bench_hot_path.py``). With this module the training process only
turns each step into a span record (span_rows.py), feeds it to the derived metrics, and writes
the records down a pipe, one ``marshal``-ed frame per drain. A child Python process started
with the run does the rest with the code the in-process path uses: records ->
``BoundedBatchSpanProcessor.on_records`` -> the planned exporter (OTLP gRPC/HTTP or the span
file, encoding the records' rows directly, no ``ReadableSpan`` made), with the same
retries, bounds and drop counting.

Promises kept:

- bounded: frames the child has not read wait in this process up to ``max_queued_spans``
  spans; beyond, the oldest are dropped and counted (``export_queue_full``); the pipe never
  blocks training or the worker (non-blocking writes);
- counted: the child reports its export and drop counts; they land in this process's
  ``DropCounter`` (``otel_train_spans_dropped_total``). Spans sent but never reported on (the
  child died) are counted too;
- the same exit bounds: ``shutdown(timeout)`` hands the child what is left and its share of
  the time; past the deadline the child is killed and what it held is counted;
- faults: the child ignores SIGINT/SIGTERM (the launcher's signal reaches the training
  process, whose shutdown then flushes through the child) and exits when the pipe closes or
  the training process is gone; if the child cannot start or dies, export falls back to the
  in-process stage, with a warning; a forked training process's child copies are inert.

Usage::

    client = ExportProcessClient(plan, resource, scope, run_constants, drops, options)
    client.send_record(rec, spans); client.end_drain()   # from the span worker
    client.on_end(readable_span)                      # user spans (SDK provider)
    client.force_flush(5000); client.shutdown(2.0)
"""

from __future__ import annotations

import errno
import json
import logging
import marshal
import os
import pickle
import select
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client.metrics_core import CounterMetricFamily, Metric

from otel_train.common.drop_counter import DropCounter
from otel_train.export.process.pipe import (
    HEADER,
    STATS_INTERVAL_SECONDS,
    FrameReader,
    frame,
    write_all,
)
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.records.span_rows import RowSpanFactory, record_span_count, row_from_span

_log = logging.getLogger("otel_train")
_BOOT = ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
         "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "import json, sys; sys.path[:0] = json.loads(sys.argv[3]); "
         "from otel_train.export.process.child import child_main; "
         "child_main(int(sys.argv[1]), int(sys.argv[2]))")


class ExportProcessClient(SpanProcessor):
    """The training process's side: rows down a pipe to the exporter process, counts back."""

    def __init__(self, plan: Any, resource: Resource, scope: InstrumentationScope,
                 run_constants: dict[str, Any], drops: DropCounter, max_queued_spans: int,
                 max_batch_size: int, interval_seconds: float,
                 fallback: Any = None) -> None:
        self._drops = drops
        self._max_queued = max_queued_spans
        self._warn = RateLimitedLogger(_log)
        self._factory = RowSpanFactory(resource, scope, run_constants)
        # Builds the in-process export stage if the child cannot start or dies.
        self._make_fallback = fallback
        self._fallback: Any = None
        self._lock = threading.Lock()  # rows from the worker and user spans from training
        self._io_lock = threading.Lock()  # the pipe, the outbox and the counts
        self._recs: list[tuple[Any, ...]] = []  # span records (span_rows.py) of steps
        self._rec_spans = 0
        self._user_spans: list[ReadableSpan] = []  # SDK spans, made rows in end_drain
        self._outbox: deque[list[Any]] = deque()  # [frame view, span count]
        self._outbox_spans = 0
        self.sent_spans = 0  # spans whose frame went wholly into the pipe
        self._child_sampled_out = 0  # of those, left out by the child's tail sampler
        self.exported = 0  # as the child last reported
        self.export_failures = 0
        self._child_drops: dict[str, int] = {}
        self._flushed: dict[int, bool] = {}
        self._token = 0
        self._final = False
        self._ready = False  # the child reported once: its exporter is made
        self.startup_cpu_seconds: float | None = None  # the child's CPU until it was ready
        self._next_read = 0.0  # monotonic: when tick() reads the child's reports next
        self._forked = False
        self._closed = False
        self._took_over = False  # the child died or never started: this process exports
        # The derived metrics, when the exporter process runs them (derive_metrics).
        self._self_cost: Any = None
        self._on_state: Any = None
        self._feed: Any = None
        # This process feeds them: the child could not run them, or export was taken over.
        self._feed_here = False
        self.pid: int | None = None
        config = {
            "plan": plan,
            "resource": (dict(resource.attributes), resource.schema_url),
            "scope": (scope.name, scope.version, scope.schema_url),
            "run_constants": run_constants,
            "max_queue": max_queued_spans, "batch": max_batch_size,
            "interval": interval_seconds, "parent_pid": os.getpid(),
            "log_level": _log.getEffectiveLevel(),
        }
        # os.pipe() descriptors are not inherited across exec; the child gets its two ends
        # through pass_fds only.
        cmd_r, self._cmd_w = os.pipe()
        self._stat_r, stat_w = os.pipe()
        try:
            self._proc = subprocess.Popen(
                # -I: no PYTHONPATH, user site or script dir (the parent's sys.path comes
                # in argv), so a sitecustomize such as opentelemetry-instrument's does not
                # instrument the exporter itself, and start-up stays short.
                [sys.executable, "-I", "-c", _BOOT, str(cmd_r), str(stat_w),
                 json.dumps([p for p in sys.path if isinstance(p, str)])],
                # Its own session: a terminal's Ctrl-C or a launcher's signal to the process
                # group is for training, whose shutdown then flushes through this child.
                pass_fds=(cmd_r, stat_w), stdin=subprocess.DEVNULL, close_fds=True,
                start_new_session=True)
        except BaseException:
            self._close_fds()
            raise
        finally:
            os.close(cmd_r)
            os.close(stat_w)
        self.pid = self._proc.pid
        # The config goes first, blocking (the pipe is empty and it is small); then the pipe
        # turns non-blocking: from here on nothing this process does may wait on the child.
        write_all(self._cmd_w, frame(pickle.dumps(config)))
        os.set_blocking(self._cmd_w, False)
        os.set_blocking(self._stat_r, False)
        self._reader = FrameReader(self._stat_r)
        if fallback is not None and getattr(plan, "protocol", None) == "grpc":
            _import_for_exit_fallback()

    # -- the derived metrics in the exporter process -------------------------------------
    def derive_metrics(self, settings: dict[str, Any], self_cost: Any, on_state: Any,
                       feed: Any) -> None:
        """Run the derived-metrics chain (derived_chain.py) in the exporter process.

        From here on every span record sent also feeds the child's chain; its state comes
        back to ``on_state`` once a second and before every flush, sync and stop.
        Should the child die, ``feed`` takes the records it will never see, so the chain
        in this process goes on from the last state.
        """
        with self._io_lock:
            self._self_cost, self._on_state, self._feed = self_cost, on_state, feed
            if not self._took_over:
                self._queue_frame(marshal.dumps(("derive", settings)), 0)

    @property
    def derives_metrics(self) -> bool:
        """The child runs the derived metrics now (it was asked to and is alive)."""
        return self._feed is not None and not self._feed_here and not self._forked

    def send_gpu_round(self, row: tuple[Any, ...]) -> None:
        """One GPU sampling round for the child's GPU step attributes (sampler thread)."""
        if self._forked or self._closed:
            return
        with self._io_lock:
            if not self._took_over:
                self._queue_frame(marshal.dumps(("gpu", tuple(row))), 0)

    def sync(self, timeout_seconds: float) -> bool:
        """Wait until the child's chain has taken every record handed over so far and its
        state is loaded here; False past the timeout (the last state stays)."""
        if not self.derives_metrics or self._closed:
            return True
        deadline = time.monotonic() + max(0.0, timeout_seconds)
        self.end_drain()
        with self._io_lock:
            if self._took_over:
                return True
            self._token += 1
            token = self._token
            self._queue_frame(marshal.dumps(("sync", token)), 0)
        if self._wait(deadline, lambda empty: token in self._flushed):
            return self._flushed.pop(token, False)
        return self._took_over

    # -- from the span worker and the training thread -----------------------------------
    def send_record(self, rec: tuple[Any, ...], spans: int) -> None:
        """Queue one step's span record (``spans`` spans); it goes out at the end of the drain."""
        if self._forked:
            return
        with self._lock:
            self._recs.append(rec)
            self._rec_spans += spans

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        """Nothing to do at start."""

    def on_end(self, span: ReadableSpan) -> None:
        """A user span from the SDK provider (or held by the sampler): queue it as it is.

        This runs on the thread that ended the span, usually the training thread: its row is
        made at the end of the next drain, in the span worker.
        """
        if self._forked:
            return
        ctx = span.context
        if ctx is None or not ctx.trace_flags.sampled:
            return
        with self._lock:
            self._user_spans.append(span)

    def end_drain(self) -> None:
        """Frame what was queued and write what the pipe takes now; read the child's counts."""
        if self._forked or self._closed:
            return
        with self._lock:
            recs, user_spans, spans = self._recs, self._user_spans, self._rec_spans
            self._recs, self._user_spans, self._rec_spans = [], [], 0
        rows = []
        for span in user_spans:
            try:
                rows.append(row_from_span(span))
            except Exception as exc:
                self._drops.add("build_error")
                self._warn.warning("row", "otel-train: could not export a span: %r", exc)
        rows = [r for r in rows if r is not None]
        if self._feed_here and recs:
            self._feed_locally(recs)
        with self._io_lock:
            if self._took_over:
                self._to_fallback(recs, rows)
                return
            if recs or rows:
                # The training process's own cost so far, for the child's overhead figures.
                cost = self._self_cost.total_ns if self._self_cost is not None else 0
                self._queue_frame(marshal.dumps(("spans", recs, rows, cost)),
                                  spans + len(rows))
            self._pump()
            self._read_counts()
            if self._proc.poll() is not None and not self._final:
                self._child_died()

    def tick(self) -> None:
        """Between drains (every poll of the span worker): hand over what waits, if anything;
        read the child's counts and log records a few times a second."""
        now = time.monotonic()
        if self._user_spans or self._outbox or now >= self._next_read:
            self._next_read = now + STATS_INTERVAL_SECONDS
            self.end_drain()

    # -- the pipe ---------------------------------------------------------------------------
    def _queue_frame(self, payload: bytes, spans: int) -> None:
        # [bytes left to write, spans in the frame, partly written?]
        self._outbox.append([memoryview(frame(payload)), spans, False])
        self._outbox_spans += spans
        # Bounded: the oldest whole frames of spans go first (the newest are the most
        # useful; the newest frame, one drain's spans, always stays); a frame partly in the
        # pipe must finish, or the stream would break. A control frame evicts nothing.
        while spans and self._outbox_spans > self._max_queued:
            victim = next((f for f in self._outbox if f[1] and not f[2]), None)
            if victim is None or victim is self._outbox[-1]:  # the newest frame stays
                break
            self._outbox.remove(victim)
            self._outbox_spans -= victim[1]
            self._drops.add("export_queue_full", victim[1])
            self._warn.warning(
                "queue", "otel-train: the exporter process is not keeping up (%d spans "
                "waiting); dropping the oldest spans (counted in "
                "otel_train_spans_dropped_total)", self._max_queued)

    def _pump(self) -> bool:
        """Write what the pipe takes without blocking; True when the outbox is empty."""
        box = self._outbox
        if not self._ready:
            # Frames wait here until the child has made its exporter: if it never does,
            # they are all still at hand to export from this process (_take_over).
            return not box
        while box:
            head = box[0]
            try:
                n = os.write(self._cmd_w, head[0])
            except BlockingIOError:
                return False
            except OSError as exc:  # the child is gone (EPIPE)
                if exc.errno != errno.EPIPE:
                    self._warn.warning("pipe", "otel-train: exporter pipe: %r", exc)
                return False
            head[0] = head[0][n:]
            head[2] = True
            if not head[0]:
                box.popleft()
                self._outbox_spans -= head[1]
                self.sent_spans += head[1]
        return True

    def _read_counts(self) -> None:
        for raw in self._reader.read_available():
            try:
                msg = marshal.loads(raw)
            except Exception:
                continue
            kind = msg[0]
            if kind in ("stats", "final"):
                self._ready = True
                self._apply_stats(msg[1], msg[2], msg[3], msg[4])
                if kind == "final":
                    self._final = True
            elif kind == "startup":
                self.startup_cpu_seconds = float(msg[1])
            elif kind == "flushed":
                self._flushed[msg[1]] = bool(msg[2])
            elif kind == "log":  # the child's own (rate-limited) log records, re-logged here
                _log.log(msg[1], "%s", msg[2])
            elif kind == "derived":
                self._load_state(msg[1])
            elif kind == "derive_failed":
                self._feed_here = True
                _log.warning("otel-train: the exporter process could not run the derived "
                             "metrics (%s); they run in the training process from now on "
                             "(steps handed over before this are not in them)", msg[1])
            elif kind == "console":  # the child's console lines: to this process's stderr
                try:
                    sys.stderr.write(msg[1])
                    sys.stderr.flush()
                except Exception:
                    pass
            elif kind == "error":
                self._warn.warning("child", "otel-train: the exporter process: %s", msg[1])

    def _load_state(self, state: Any) -> None:
        if self._on_state is None or self._took_over:
            return
        try:
            self._on_state(state)
        except Exception as exc:
            self._warn.warning("state", "otel-train: could not load the exporter process's "
                               "metrics state: %r", exc)

    def _apply_stats(self, exported: int, failures: int, drops: dict[str, int],
                     sampled_out: int) -> None:
        self.exported = exported
        self._child_sampled_out = sampled_out  # taken by the child, never to be exported
        self.export_failures = failures
        for reason in set(drops) | set(self._child_drops):
            delta = drops.get(reason, 0) - self._child_drops.get(reason, 0)
            if delta > 0:
                self._drops.add(reason, delta)
            elif delta < 0:
                self._drops.retract(reason, -delta)
        self._child_drops = dict(drops)

    def _unaccounted(self) -> int:
        return max(0, self.sent_spans - self.exported - sum(self._child_drops.values())
                   - self._child_sampled_out)

    def _child_died(self) -> None:
        """The child exited unasked: count what it held, export in this process from now."""
        code = self._proc.returncode
        self._read_counts()
        lost = self._unaccounted()
        self._drops.add("export_failed", lost)
        self.sent_spans -= lost
        self._warn.warning("died", "otel-train: the exporter process exited (code %s); %d "
                           "spans it held are lost (counted); exporting from the training "
                           "process from now on", code, lost)
        self._take_over()

    def _take_over(self) -> None:
        """Export from this process from now on, starting with what the child never got."""
        fed = self._feed_here  # the frames still here were fed when they were queued
        self._took_over = True
        self._feed_here = self._feed is not None
        self._close_fds()
        try:
            self._fallback = self._make_fallback() if self._make_fallback is not None else None
            if self._fallback is not None:
                self._fallback.use_rows(self._factory)
        except Exception as exc:  # never into training, nor into its exit; counted below
            self._fallback = None
            _log.warning("otel-train: could not export from the training process either: "
                         "%r; the spans the exporter process did not take are lost "
                         "(counted)", exc)
        left = [_frame_spans(item[0]) for item in self._outbox if not item[2]]
        cut = sum(item[1] for item in self._outbox if item[2])  # half in the dead pipe
        self._drops.add("export_failed", cut)
        self._outbox.clear()
        self._outbox_spans = 0
        for recs, rows in left:
            if self._feed_here and not fed and recs:
                self._feed_locally(recs)  # the child never saw them
            self._to_fallback(recs, rows)
        if self._feed_here and not fed and self._ready:
            # (A child that never started took no step: every step was fed here, above.)
            _log.warning("otel-train: the derived metrics go on in the training process from "
                         "the exporter process's last state (steps it took since are not "
                         "in them)")

    def _feed_locally(self, recs: list[tuple[Any, ...]]) -> None:
        try:
            self._feed(recs)  # the chain here goes on from the child's last state
        except Exception as exc:
            self._warn.warning("feed", "otel-train: derived metrics failed: %r", exc)

    def _to_fallback(self, recs: list[tuple[Any, ...]], rows: list[tuple[Any, ...]]) -> None:
        """Export a frame from this process (its metrics are fed by the caller)."""
        if self._fallback is None:
            self._drops.add("export_failed",
                            sum(record_span_count(r) for r in recs) + len(rows))
        else:
            self._fallback.on_records(recs, rows)  # as the child would (export.py)

    def _wait(self, deadline: float, done: Any) -> bool:
        """Pump and read until ``done()`` or the deadline; never past it."""
        while True:
            with self._io_lock:
                empty = self._pump()
                self._read_counts()
                if done(empty):
                    return True
                if self._proc.poll() is not None and not self._final:
                    self._read_counts()
                    if done(empty):
                        return True
                    self._child_died()  # the caller goes on with the fallback
                    return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            wfds = [self._cmd_w] if not empty and self._ready else []
            try:
                select.select([self._stat_r], wfds, [], min(left, 0.05))
            except (OSError, ValueError):
                time.sleep(min(left, 0.01))

    # -- flush and shutdown ----------------------------------------------------------------
    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Hand over everything queued and wait until the child has exported it."""
        if self._forked or self._closed:
            return True
        if self._fallback is not None:
            self.end_drain()
            return bool(self._fallback.force_flush(timeout_millis))
        deadline = time.monotonic() + timeout_millis / 1000.0
        self.end_drain()
        with self._io_lock:
            if self._fallback is not None:
                return bool(self._fallback.force_flush(timeout_millis))
            self._token += 1
            token = self._token
            self._queue_frame(marshal.dumps(("flush", token, timeout_millis / 1000.0)), 0)
        if self._wait(deadline, lambda empty: token in self._flushed):
            return self._flushed.pop(token, False)
        if self._fallback is not None:  # the child died meanwhile
            return bool(self._fallback.force_flush(
                max(0, int((deadline - time.monotonic()) * 1000))))
        return False

    def shutdown(self, timeout_seconds: float = 2.0) -> None:  # type: ignore[override]
        """Send what is left, let the child export it within ``timeout_seconds``, then stop it.

        Whatever could not be handed over or exported in time is counted as
        ``shutdown_timeout``; the child is killed if it outlives the deadline.
        """
        if self._forked or self._closed:
            return
        deadline = time.monotonic() + max(0.0, timeout_seconds)
        self.end_drain()
        if self._fallback is not None:
            self._closed = True
            self._fallback.shutdown(max(0.0, deadline - time.monotonic()))
            return
        if not self._ready and self._make_fallback is not None:
            # Still starting (a short run, a slow import): give it most of the time, since it
            # has the exporter half made, then export what is left from this process (which
            # must import and connect an exporter of its own) rather than lose it.
            self._wait(time.monotonic() + max(0.0, deadline - time.monotonic()) * 0.6,
                       lambda empty: self._ready)
            if not self._ready:
                if not self._took_over:  # (taken over already if it died meanwhile)
                    with self._io_lock:
                        _log.info("otel-train: the exporter process did not start in time; "
                                  "exporting the last spans from the training process")
                        self._proc.kill()
                        self._take_over()
                self._closed = True
                if self._fallback is not None:  # None: it could not be made (counted)
                    self._fallback.shutdown(max(0.0, deadline - time.monotonic()))
                return
        with self._io_lock:
            # The child gets the time left minus a margin to report its final counts.
            share = max(0.0, (deadline - time.monotonic()) * 0.85 - 0.05)
            self._queue_frame(marshal.dumps(("stop", share)), 0)
        self._wait(deadline, lambda empty: self._final)
        if self._fallback is not None:  # the child died meanwhile: export from here
            self._closed = True
            self._fallback.shutdown(max(0.0, deadline - time.monotonic()))
            return
        with self._io_lock:
            self._closed = True
            unsent = self._outbox_spans
            self._outbox.clear()
            self._outbox_spans = 0
            self._drops.add("shutdown_timeout", unsent)
            self._read_counts()
            lost = self._unaccounted()
            self._drops.add("shutdown_timeout", lost)
            self._close_fds()
        try:
            self._proc.wait(max(0.0, deadline - time.monotonic()) + 0.05)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            try:
                self._proc.wait(1.0)
            except subprocess.TimeoutExpired:
                pass
        if lost or unsent:
            self._warn.warning("shutdown", "otel-train: %d spans not exported before the "
                               "shutdown deadline (counted)", lost + unsent)

    def _close_fds(self) -> None:
        for name in ("_cmd_w", "_stat_r"):
            fd = getattr(self, name, -1)
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
                setattr(self, name, -1)

    def after_fork_in_child(self) -> None:
        """In a forked training process: never touch the parent's exporter, close our ends."""
        self._forked = True
        self._recs, self._user_spans = [], []
        self._outbox = deque()
        # Closed so the exporter process sees end-of-file when the parent closes its end,
        # even while forked workers (DataLoader) live on.
        self._close_fds()


def _import_for_exit_fallback() -> None:
    """Import now what making the gRPC exporter in this process would import at exit."""
    # The gRPC exporter's module imports opentelemetry.sdk._logs, whose import makes a
    # Resource through a thread pool, and Python refuses new pool work once interpreter
    # exit has begun: a short run whose exporter process had not started yet takes over at
    # exit (the atexit shutdown), and making its exporter there raised and lost every span.
    # This import costs ~8 ms; grpc itself stays unimported here.
    try:
        import opentelemetry.sdk._logs  # noqa: F401
    except Exception as exc:  # an SDK without it: nothing to prepare
        _log.debug("otel-train: opentelemetry.sdk._logs: %r", exc)


METRIC_EXPORTER_CPU = "otel_train_exporter_process_cpu_seconds_total"


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class ExporterProcessCpuCollector:
    """Prometheus collector: the exporter process's CPU (it holds no GIL of the training
    process, but it is the library's cost all the same)."""

    def __init__(self, client: ExportProcessClient, rank: Any) -> None:
        self._client = client
        self._rank = str(rank)
        self._last = 0.0

    def startup_cpu_seconds(self) -> float | None:
        """Of that, the CPU its start-up took (interpreter, imports, the exporter)."""
        return self._client.startup_cpu_seconds

    def cpu_seconds(self) -> float | None:
        """The exporter process's CPU seconds so far (its last reading once it has exited),
        or None if it was never readable."""
        pid = self._client.pid
        seconds = process_cpu_seconds(pid) if pid is not None else None
        if seconds is None and not self._last:
            return None
        self._last = max(self._last, seconds or 0.0)
        return self._last

    def collect(self) -> Iterator[Metric]:
        """One counter family while the exporter process is (or was) readable."""
        if self.cpu_seconds() is None:
            return
        fam = CounterMetricFamily(
            METRIC_EXPORTER_CPU, "CPU time of otel-train's exporter process (span building, "
            "encoding and sending, out of the training process's GIL).", labels=["rank"])
        fam.add_metric([self._rank], self._last)
        yield fam


def _frame_spans(view: memoryview) -> tuple[list[Any], list[Any]]:
    """(span records, user span rows) of a frame not yet written (its header intact)."""
    try:
        data = bytes(view)
        (size,) = HEADER.unpack_from(data, 0)
        msg = marshal.loads(data[4:4 + size])
        return (list(msg[1]), list(msg[2])) if msg[0] == "spans" else ([], [])
    except Exception:
        return [], []


