"""Stacks of every thread when a step stalls, written to ``RUN_DIR/stalls/``.

The stall watchdog (watchdog.py) is a Python thread: while the training thread holds the GIL
in a C call, it cannot run at all. So on each check it (re)arms faulthandler's later-timer
(a C thread, no GIL needed) to fire when the step in progress would cross the stall
threshold, writing every thread's stack into ``stalls/pending-rank<R>.txt``, a file opened in
advance whose header already names the step. When the watchdog runs again, it moves what the
timer wrote to ``stalls/step-<N>-<UTC>.txt`` (``-rank<R>`` when world_size > 1); when the
GIL is free at the stall, it dumps directly (``faulthandler.dump_traceback``).

Under torch.distributed a stalled rank writes ``stalls/request-step<N>-rank<R>.txt``; every
other rank's watchdog sees it on its next check and dumps its own stacks (no collective).
With the flight recorder on (``TORCH_NCCL_TRACE_BUFFER_SIZE`` or ``TORCH_FR_BUFFER_SIZE``)
and a process group up, its dump is saved beside the stacks (``.flight-recorder.pkl``).

faulthandler's later-timer is process-wide: arming it replaces one the application armed
(``stall_stacks=False`` leaves it alone). ``stall_stacks_signal`` (e.g. ``SIGUSR1``)
registers faulthandler on that signal, appending to ``stalls/signal-rank<R>.txt``.

Usage::

    stacks = StallStacks(run_dir / "stalls", rank=0, world_size=1,
                         training_thread=threading.get_ident())
    stacks.arm(step_index=12, header="...", seconds=4.0)   # each check
    path = stacks.collect_fired() or stacks.dump_now(12, "# ...\\n")
    stacks.close()
"""

from __future__ import annotations

import faulthandler
import logging
import os
import re
import signal
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from time import gmtime, monotonic, strftime, time_ns

from otel_train.common.options import catchable_signal as signal_number

_log = logging.getLogger("otel_train")

STALL_EVENT = "train.stall"  # span event on the stalled step
STALL_EVENT_FILE = "train.stall.stacks_file"
STALL_EVENT_PHASE = "train.stall.phase"
STALL_EVENT_REASON = "train.stall.reason"
PENDING_PREFIX = "pending-rank"
REQUEST_PREFIX = "request-"
FLIGHT_RECORDER_SUFFIX = ".flight-recorder.pkl"
FLIGHT_RECORDER_ENV = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE")
_THREAD_LINE = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME_LINE = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_REQUEST_NAME = re.compile(r"^request-step(\d+)-rank(\d+)\.txt$")


@dataclass
class ThreadStack:
    """One thread of a faulthandler dump: its id and frames, innermost first."""

    thread_id: int
    current: bool
    frames: list[tuple[str, int, str]] = field(default_factory=list)

    def innermost(self) -> str:
        """'file:line function' of the innermost frame ('?' when none was dumped)."""
        if not self.frames:
            return "?"
        path, line, func = self.frames[0]
        return f"{path}:{line} {func}"


def parse_thread_stacks(text: str) -> list[ThreadStack]:
    """The threads of faulthandler's text (``Thread 0x...`` blocks), in file order."""
    threads: list[ThreadStack] = []
    for line in text.splitlines():
        m = _THREAD_LINE.match(line)
        if m:
            threads.append(ThreadStack(int(m.group(2), 16), m.group(1) == "Current thread"))
            continue
        f = _FRAME_LINE.match(line)
        if f and threads:
            threads[-1].frames.append((f.group(1), int(f.group(2)), f.group(3).strip()))
    return threads


def thread_stack(text: str, thread_id: int) -> ThreadStack | None:
    """The dumped stack of ``thread_id`` (``threading.get_ident()``), or None."""
    for t in parse_thread_stacks(text):
        if t.thread_id == thread_id:
            return t
    return None


def utc_stamp(epoch_ns: int) -> str:
    """20261126T161705Z: a file-name-safe UTC time."""
    return strftime("%Y%m%dT%H%M%SZ", gmtime(epoch_ns / 1e9))


def default_flight_recorder() -> bytes | None:
    """torch's flight-recorder dump when it is on and a process group is up; else None.

    Never imports torch: a process that did not load it has no process group.
    """
    if not any(os.environ.get(name, "0") not in ("", "0") for name in FLIGHT_RECORDER_ENV):
        return None
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    c10d = torch._C._distributed_c10d  # type: ignore[union-attr]
    dump = getattr(c10d, "_dump_nccl_trace", None) or getattr(c10d, "_dump_fr_trace", None)
    if dump is None:
        return None
    # Without C++ stack traces: symbolizing them takes seconds (1.8 s for three gloo
    # collectives), and the Python stacks are in the stacks file already.
    return dump(includeStackTraces=False)  # type: ignore[no-any-return]


