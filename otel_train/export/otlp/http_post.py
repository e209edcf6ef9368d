"""A lean HTTP/1.1 POST for OTLP/HTTP to a plain ``http://`` collector: the request's head
and body in one ``sendmsg``, the answer's status and headers parsed from one buffer.

Each OTLP/HTTP request leaves through the SDK client's transport (its ``_submit``: the
headers, the compression, one quick retry on a connection error). Where the SDK's urllib3
transport would carry it unchanged (``http_sender.lean_transport_reason``: plain http, no
credentials, no session or credential provider, no proxy), :class:`LeanHttpTransport`
stands in for it with the same interface and the same outcomes: the status code of an
answer; else an error whose class name says what happened (``ReadTimeoutError``: sent, no
answer in time, so it may have arrived; a ``ConnectionError``: nothing was accepted), which
``transport._http_outcome`` and ``failure_words.http_error_words`` read as they read
urllib3's. urllib3's request is ~2,000 Python calls (header objects, a pool manager's URL
parse, ``email``'s header parser); here it is a few dozen, and the body is never copied
(``benchmarks/bench_otlp_http.py``).

Connections are kept alive and reused, one per request in flight: a request that hangs
holds only its own connection (a sender thread each, ``http_sender.ReusedSenderThreads``).
A kept connection the collector closed meanwhile is noticed before it is used (readable
while idle) and replaced.

Usage::

    transport = LeanHttpTransport()
    result = transport.request("POST", url, headers=headers, data=body, timeout=10.0)
    result.status_code, result.error, result.content(), result.headers()
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

__all__ = ["LeanHttpResult", "LeanHttpTransport", "ReadTimeoutError"]

_MAX_HEAD_BYTES = 64 * 1024  # an answer's status line and headers, at most
_MAX_KEPT_CONNECTIONS = 4
_RECV_BYTES = 65536
_NO_BODY_STATUSES = frozenset((204, 304))


class ReadTimeoutError(TimeoutError):
    """The request went out (or partly) and no whole answer came in time: it may have
    arrived, so it is never sent again (named as urllib3's, which the outcome reads)."""


class ProtocolError(ConnectionError):
    """The connection closed, or the answer was not HTTP, before a whole answer came."""


class LeanHttpResult:
    """One request's outcome: ``status_code`` and ``reason`` of an answer, or ``error``."""

    __slots__ = ("status_code", "reason", "error", "_headers", "_body")

    def __init__(self, status_code: int | None = None, reason: str | None = None,
                 error: Exception | None = None, headers: Mapping[str, str] | None = None,
                 body: bytes = b"") -> None:
        self.status_code = status_code
        self.reason = reason
        self.error = error
        self._headers = dict(headers or {})  # lower-case names
        self._body = body

    def content(self) -> bytes:
        """The answer's body."""
        return self._body

    def headers(self) -> Mapping[str, str]:
        """The answer's headers, by lower-case name (repeated ones joined with ", ")."""
        return _LowerKeys(self._headers)

    def text(self) -> str:
        """The body as UTF-8 text."""
        return self._body.decode("utf-8")


class _LowerKeys(dict):  # type: ignore[type-arg]
    """A header mapping read case-insensitively."""

    def get(self, key: Any, default: Any = None) -> Any:
        return super().get(key.lower() if isinstance(key, str) else key, default)

    def __getitem__(self, key: Any) -> Any:
        return super().__getitem__(key.lower() if isinstance(key, str) else key)

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key.lower() if isinstance(key, str) else key)


class LeanHttpTransport:
    """HTTP/1.1 POSTs over kept-alive connections (the SDK transport interface:
    ``request``, ``is_connection_error``, ``close``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[tuple[tuple[str, int], socket.socket]] = []
        self._targets: dict[str, tuple[str, int, bytes]] = {}  # url -> host, port, head start
        self._closed = False

    def request(self, method: str, url: str, *, headers: Mapping[str, str] | None = None,
                timeout: float | None = None, data: bytes | None = None) -> LeanHttpResult:
        """Send one request and read its answer within ``timeout`` seconds in all."""
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        try:
            host, port, start = self._target(method, url)
            body = b"" if data is None else data
            head = start + _header_lines(headers or {}, len(body))
        except Exception as exc:  # a malformed URL or header: nothing was sent
            return LeanHttpResult(error=exc)
        sock = None
        try:
            sock = self._connection((host, port), deadline)
            sent = False
            try:
                _settimeout(sock, deadline)
                _send_all(sock, head, body)
                sent = True
                status, reason, answer_headers, answer, keep = _read_answer(sock, deadline)
            except (socket.timeout, TimeoutError) as exc:
                raise ReadTimeoutError(f"no answer within {timeout} s"
                                       + ("" if sent else " (sending)")) from exc
        except Exception as exc:
            if sock is not None:
                _close(sock)
            return LeanHttpResult(error=exc)
        if keep:
            self._keep((host, port), sock)
        else:
            _close(sock)
        return LeanHttpResult(status, reason, None, answer_headers, answer)

    def is_connection_error(self, exception: Exception | None) -> bool:
        """A failure before any answer that left nothing accepted (the client tries once
        more, on a fresh connection): a refused, reset or closed connection, not a timeout
        after the request went out."""
        return isinstance(exception, OSError) and not isinstance(exception, TimeoutError)

    def close(self) -> None:
        """Close the kept connections (a request in flight keeps its own until it ends)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for _, sock in idle:
            _close(sock)

    # -- connections ----------------------------------------------------------------------
    def _target(self, method: str, url: str) -> tuple[str, int, bytes]:
        """Host, port and the request line with its Host header (cached by URL)."""
        known = self._targets.get(url)
        if known is None:
            parts = urlsplit(url)
            if parts.scheme != "http" or not parts.hostname:
                raise ValueError(f"LeanHttpTransport takes plain http:// URLs, not {url!r}")
            port = parts.port or 80
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            netloc = parts.hostname if port == 80 else f"{parts.hostname}:{port}"
            if ":" in parts.hostname:  # an IPv6 address
                netloc = f"[{parts.hostname}]" + ("" if port == 80 else f":{port}")
            _check_header_text(path, netloc)
            known = (parts.hostname, port, f"{{}} {path} HTTP/1.1\r\nHost: {netloc}\r\n")
            self._targets[url] = known  # type: ignore[assignment]
        host, port, line = known
        _check_header_text(method)
        return host, port, line.format(method).encode("latin-1")  # type: ignore[attr-defined]

    def _connection(self, where: tuple[str, int], deadline: float | None) -> socket.socket:
        """A kept connection to ``where`` that is still open, else a new one."""
        while True:
            with self._lock:
                sock = next((s for w, s in reversed(self._idle) if w == where), None)
                if sock is not None:
                    self._idle.remove((where, sock))
            if sock is None:
                break
            if _still_open(sock):
                return sock
            _close(sock)
        left = None if deadline is None else max(0.001, deadline - time.monotonic())
        sock = socket.create_connection(where, timeout=left)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _keep(self, where: tuple[str, int], sock: socket.socket) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < _MAX_KEPT_CONNECTIONS:
                self._idle.append((where, sock))
                return
        _close(sock)


