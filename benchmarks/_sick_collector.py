"""Sick collectors for benchmarks: a closed port (down) and a TCP listener that never answers."""

from __future__ import annotations

import socket
import threading


def closed_port() -> int:
    """A 127.0.0.1 port with nothing listening (connection refused: collector down)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HangingCollector:
    """Accepts TCP connections on 127.0.0.1 and never replies (collector hanging)."""

    def __init__(self) -> None:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
                self._conns.append(conn)  # hold it open, read nothing, answer nothing
            except OSError:
                continue

    def close(self) -> None:
        """Stop accepting and drop every held connection."""
        self._stop.set()
        self._thread.join(1.0)
        for c in self._conns:
            c.close()
        self._sock.close()

    def __enter__(self) -> HangingCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
