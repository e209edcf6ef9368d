"""The export stage's retry policy for single-attempt OTLP exporters: send, back off, probe.

``otlp/transport.py``'s exporters make one attempt per send and say what happened; the stage
(``stage.BoundedBatchSpanProcessor``) hands each batch to :class:`SingleAttemptSender`, which
sends it, splits it under the request size limit, and decides what an outcome means:

- an undelivered batch goes back to the front of the stage's queue (only the queue's bound
  drops spans, oldest first, counted), and the worker backs off exponentially with jitter;
- while the collector's port refuses connections, a cheap TCP probe notices within a quarter
  second that it is back, and the next batch goes out at once;
- a batch the collector keeps refusing while reachable is dropped after a few tries, so one
  poison batch cannot hold back the rest;
- no span is sent twice: a request that timed out after it was sent is counted as dropped
  (and un-counted should its answer still come).

``benchmarks/bench_collector_down.py --flapping`` measures it against a collector down 3 s /
up 3 s for a minute.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Protocol

from otel_train.common.sdk_config import DEFAULT_MAX_REQUEST_BYTES
from otel_train.export.otlp.transport import ExportOutcome, PendingSend

# Retry schedule after a batch could not be delivered: 0.5 s doubling to 5 s, +-20% jitter
# (so ranks that lost the same collector do not come back in lockstep).
_BACKOFF_INITIAL_SECONDS = 0.5
_BACKOFF_MAX_SECONDS = 5.0
# While the collector's port refuses connections it is probed this often: a TCP connect,
# far cheaper than encoding and sending a batch.
_PROBE_INTERVAL_SECONDS = 0.25
_PROBE_TIMEOUT_SECONDS = 0.2
# A batch the collector keeps refusing while it is reachable is dropped after this many tries.
_MAX_TRIES_WHILE_REACHABLE = 5
# The collector accepts connections but the send could not connect: retried at most this
# often (it came back as we failed, or something answers on its port that is not for us).
_RACE_RETRY_SECONDS = 1.0
_MIN_REQUEST_BYTES = 64 * 1024
_WAIT_SLICE_SECONDS = 0.05
_TIMEOUT_SLACK_SECONDS = 0.5


class SendAccounting(Protocol):
    """What the sender needs of the stage (``stage.BoundedBatchSpanProcessor``): its queue
    and its counts."""

    deadline: float | None  # shutdown's deadline (monotonic), None while running
    stopping: bool

    @property
    def queued(self) -> int:
        """Spans waiting in the queue."""

    def past_deadline(self) -> bool:
        """Shutdown's deadline has passed."""

    def warn(self, key: str, message: str, *args: Any) -> None:
        """A rate-limited warning."""

    def count_exported(self, n: int) -> None:
        """``n`` spans were delivered."""

    def count_failed(self, part: list[Any], why: str) -> None:
        """``part`` will never be delivered."""

    def count_given_up(self, pending: PendingSend, part: list[Any], reason: str) -> None:
        """``part`` is counted dropped, and un-counted should it arrive after all."""

    def requeue(self, parts: list[list[Any]]) -> None:
        """Put undelivered spans back at the front of the queue."""


