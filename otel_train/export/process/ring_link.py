"""The exporter process's client, the part that serves the step ring read by the child.

With ``step_ring="on"`` in scope (``pipeline/plan.py`` ``step_ring_in_exporter``) the child
reads the ring (``ring_feed.py``); the span worker's ``RingSource`` (``pipeline/
ring_source.py``) sends it control frames through the client (the ring's settings,
``start_run``'s time, collectives), reads its reader's counts back, and reads the ring itself
once the child is given up. ``ExportProcessClient`` takes these methods from this part; they
use its lifecycle, pipe and reports under its I/O lock.

Usage::

    client.send_control(("ring", pickle.dumps(settings)))
    client.watch_ring_counts(on_counts)
    if client.taken_over: ...   # read the ring here from its tail
"""

from __future__ import annotations

import marshal
import time
from collections.abc import Callable
from typing import Any

from otel_train.export.process.lifecycle import ClientState
from otel_train.recording.step_ring_reader import unread_step_spans

__all__ = ["RingClientPart"]

# The child's reports are read in these states (its start-up report while STARTING).
_REPORTS = frozenset({ClientState.STARTING, ClientState.READY, ClientState.FINAL})


class RingClientPart:
    """``ExportProcessClient``'s methods for the step ring read by the child."""

    _ring: Any
    _lifecycle: Any
    _io_lock: Any
    _outbox: Any
    _reports: Any
    _fallback: Any
    resent_spans: int

    @property
    def reads_ring(self) -> bool:
        """The child reads the step ring (it was given one)."""
        return self._ring is not None

    @property
    def taken_over(self) -> bool:
        """The child was given up: this process exports (and reads the ring) from now on."""
        return self._lifecycle.state is ClientState.TAKEN_OVER

    def send_control(self, msg: tuple[Any, ...]) -> None:
        """A frame without spans for the child, if one is to read it (the ring's settings,
        ``start_run``'s time, collectives: ``pipeline/ring_source.py``)."""
        with self._io_lock:
            if self._lifecycle.child_expected:
                self._outbox.queue(marshal.dumps(msg), 0)

    def watch_ring_counts(self, on_counts: Callable[[dict[str, Any]], None]) -> None:
        """``on_counts`` takes the child's ring reader's cumulative counts (own cost)."""
        self._reports.on_ring_counts = on_counts

    def settle_start(self, timeout_seconds: float) -> None:
        """Before the span worker's last drain: a child still starting gets its share of
        ``timeout_seconds`` to come up, else it is given up now (a child that exited is
        noticed), so that the last drain reads the ring here if no child will."""
        if self._lifecycle.inert:
            return
        if self._lifecycle.state is ClientState.STARTING and self._fallback.possible:
            self._await_start(time.monotonic()  # type: ignore[attr-defined]
                               + max(0.0, timeout_seconds))
        with self._io_lock:
            if self._lifecycle.state in _REPORTS:
                self._read()  # type: ignore[attr-defined]
                self._check_exit()  # type: ignore[attr-defined]

    def step_ring_counts(self) -> dict[str, int] | None:
        """What became of the ring's records on their way through the child, for
        run.costs() / monitoring_costs.json (``step_ring``); None when the child reads no
        ring. ``markers_unmatched``: queued records not there when the child read their
        place (``MARKER_WAIT_SECONDS`` at most): lost here, counted here by reason, or late;
        ``late_records``: those that came afterwards and went on out of step order; ``resent_spans``: spans the child
        never confirmed, exported again from this process after it died."""
        if self._ring is None:
            return None
        counts = self._reports.ring_counts
        return {"steps_built_in_exporter_process": int(counts.get("steps", 0)),
                "markers_unmatched": int(counts.get("markers_unmatched", 0)),
                "late_records": int(counts.get("late_records", 0)),
                "resent_spans": int(self.resent_spans)}

    def notice_exit(self) -> None:
        """A child that exited unasked is given up now, its last reports read first (their
        end of the pipe closed before it exited): before a drain, rather than at the span
        worker's next look, so that the drain reads the ring here."""
        if self._lifecycle.inert:
            return
        with self._io_lock:
            if self._lifecycle.state in _REPORTS:
                self._read()  # type: ignore[attr-defined]
                self._check_exit()  # type: ignore[attr-defined]

    def settled_ring_position(self) -> int | None:
        """The ring position the child's last report read here settled (None: none said)."""
        return self._reports.ring_position

    def unsettled_ring_spans(self) -> int:
        """The ring's spans that no count read here covers, at the end: past the position
        the child's last report read here settled (less its spans settled past it), or past
        ``tail`` where this process read the ring (the child given up) or the child never
        said. The child frees the ring's room only after the report saying so is sent, and
        the reports are all read once it has ended, so ``tail`` is not past that position
        (but for a report that could not be read); its bytes are intact while the producer
        has not lapped it (else counted from ``tail``)."""
        ring, reports = self._ring, self._reports
        start = reports.ring_position
        if start is not None and not self._lifecycle.was_taken_over:
            if ring.counters()["head"] - start <= ring.capacity:
                return max(0, unread_step_spans(ring, start) - reports.ring_partial_spans)
        return unread_step_spans(ring)

    def count_resent(self, spans: int) -> None:
        """Spans of ring steps the child read and never settled, read again here."""
        self.resent_spans += spans