# faulthandler's later-timer across fork: a child inherits its state with the C thread gone,
# and arming or cancelling there (the interpreter's exit does) waits forever for that thread.
# So the timer is cancelled before every os.fork and re-armed after it in the parent, under
# _TIMER_LOCK, which every arming and cancelling takes too: a Python before-fork hook can be
# preempted between its cancel and the fork, and without the lock the watchdog thread could
# arm the timer in that gap (a forked child then hangs at exit: tests/derived/
# test_stall_stacks.py forks beside a watchdog re-arming all the time). A forked child's
# copy of the run is inert: its timer stays off and the parent's files are left alone.
_LIVE: weakref.WeakSet[StallStacks] = weakref.WeakSet()
_TIMER_LOCK = threading.Lock()


def _before_fork() -> None:
    _TIMER_LOCK.acquire()  # released after the fork in the parent; remade in the child
    for stacks in list(_LIVE):
        stacks.pause_for_fork()


def _after_fork_in_parent() -> None:
    try:
        for stacks in list(_LIVE):
            stacks.resume_after_fork()
    finally:
        _TIMER_LOCK.release()


def _after_fork_in_child() -> None:
    global _TIMER_LOCK
    _TIMER_LOCK = threading.Lock()  # the parent's copy is held: a fresh one
    for stacks in list(_LIVE):
        stacks.forked()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                    after_in_child=_after_fork_in_child)