class SingleAttemptSender:
    """Sends the stage's batches through a single-attempt exporter; owns the backoff state."""

    def __init__(self, stage: SendAccounting, exporter: Any,
                 max_request_bytes: int | None, export_timeout_seconds: float | None) -> None:
        self._stage = stage
        self._exporter = exporter
        self.max_request = int(max_request_bytes or getattr(exporter, "max_request_bytes", 0)
                               or DEFAULT_MAX_REQUEST_BYTES)
        self.timeout = float(export_timeout_seconds
                             or getattr(exporter, "timeout_seconds", 0) or 10.0)
        # When to try again (0: now), the current backoff, and whether the collector's port
        # refused the probe (then it is probed until it is back).
        self.retry_at = 0.0
        self._backoff_seconds = 0.0
        self._collector_down = False
        self._seen_down = False  # the probe failed since the last failure
        self._failed_at = 0.0
        self._tries = 0

    # -- waiting ----------------------------------------------------------------------------
    def pause(self, wake: threading.Event, deadline: float | None) -> None:
        """Wait out the backoff (never past ``deadline``), probing a collector that was down;
        return early when it is back."""
        exporter = self._exporter
        while True:
            now = time.monotonic()
            end = self.retry_at if deadline is None else min(self.retry_at, deadline)
            if now >= end:
                return
            if self._collector_down:
                up = exporter.probe(_PROBE_TIMEOUT_SECONDS)
                if up is False:
                    self._seen_down = True
                elif up and (self._seen_down
                             or now - self._failed_at >= _RACE_RETRY_SECONDS):
                    # Back: reconnect at once rather than after the transport's own backoff.
                    # (Seen down then up; or up at once: it came back as we failed, or it
                    # accepts connections but not ours, so tried again no faster than 1/s.)
                    exporter.reconnect()
                    self._collector_down = False
                    self.retry_at = time.monotonic()
                    return
            wake.wait(min(_PROBE_INTERVAL_SECONDS, max(0.0, end - now)))
            wake.clear()

    # -- sending ----------------------------------------------------------------------------
    def send(self, batch: list[Any]) -> bool:
        """Send ``batch`` (split under the size limit); False when the worker must back off
        (what was not delivered is back at the front of the queue)."""
        parts: list[list[Any]] = [batch]
        while parts:
            part = parts.pop(0)
            body = self._body(part, parts)
            if body is None:
                continue
            timeout = self.timeout
            deadline = self._stage.deadline
            if deadline is not None:  # shutting down: no request outlives its bound
                timeout = max(0.05, min(timeout, deadline - time.monotonic()))
            pending = self._exporter.start_send(part, body, timeout)
            if not self._settle(self._await(pending), pending, part, body, parts):
                return False
        return True

    def _body(self, part: list[Any], parts: list[list[Any]]) -> bytes | None:
        """The request body of ``part``; None when it failed (counted) or was split."""
        try:
            body = self._exporter.encode(part)
        except Exception as exc:
            self._stage.count_failed(part, f"encoding failed: {exc!r}")
            return None
        if len(body) <= self.max_request:
            return body
        if len(part) > 1:  # split: no request may exceed the receiver's limit
            half = len(part) // 2
            parts[0:0] = [part[:half], part[half:]]
        else:
            self._stage.count_failed(part, f"one span encodes to {len(body)} bytes, over the "
                                     f"{self.max_request}-byte request limit")
        return None

    def _settle(self, outcome: ExportOutcome | None, pending: PendingSend, part: list[Any],
                body: bytes, parts: list[list[Any]]) -> bool:
        """Account for one send's outcome; False when the worker must back off."""
        stage = self._stage
        if outcome is None:  # gave up on it: its timeout, or shutdown's deadline
            stopping = stage.stopping and stage.past_deadline()
            stage.count_given_up(pending, part, "shutdown_timeout" if stopping
                                 else "export_failed")
            stage.requeue(parts)
            if not stopping:
                self._back_off(f"no answer within {self.timeout:.1f} s")
            return False
        if outcome is ExportOutcome.SENT:
            stage.count_exported(len(part))
            self.retry_at = self._backoff_seconds = 0.0
            self._tries = 0
            return True
        if outcome is ExportOutcome.TOO_LARGE:
            learnt = pending.limit_bytes or max(_MIN_REQUEST_BYTES, len(body) // 2)
            self.max_request = max(_MIN_REQUEST_BYTES, min(self.max_request, learnt))
            if len(part) > 1 and len(body) > self.max_request:
                parts.insert(0, part)  # split again under the limit the receiver told us
            else:
                stage.count_failed(part, f"the collector refused a {len(body)}-byte request "
                                   "as too large")
            return True
        if outcome is ExportOutcome.REJECTED:
            stage.count_failed(part, f"the collector rejected it ({pending.detail})")
            return True
        if outcome is ExportOutcome.UNKNOWN:
            # It may have arrived: sending it again could deliver it twice.
            stage.count_given_up(pending, part, "export_failed")
            stage.requeue(parts)
            self._back_off(pending.detail or "no answer")
            return False
        self._retry_later(pending, part, parts)
        return False

    def _retry_later(self, pending: PendingSend, part: list[Any],
                     parts: list[list[Any]]) -> None:
        """RETRY: not delivered; it goes back to the front of the queue, unless the collector
        is up and keeps refusing it."""
        self._back_off(pending.detail, pending.unreachable,
                       held=len(part) + sum(map(len, parts)))
        self._tries = 0 if self._collector_down else self._tries + 1
        if self._tries >= _MAX_TRIES_WHILE_REACHABLE:
            self._tries = 0
            self._stage.count_failed(part, f"refused {_MAX_TRIES_WHILE_REACHABLE} times "
                                     f"({pending.detail})")
            self._stage.requeue(parts)
        else:
            self._stage.requeue([part, *parts])

    def _await(self, pending: PendingSend) -> ExportOutcome | None:
        """The send's outcome, waiting at most the export timeout and never past shutdown."""
        limit = time.monotonic() + self.timeout + _TIMEOUT_SLACK_SECONDS
        while True:
            deadline = self._stage.deadline
            end = limit if deadline is None else min(limit, deadline)
            outcome = pending.wait(min(_WAIT_SLICE_SECONDS, max(0.0, end - time.monotonic())))
            if outcome is not None:
                return outcome
            if time.monotonic() >= end:
                return None

    def _back_off(self, detail: str, unreachable: bool = False, held: int = 0) -> None:
        """Wait longer before the next try, probe the collector, and say why (``held``:
        spans of this send, not yet back in the queue)."""
        self._backoff_seconds = min(_BACKOFF_MAX_SECONDS,
                                    max(_BACKOFF_INITIAL_SECONDS, self._backoff_seconds * 2))
        self._failed_at = now = time.monotonic()
        self.retry_at = now + self._backoff_seconds * random.uniform(0.8, 1.2)
        probe = getattr(self._exporter, "probe", None)
        probed = probe(_PROBE_TIMEOUT_SECONDS) if probe is not None else None
        self._seen_down = probed is False
        self._collector_down = self._seen_down or (unreachable and probe is not None)
        self._stage.warn(
            "export-retry", "otel-train: span export to %s failed: %s; %d spans kept queued, "
            "will retry in %.1f s%s", getattr(self._exporter, "where", "the collector"),
            detail or "no detail given", self._stage.queued + held, self._backoff_seconds,
            # (no host to probe: a malformed endpoint has no collector to come back)
            " or as soon as the collector accepts connections"
            if self._collector_down and probed is not None else "")
