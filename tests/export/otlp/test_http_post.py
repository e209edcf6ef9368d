"""http_post.py: the lean HTTP/1.1 POST reads every shape of answer an HTTP server may give,
keeps and replaces connections, and fails as urllib3 does (the outcomes read the same).

The collector-facing behaviours (spans, headers and compression arriving, status codes,
hangs, a collector away and back) run through the exporter in test_http_sender.py; here a
real socket server answers with exactly the bytes each test scripts."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from otlp_receivers import HttpOtlpReceiver

from otel_train.export.otlp.http_post import LeanHttpTransport, ReadTimeoutError
from otel_train.export.otlp.transport import ExportOutcome, _http_outcome


class ScriptedServer:
    """Accepts connections on 127.0.0.1 and answers each request read with the next of
    ``answers`` (bytes; ``None``: close the connection without answering; ``"hang"``: say
    nothing). Records each request's head and body and each connection accepted."""

    def __init__(self, answers: list) -> None:
        self.answers = list(answers)
        self.requests: list[tuple[str, bytes]] = []
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1/traces"
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self._listener.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while self.answers:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                text = head.decode("latin-1")
                length = int(next(line.split(":")[1] for line in text.split("\r\n")
                                  if line.lower().startswith("content-length")))
                while len(buf) < length:
                    buf += conn.recv(65536)
                self.requests.append((text, buf[:length]))
                buf = buf[length:]
                answer = self.answers.pop(0)
                if answer is None:
                    return
                if answer == "hang":
                    self._stop.wait(5)
                    return
                conn.sendall(answer)
                if b"Connection: close" in answer or b"Content-Length" not in answer \
                        and b"chunked" not in answer:
                    return

    def close(self) -> None:
        self._stop.set()
        self._listener.close()


OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n"


@pytest.fixture
def server(request):
    srv = ScriptedServer(request.param)
    yield srv
    srv.close()


def _post(transport: LeanHttpTransport, server: ScriptedServer, body: bytes = b"spans",
          timeout: float = 5.0, **headers: str):
    return transport.request("POST", server.url, headers={"content-type": "application/x-protobuf",
                                                          **headers},
                             data=body, timeout=timeout)


@pytest.mark.parametrize("server", [[OK, OK, OK]], indirect=True)
def test_requests_go_out_whole_and_share_one_kept_connection(server):
    transport = LeanHttpTransport()
    big = bytes(range(256)) * 8000  # 2 MB: more than a socket takes at once
    for body in (b"spans", big, b""):
        result = _post(transport, server, body, **{"x-tenant": "t1"})
        assert result.status_code == 200 and result.error is None
    assert [body for _, body in server.requests] == [b"spans", big, b""]
    head = server.requests[0][0]
    assert head.startswith("POST /v1/traces HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{server.port}" in head and "x-tenant: t1" in head
    assert "Content-Length: 5" in head
    assert server.connections == 1
    transport.close()


@pytest.mark.parametrize("server", [[
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"4\r\nabcd\r\n3;ext=1\r\nefg\r\n0\r\n\r\n",
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 7\r\nContent-Length: 2\r\n\r\nno",
    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nbye",
    b"HTTP/1.0 200 OK\r\n\r\nto the end"]], indirect=True)
def test_chunked_interim_status_and_read_to_close_answers_are_read_whole(server):
    transport = LeanHttpTransport()
    first = _post(transport, server)
    assert (first.status_code, first.content()) == (200, b"abcdefg")
    second = _post(transport, server)
    assert second.status_code == 503 and second.reason == "Service Unavailable"
    assert second.headers().get("retry-after") == "7" == second.headers()["Retry-After"]
    assert second.content() == b"no" and second.text() == "no"
    assert _post(transport, server).content() == b"bye"  # then the connection is closed
    assert _post(transport, server).content() == b"to the end"
    assert server.connections == 2  # a new one after the close
    transport.close()


@pytest.mark.parametrize("server", [[OK, None, OK]], indirect=True)
def test_a_connection_closed_without_an_answer_is_a_connection_error_tried_again(server):
    transport = LeanHttpTransport()
    assert _post(transport, server).status_code == 200
    failed = _post(transport, server)
    assert failed.status_code is None and transport.is_connection_error(failed.error)
    assert _http_outcome(failed)[0] is ExportOutcome.RETRY  # nothing was accepted
    assert _post(transport, server).status_code == 200  # on a fresh connection
    assert server.connections == 2
    transport.close()


@pytest.mark.parametrize("server", [[OK, OK]], indirect=True)
def test_a_kept_connection_the_server_closed_while_idle_is_replaced_before_use(server):
    transport = LeanHttpTransport()
    assert _post(transport, server).status_code == 200
    ((_, kept),) = transport._idle
    kept.shutdown(socket.SHUT_RD)  # reads as the server's close while idle
    deadline = time.monotonic() + 2
    while server.connections < 2 and time.monotonic() < deadline:
        result = _post(transport, server)
        assert result.status_code == 200
    assert server.connections == 2
    transport.close()


@pytest.mark.parametrize("server", [["hang"]], indirect=True)
def test_no_answer_in_time_is_a_read_timeout_that_is_never_tried_again(server):
    transport = LeanHttpTransport()
    t0 = time.monotonic()
    result = _post(transport, server, timeout=0.3)
    assert time.monotonic() - t0 < 2.0
    assert isinstance(result.error, ReadTimeoutError)
    assert not transport.is_connection_error(result.error)  # it may have arrived
    assert _http_outcome(result)[0] is ExportOutcome.UNKNOWN
    transport.close()


@pytest.mark.parametrize("server", [[b"SSH-2.0-OpenSSH\r\n\r\n"]], indirect=True)
def test_an_answer_that_is_not_http_is_a_protocol_error(server):
    result = _post(LeanHttpTransport(), server)
    assert result.status_code is None and "not an HTTP answer" in str(result.error)


def test_nothing_listening_is_a_refused_connection_reported_unreachable():
    with HttpOtlpReceiver() as receiver:
        url = receiver.traces_endpoint
    transport = LeanHttpTransport()
    result = transport.request("POST", url, headers={}, data=b"x", timeout=2.0)
    assert isinstance(result.error, ConnectionRefusedError)
    assert transport.is_connection_error(result.error)
    assert _http_outcome(result)[0] is ExportOutcome.RETRY


def test_a_header_or_url_that_would_split_the_request_is_refused_before_sending():
    transport = LeanHttpTransport()
    bad = transport.request("POST", "http://127.0.0.1:9/v1/traces",
                            headers={"x-a": "1\r\nInjected: yes"}, data=b"", timeout=1.0)
    assert isinstance(bad.error, ValueError) and not transport.is_connection_error(bad.error)
    tls = transport.request("POST", "https://127.0.0.1:9/v1/traces", headers={}, data=b"",
                            timeout=1.0)
    assert isinstance(tls.error, ValueError)