def _check_header_text(*texts: str) -> None:
    """No line break or NUL may reach the request head (it would split the request)."""
    for text in texts:
        if "\r" in text or "\n" in text or "\0" in text:
            raise ValueError(f"invalid character in an HTTP request line or header: {text!r}")


def _header_lines(headers: Mapping[str, str], length: int) -> bytes:
    """The headers, then Content-Length, then the blank line (latin-1, as http.client)."""
    lines = []
    for name, value in headers.items():
        name, value = str(name), str(value)
        if name.lower() == "content-length":
            continue
        _check_header_text(name, value)
        lines.append(f"{name}: {value}\r\n")
    lines.append(f"Content-Length: {length}\r\n\r\n")
    return "".join(lines).encode("latin-1")


def _settimeout(sock: socket.socket, deadline: float | None) -> None:
    if deadline is None:
        sock.settimeout(None)
        return
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout("the deadline passed")
    sock.settimeout(left)


def _send_all(sock: socket.socket, head: bytes, body: bytes) -> None:
    """Head and body sent as one stream, the body never copied (a partial send goes on
    from where it stopped)."""
    view = memoryview(body)
    sent = sock.sendmsg([head, view])
    if sent < len(head):
        sock.sendall(memoryview(head)[sent:])
        sent = len(head)
    sent -= len(head)
    while sent < len(view):
        sent += sock.send(view[sent:])


def _read_answer(sock: socket.socket, deadline: float | None
                 ) -> tuple[int, str, dict[str, str], bytes, bool]:
    """Status, reason, headers, body, and whether the connection may be kept."""
    buf = bytearray()
    while True:  # an interim 1xx answer is skipped
        end = buf.find(b"\r\n\r\n")
        while end < 0:
            if len(buf) > _MAX_HEAD_BYTES:
                raise ProtocolError("the answer's head is too long")
            _recv_into(sock, buf, deadline)
            end = buf.find(b"\r\n\r\n")
        head, buf = bytes(buf[:end]).decode("latin-1"), buf[end + 4:]
        version, status, reason, headers = _parse_head(head)
        if not 100 <= status < 200 or status == 101:
            break
    keep = version == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
    if status in _NO_BODY_STATUSES:
        return status, reason, headers, b"", keep
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return status, reason, headers, _read_chunked(sock, buf, deadline), keep
    length = headers.get("content-length")
    if length is None:  # the body runs to the connection's end
        while _recv_into(sock, buf, deadline, eof_ok=True):
            pass
        return status, reason, headers, bytes(buf), False
    n = int(length)
    while len(buf) < n:
        _recv_into(sock, buf, deadline)
    return status, reason, headers, bytes(buf[:n]), keep and len(buf) == n


def _parse_head(head: str) -> tuple[str, int, str, dict[str, str]]:
    lines = head.split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ProtocolError(f"not an HTTP answer: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            continue
        name, value = name.strip().lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return parts[0], int(parts[1]), parts[2] if len(parts) > 2 else "", headers


def _read_chunked(sock: socket.socket, buf: bytearray, deadline: float | None) -> bytes:
    body = bytearray()
    while True:
        end = buf.find(b"\r\n")
        while end < 0:
            _recv_into(sock, buf, deadline)
            end = buf.find(b"\r\n")
        size = int(bytes(buf[:end]).split(b";", 1)[0].strip() or b"0", 16)
        del buf[:end + 2]
        if size == 0:  # the trailers, up to their blank line
            while not (buf.startswith(b"\r\n") or b"\r\n\r\n" in buf):
                _recv_into(sock, buf, deadline)
            return bytes(body)
        while len(buf) < size + 2:
            _recv_into(sock, buf, deadline)
        body += buf[:size]
        del buf[:size + 2]


def _recv_into(sock: socket.socket, buf: bytearray, deadline: float | None,
               eof_ok: bool = False) -> bool:
    """More of the answer into ``buf``; False at the connection's end (when ``eof_ok``)."""
    _settimeout(sock, deadline)
    data = sock.recv(_RECV_BYTES)
    if not data:
        if eof_ok:
            return False
        raise ProtocolError("the connection closed before a whole answer came")
    buf += data
    return True


def _still_open(sock: socket.socket) -> bool:
    """An idle kept connection is usable: nothing to read (data or the peer's close)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
