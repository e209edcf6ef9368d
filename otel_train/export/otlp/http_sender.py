"""How OTLP/HTTP requests leave the process: a lean HTTP/1.1 POST where it behaves exactly
as the SDK's requests transport would, and sender threads that are reused.

The OTel HTTP exporter's client sends through a transport; the SDK ships two, ``requests``
(its default) and ``urllib3``. A POST through ``requests`` costs the most CPU, since it
re-reads the proxy environment and merges settings, cookies and hooks on every call; one
through urllib3 still makes ~2,000 Python calls. ``http_post.LeanHttpTransport`` (the same
interface) sends the head and body in one ``sendmsg`` and parses the answer in a few dozen
calls (``benchmarks/bench_otlp_http.py`` measures each way). It is taken only where nothing
``requests`` adds applies: a plain ``http://`` endpoint (no TLS, so no question of which CA
bundle) with no credentials in it (requests turns them into basic auth), no session or
credential provider handed to the exporter, and no proxy in the environment. The SDK
client's own steps stay: its headers, its compression, its one quick retry after a
connection error.

Starting a thread per POST costs CPU too. :class:`ReusedSenderThreads` keeps finished sender
threads waiting for the next request a while; a request that hangs holds only its own
thread, and the next one gets another, as a fresh thread would. (Not a
``ThreadPoolExecutor``: its workers are joined at interpreter exit, so one request hanging on
a collector would hold the exit, and a bounded pool would queue requests behind it.)

Usage::

    use_lean_http_transport(sdk_exporter, sdk_kwargs)   # True when switched
    senders = ReusedSenderThreads("otel-train-otlp-http")
    senders.submit(post, (pending, body))
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from otel_train.common import sdk_private
from otel_train.export.otlp.http_post import LeanHttpTransport

_log = logging.getLogger("otel_train")
_IDLE_SECONDS = 30.0  # how long a finished sender waits for the next request
# A custom requests session (with auth, adapters, hooks) comes from one of these.
_CREDENTIAL_PROVIDER_VARS = ("OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER",
                             "OTEL_PYTHON_EXPORTER_OTLP_HTTP_CREDENTIAL_PROVIDER")
_PROXY_VARS = ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY")
# Set to 0 to keep the SDK's default (requests) transport everywhere.
LEAN_TRANSPORT_ENV = "OTEL_TRAIN_HTTP_LEAN_TRANSPORT"


def lean_transport_reason(url: str, sdk_kwargs: Mapping[str, Any],
                          environ: Mapping[str, str] | None = None) -> str | None:
    """Why the lean transport cannot stand in for requests here (None: it can)."""
    env = os.environ if environ is None else environ
    if env.get(LEAN_TRANSPORT_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return f"{LEAN_TRANSPORT_ENV} is off"
    parts = urlsplit(url)
    if parts.scheme != "http":
        return "the endpoint is not plain http"
    if parts.username is not None or parts.password is not None:
        return "the endpoint has credentials (requests sends them as basic auth)"
    if sdk_kwargs.get("session") is not None:
        return "a requests session was given"
    if any(env.get(v) for v in _CREDENTIAL_PROVIDER_VARS):
        return "a credential provider is configured"
    if any(env.get(v) for v in _PROXY_VARS):
        return "a proxy is configured"
    return None


def use_lean_http_transport(sdk_exporter: Any, sdk_kwargs: Mapping[str, Any]) -> bool:
    """Swap the SDK exporter's requests transport for the lean one (``http_post.py``) where
    that changes nothing but the CPU per request; True when it did."""
    client = sdk_private.http_client(sdk_exporter)
    if client is None:
        return False
    old = sdk_private.http_transport(client)
    if type(old).__name__ != "RequestsHTTPTransport":
        return False
    if lean_transport_reason(sdk_private.otlp_endpoint(sdk_exporter), sdk_kwargs) is not None:
        return False
    sdk_private.set_http_transport(client, LeanHttpTransport())  # plain http: no TLS settings
    try:
        old.close()
    except Exception:
        _log.debug("closing the requests transport failed", exc_info=True)
    return True


class ReusedSenderThreads:
    """Runs each job on a daemon thread, reusing one that finished its last job within
    ``idle_seconds``; a job that hangs never delays another."""

    def __init__(self, name: str, idle_seconds: float = _IDLE_SECONDS) -> None:
        self.name = name
        self.idle_seconds = idle_seconds
        self.started = 0  # threads started so far (reuse shows as few)
        self.inline = 0  # jobs run on the caller's thread: no new thread could start
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._jobs: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._idle = 0  # threads waiting for a job
        self._closed = False
        self._pid = os.getpid()

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """Run ``fn(*args)`` on a waiting sender thread, or on a new one."""
        if self._pid != os.getpid():
            self._reset()  # after a fork: the waiting threads stayed in the parent
        with self._cond:
            if self._idle > len(self._jobs):
                self._jobs.append((fn, args))
                self._cond.notify()
                return
            self.started += 1
        try:
            threading.Thread(target=self._work, args=((fn, args),), name=self.name,
                             daemon=True).start()
        except RuntimeError:
            # No new thread now: Python 3.12.0 and 3.12.1 refuse one in an atexit handler
            # (where the run's exit flush sends). The job runs here instead: the caller
            # waits for its outcome within its own bound either way.
            with self._cond:
                self.started -= 1
                self.inline += 1
            self._run_job(fn, args)

    def close(self) -> None:
        """Let waiting threads leave now (jobs still queued run first)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @staticmethod
    def _run_job(fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except Exception:  # the job reports its own outcome; never kill the thread
            _log.debug("otel-train: a sender job failed", exc_info=True)

    def _work(self, job: tuple[Callable[..., Any], tuple[Any, ...]] | None) -> None:
        while job is not None:
            self._run_job(*job)
            job = None
            with self._cond:
                self._idle += 1
                try:
                    end = time.monotonic() + self.idle_seconds
                    while not self._jobs:
                        left = end - time.monotonic()
                        if left <= 0 or self._closed:
                            break
                        self._cond.wait(left)
                    if self._jobs:
                        job = self._jobs.popleft()
                finally:
                    self._idle -= 1
