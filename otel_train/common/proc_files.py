"""Small ``/proc`` files read from a background thread again and again, one syscall a read.

``open(path).read()`` makes about seven syscalls (open, fstat, ioctl, lseek, read, read, close),
and CPython lets go of the GIL around each: a background thread that reads two such files hands
the GIL back and forth with the training thread a dozen times per look, and the training
thread waits for it each time it wants it back. ``ProcFileReader`` keeps the file
open and re-reads it with ``os.pread(fd, n, 0)``: one syscall, one hand-over. ``/proc`` files
are generated afresh on each read from offset 0.

Usage::

    schedstat = ProcFileReader(f"/proc/self/task/{tid}/schedstat")
    data = schedstat.read()   # bytes, or None once the file can't be read
"""

from __future__ import annotations

import os
import threading


class ProcFileReader:
    """A ``/proc`` file kept open and re-read from its start with one ``pread``."""

    def __init__(self, path: str, size_bytes: int = 1024) -> None:
        self.path = path
        self.size_bytes = size_bytes
        self._fd: int | None = None
        self._lock = threading.Lock()  # read() and close() from different threads

    def read(self) -> bytes | None:
        """The file's content now, or None where it can't be read (the task has exited)."""
        with self._lock:
            try:
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
                data = os.pread(self._fd, self.size_bytes, 0)
            except OSError:
                self._close_locked()
                return None
            return data or None

    def close(self) -> None:
        """Close the file (a later read opens it again)."""
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError:
                pass

    def __del__(self) -> None:
        self._close_locked()  # nothing else holds a reference: no lock needed
