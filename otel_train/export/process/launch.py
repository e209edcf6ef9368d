"""Starting and stopping the exporter process, and this process's ends of its two pipes.

The child is ``python -I -c`` (child.py's ``child_main``) with two pipe ends: commands down
one, reports up the other, niced by ``export_process_nice`` (its CPU then yields to the
training process's threads when they compete for a core). Its configuration is the first
frame, written blocking while the pipe is empty; then both ends turn non-blocking, so nothing
this process does waits on the child.

Usage::

    process = ExporterProcess(exporter_config(plan, resource, scope, constants, ...), nice=10)
    process.cmd_fd; process.reader.read_available()
    process.close_pipes(); process.stop(seconds)
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import select
import subprocess
import sys
import time
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_train.export.process.pipe import FrameReader, frame, write_all

_log = logging.getLogger("otel_train")
# Signals are ignored before anything is imported: the launcher's SIGINT/SIGTERM are for the
# training process, whose shutdown flushes through the child; the child leaves when the pipe
# closes or the training process is gone.
# The niceness comes next, before the imports, so the child's start-up yields to training too
# (threads it starts later inherit it).
_BOOT = ("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN); "
         "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "import json, os, sys; int(sys.argv[4]) and os.nice(int(sys.argv[4])); "
         "sys.path[:0] = json.loads(sys.argv[3]); "
         "from otel_train.export.process.child import child_main; "
         "child_main(int(sys.argv[1]), int(sys.argv[2]))")


def exporter_config(plan: Any, resource: Resource, scope: InstrumentationScope,
                    run_constants: dict[str, Any], max_queued_spans: int, max_batch_size: int,
                    interval_seconds: float) -> dict[str, Any]:
    """The child's configuration (its first frame, pickled)."""
    return {
        "plan": plan,
        "resource": (dict(resource.attributes), resource.schema_url),
        "scope": (scope.name, scope.version, scope.schema_url),
        "run_constants": run_constants,
        "max_queue": max_queued_spans, "batch": max_batch_size,
        "interval": interval_seconds, "parent_pid": os.getpid(),
        "log_level": _log.getEffectiveLevel(),
    }


class ExporterProcess:
    """The running child and this process's non-blocking ends of its pipes."""

    def __init__(self, config: dict[str, Any], nice: int = 0,
                 cpus: frozenset[int] | None = None, ring_fd: int | None = None) -> None:
        # os.pipe() descriptors are not inherited across exec; the child gets its two ends
        # through pass_fds only, and the step ring's descriptor (step_ring="on": the child
        # maps the same memory, ring_feed.py) the same way, under the same number.
        extra_fds = () if ring_fd is None else (ring_fd,)
        if ring_fd is not None:
            config = {**config, "ring_fd": ring_fd}
        cmd_r, self.cmd_fd = os.pipe()
        report_fd, report_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                # -I: no PYTHONPATH, user site or script dir (the parent's sys.path comes
                # in argv), so a sitecustomize such as opentelemetry-instrument's does not
                # instrument the exporter itself, and start-up stays short.
                [sys.executable, "-I", "-c", _BOOT, str(cmd_r), str(report_w),
                 json.dumps([p for p in sys.path if isinstance(p, str)]), str(int(nice))],
                # Its own session: a terminal's Ctrl-C or a launcher's signal to the process
                # group is for training, whose shutdown then flushes through this child.
                pass_fds=(cmd_r, report_w, *extra_fds), stdin=subprocess.DEVNULL, close_fds=True,
                start_new_session=True)
        except BaseException:
            _close(self.cmd_fd)
            _close(report_fd)
            raise
        finally:
            os.close(cmd_r)
            os.close(report_w)
        self.pid: int = self.proc.pid
        if cpus:  # option background_cpus: set before the child starts a thread, which
            try:  # inherits it
                os.sched_setaffinity(self.pid, cpus)
            except OSError:  # the child has already exited: its start-up failure is reported
                pass
        write_all(self.cmd_fd, frame(pickle.dumps(config)))
        os.set_blocking(self.cmd_fd, False)
        os.set_blocking(report_fd, False)
        self.reader = FrameReader(report_fd)

    def exited(self) -> bool:
        """The child has exited (reaped here)."""
        return self.proc.poll() is not None

    def wait_for_io(self, want_write: bool, seconds: float, wake_fd: int = -1,
                    want_reports: bool = True) -> bool:
        """Sleep until a report can be read (with ``want_reports``; never at end of file),
        the command pipe written (``want_write``) or ``wake_fd`` read, ``seconds`` at most;
        True when a report can be read."""
        reader = self.reader
        report_fd = reader.fd if want_reports and not reader.eof else -1
        rfds = [fd for fd in (report_fd, wake_fd) if fd >= 0]
        wfds = [self.cmd_fd] if want_write and self.cmd_fd >= 0 else []
        try:
            readable, _, _ = select.select(rfds, wfds, [], seconds)
        except (OSError, ValueError):  # a pipe closed meanwhile (a take-over)
            if wake_fd >= 0:
                select.select([wake_fd], [], [], seconds)
            else:
                time.sleep(min(seconds, 0.01))
            return False
        return report_fd >= 0 and report_fd in readable

    def close_pipes(self) -> None:
        """Close this process's ends: the child reads end-of-file, and no read here can reach
        a descriptor number the process reuses later."""
        _close(self.cmd_fd)
        _close(self.reader.fd)
        self.cmd_fd = self.reader.fd = -1

    def kill(self) -> None:
        """Kill the child now."""
        self.proc.kill()

    def stop(self, seconds: float) -> None:
        """Let the child exit within ``seconds``; kill it past them."""
        try:
            self.proc.wait(max(0.0, seconds))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            try:
                self.proc.wait(1.0)
            except subprocess.TimeoutExpired:
                pass


def _close(fd: int) -> None:
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass


def import_for_exit_fallback() -> None:
    """Import now what making the gRPC exporter in this process would import at exit."""
    # The gRPC exporter's module imports opentelemetry.sdk._logs, whose import makes a
    # Resource through a thread pool, and Python refuses new pool work once interpreter exit
    # has begun: a short run whose exporter process is not up yet takes over at exit (the
    # atexit shutdown), where making that exporter would raise and lose every span. grpc
    # itself stays unimported here.
    try:
        import opentelemetry.sdk._logs  # noqa: F401
    except Exception as exc:  # an SDK without it: nothing to prepare
        _log.debug("otel-train: opentelemetry.sdk._logs: %r", exc)