class StallStacks:
    """The stacks files of one process: the armed timer, direct dumps, requests between ranks."""

    def __init__(self, stalls_dir: Path, rank: int, world_size: int, training_thread: int,
                 timer: bool = True, signal_name: str | None = None,
                 flight_recorder: Callable[[], bytes | None] = default_flight_recorder) -> None:
        self.dir = Path(stalls_dir)
        self.rank, self.world_size = rank, world_size
        self.training_thread = training_thread
        self.timer = timer
        self.flight_recorder = flight_recorder
        self.pending_path = self.dir / f"{PENDING_PREFIX}{rank}.txt"
        self._fd: int | None = None  # the pending file, opened at the first arming
        self._header_len = 0
        self._header_key: object = None
        self._armed = False
        self._deadline = 0.0  # monotonic seconds the armed timer fires at
        self._answered: set[str] = set()
        self._dir_mtime_ns = -1
        self._signal_file = None
        self.signal_name = signal_name
        if signal_name is not None:
            self._register_signal(signal_name)
        _LIVE.add(self)

    # -- the later-timer (works while the training thread holds the GIL) ------------------
    def arm(self, key: object, header: str, seconds: float, slack_seconds: float = 0.0) -> None:
        """Fire in ``seconds`` into the pending file, whose header is ``header`` for ``key``.

        A timer already armed to fire at most ``slack_seconds`` before that is kept: re-arming
        stops and starts faulthandler's C thread with the GIL held (~0.2 ms), so with steps
        shorter than the check interval it happens once per slack, not on every check.
        """
        if not self.timer:
            return
        deadline = monotonic() + max(seconds, 0.001)
        if self._armed and -0.01 <= deadline - self._deadline <= slack_seconds:
            return
        if self._fd is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.pending_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        if key != self._header_key:  # a new step: say which in the file, before it fires
            data = header.encode()
            os.lseek(self._fd, 0, os.SEEK_SET)
            os.write(self._fd, data)
            os.ftruncate(self._fd, len(data))
            self._header_len, self._header_key = len(data), key
        with _TIMER_LOCK:  # never between a fork's cancel and the fork (see _TIMER_LOCK)
            faulthandler.dump_traceback_later(max(deadline - monotonic(), 0.001),
                                              repeat=False, file=self._fd)
        self._armed, self._deadline = True, deadline

    def pause_for_fork(self) -> None:
        """Cancel the timer before os.fork, _TIMER_LOCK held (see _LIVE); resume_after_fork
        re-arms it."""
        if self.timer and self._fd is not None:
            faulthandler.cancel_dump_traceback_later()  # a no-op when none is armed

    def forked(self) -> None:
        """In a forked child: no timer, and the parent's pending file is not this copy's."""
        self.timer = False
        self._armed = False
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)  # this process's copy of the descriptor only
            except OSError:
                pass

    def resume_after_fork(self) -> None:
        """Re-arm the timer the watchdog wants armed, for the same deadline."""
        if self.timer and self._armed and self._fd is not None:
            faulthandler.dump_traceback_later(max(self._deadline - monotonic(), 0.001),
                                              repeat=False, file=self._fd)

    def disarm(self) -> None:
        """Cancel the timer (between steps, and before a direct dump)."""
        if self._armed:
            with _TIMER_LOCK:
                faulthandler.cancel_dump_traceback_later()
            self._armed = False

    def fired(self) -> bool:
        """Whether the timer wrote stacks that were not collected yet."""
        return self._fd is not None and os.fstat(self._fd).st_size > self._header_len

    def fired_at_ns(self) -> int:
        """When the timer wrote (the pending file's mtime, unix ns)."""
        return os.fstat(self._fd).st_mtime_ns if self._fd is not None else 0

    def discard_fired(self) -> None:
        """Forget what the timer wrote (the step it was armed for ended in time)."""
        if self._fd is not None:
            os.ftruncate(self._fd, self._header_len)
            os.lseek(self._fd, self._header_len, os.SEEK_SET)
        self._armed = False

    def take_fired(self) -> str:
        """What the timer wrote (its header left out); the pending file is emptied."""
        fd = self._fd
        if fd is None:
            return ""
        size = os.fstat(fd).st_size
        text = os.pread(fd, size - self._header_len, self._header_len).decode(errors="replace")
        self.discard_fired()
        return text

    def write_stacks(self, name_key: int, text: str, epoch_ns: int) -> Path:
        """A stacks file of step ``name_key`` holding ``text``."""
        path = self._stacks_path(name_key, epoch_ns)
        path.write_text(text)
        return path

    # -- direct dumps (the GIL is free) ---------------------------------------------------
    def dump_now(self, name_key: int, header: str, epoch_ns: int | None = None) -> Path:
        """Every thread's stack now, into a new stacks file after ``header``."""
        self.disarm()  # the timer must not write into the pending file meanwhile
        path = self._stacks_path(name_key, epoch_ns or time_ns())
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            f.write(header)
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)
        return path

    def save_flight_recorder(self, stacks_path: Path) -> Path | None:
        """The flight recorder's dump beside ``stacks_path``, when there is one."""
        path = stacks_path.with_name(stacks_path.stem + FLIGHT_RECORDER_SUFFIX)
        try:
            data = self.flight_recorder()
            if not data:
                return None
            path.write_bytes(data)
        except Exception as exc:  # a torch internal or the disk: never stop the stacks
            _log.warning("otel-train: flight recorder dump failed: %r", exc)
            return None
        return path

    def _stacks_path(self, step: int, epoch_ns: int) -> Path:
        rank = f"-rank{self.rank}" if self.world_size > 1 else ""
        path = self.dir / f"step-{step}-{utc_stamp(epoch_ns)}{rank}.txt"
        n = 1
        while path.exists():  # two dumps in one second (a request right after a stall)
            n += 1
            path = self.dir / f"step-{step}-{utc_stamp(epoch_ns)}-{n}{rank}.txt"
        return path

    # -- requests between ranks (files in the shared run directory) ----------------------
    def request_others(self, step: int, text: str) -> None:
        """Ask every other rank for its stacks (world_size > 1)."""
        if self.world_size <= 1:
            return
        name = f"{REQUEST_PREFIX}step{step}-rank{self.rank}.txt"
        self._answered.add(name)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / name).write_text(text)
        except OSError as exc:
            _log.warning("otel-train: cannot ask the other ranks for their stacks: %r", exc)

    def new_requests(self) -> list[tuple[int, int]]:
        """(step, rank) of requests from other ranks not answered yet; marks them answered."""
        if self.world_size <= 1:
            return []
        try:
            mtime = os.stat(self.dir).st_mtime_ns
            if mtime == self._dir_mtime_ns:  # one stat per check while nothing changes
                return []
            names = sorted(os.listdir(self.dir))
        except OSError:
            return []
        self._dir_mtime_ns = mtime
        found = []
        for name in names:
            m = _REQUEST_NAME.match(name)
            if m and name not in self._answered and int(m.group(2)) != self.rank:
                self._answered.add(name)
                found.append((int(m.group(1)), int(m.group(2))))
        return found

    # -- on a signal ----------------------------------------------------------------------
    def _register_signal(self, name: str) -> None:
        signum = signal_number(name)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._signal_file = open(self.dir / f"signal-rank{self.rank}.txt", "a")  # noqa: SIM115
        # A handler the application installed on that signal still runs after the dump; the
        # default action (for SIGUSR1: terminate) does not.
        chain = callable(signal.getsignal(signum))
        faulthandler.register(signum, file=self._signal_file, all_threads=True, chain=chain)

    def close(self) -> None:
        """Cancel the timer and the signal; remove the pending file if it holds no stacks."""
        self.disarm()
        if self.signal_name is not None:
            try:
                faulthandler.unregister(signal_number(self.signal_name))
            except (ValueError, RuntimeError):
                pass
        if self._signal_file is not None:
            self._signal_file.close()
            self._signal_file = None
        if self._fd is not None:
            fired = self.fired()
            os.close(self._fd)
            self._fd = None
            if not fired:
                _remove_quietly(self.pending_path)
                try:
                    self.dir.rmdir()  # only when nothing else is there
                except OSError:
                    pass


def _remove_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
