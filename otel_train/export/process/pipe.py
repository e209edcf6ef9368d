"""The pipes between the training process and its exporter process: length-prefixed frames.

Each frame is a 4-byte little-endian length and a payload (``marshal`` bytes; the first,
the exporter's configuration, ``pickle``). The training process writes without blocking and
keeps what the pipe did not take; the exporter process reads blocking.
"""

from __future__ import annotations

import os
import struct

HEADER = struct.Struct("<I")
STATS_INTERVAL_SECONDS = 0.25  # how often the exporter process reports its counts
_READ_CHUNK = 1 << 16


def frame(payload: bytes) -> bytes:
    """One frame: the payload's length, then the payload."""
    return HEADER.pack(len(payload)) + payload


class FrameReader:
    """Length-prefixed frames from a file descriptor (blocking or not)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.eof = False  # the writer closed its end (read_available saw end of file)
        self._buf = bytearray()

    def read_available(self) -> list[bytes]:
        """Every whole frame readable now without blocking (fd must be non-blocking)."""
        while True:
            try:
                chunk = os.read(self.fd, _READ_CHUNK)
            except BlockingIOError:
                break
            except OSError:  # closed, or the child is gone
                break
            if not chunk:
                self.eof = True
                break
            self._buf += chunk
            if len(chunk) < _READ_CHUNK:
                break  # the pipe is empty now: no second read to be told so
        return self._frames()

    def read_one(self) -> bytes | None:
        """The next frame, blocking; None at end of file."""
        while True:
            frames = self._frames(limit=1)
            if frames:
                return frames[0]
            try:
                chunk = os.read(self.fd, _READ_CHUNK)
            except InterruptedError:
                continue
            if not chunk:
                return None
            self._buf += chunk

    def _frames(self, limit: int | None = None) -> list[bytes]:
        out = []
        buf = self._buf
        pos = 0
        while len(buf) - pos >= 4 and (limit is None or len(out) < limit):
            (size,) = HEADER.unpack_from(buf, pos)
            if len(buf) - pos - 4 < size:
                break
            out.append(bytes(buf[pos + 4:pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return out


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (on a blocking descriptor)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
