"""What the exporter process reports back up its pipe, read in the training process.

Each frame is a ``marshal``-ed tuple whose first item names it:

- ``stats`` / ``final``: the cumulative export, failure, drop and sampled-out counts (the
  first one says the child is ready; ``final`` comes after a ``stop``). Drops land in this
  process's ``DropCounter`` as differences, so ``otel_train_spans_dropped_total`` counts
  each span once;
- ``startup``: the child's CPU seconds until it was ready;
- ``flushed``: the answer to a ``flush`` or ``sync`` token;
- ``log`` / ``error``: the child's log records, re-logged on this process's ``otel_train``
  logger; ``console``: the console report's lines, to this process's ``sys.stderr``;
- ``derived`` / ``derive_failed``: the derived-metrics chain's state, or why it cannot run.

A frame that does not unmarshal is counted (``corrupt_frames``, in ``monitoring_costs.json``
as ``exporter_process_corrupt_report_frames``) and warned about, rate-limited.

Usage::

    reports = ChildReports(lifecycle, drops, link, warn)
    reports.take(reader.read_available())
    reports.unaccounted(sent_spans)   # sent, never reported on
"""

from __future__ import annotations

import logging
import marshal
import sys
from collections.abc import Callable
from typing import Any

from otel_train.common.drop_counter import DropCounter
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.export.process.derived_link import DerivedMetricsLink
from otel_train.export.process.lifecycle import ClientLifecycle, ClientState

_log = logging.getLogger("otel_train")


class ChildReports:
    """The child's counts and acknowledgements as last reported; its logs passed on."""

    def __init__(self, lifecycle: ClientLifecycle, drops: DropCounter,
                 link: DerivedMetricsLink, warn: RateLimitedLogger, ring: bool = False) -> None:
        self._lifecycle = lifecycle
        self._drops = drops
        self._link = link
        self._warn = warn
        self.exported = 0
        self.export_failures = 0
        self.sampled_out = 0  # taken by the child's tail sampler, never to be exported
        self.child_drops: dict[str, int] = {}
        self.startup_cpu_seconds: float | None = None  # the child's CPU until it was ready
        # Frames that did not unmarshal: their counts come again in the next cumulative
        # report, but a log line, an answer or the final counts in one are lost.
        self.corrupt_frames = 0
        self._answers: dict[int, bool] = {}  # flush and sync tokens the child answered
        # The child reads the step ring (ring_feed.py): its counts carry the spans of the
        # frames it has settled, and the ring reader's own-cost counts for ``on_ring_counts``.
        self.ring = ring
        self.frames_settled = 0
        # The ring position the child's counts cover, and its spans settled past it
        # (``ring_settle.py``): the rest of the ring is what those counts do not cover.
        self.ring_position: int | None = None
        self.ring_partial_spans = 0
        self.ring_counts: dict[str, Any] = {}
        self.on_ring_counts: Callable[[dict[str, Any]], None] | None = None
        self._token = 0

    def next_token(self) -> int:
        """A fresh token for a ``flush`` or ``sync`` frame."""
        self._token += 1
        return self._token

    def answered(self, token: int) -> bool:
        """The child answered ``token``."""
        return token in self._answers

    def answer(self, token: int) -> bool:
        """The child's answer to ``token`` (False if none), forgotten once read."""
        return self._answers.pop(token, False)

    def unaccounted(self, sent_spans: int) -> int:
        """Spans sent that the child has not reported as exported, dropped or sampled out
        (reading the ring, the child settles the ring's spans too: it counts the frames'
        spans settled itself)."""
        if self.ring:
            return max(0, sent_spans - self.frames_settled)
        return max(0, sent_spans - self.exported - sum(self.child_drops.values())
                   - self.sampled_out)

    def take(self, frames: list[bytes]) -> None:
        """Apply each report read from the pipe."""
        for raw in frames:
            try:
                msg = marshal.loads(raw)
            except Exception:
                self.corrupt_frames += 1
                self._warn.warning("corrupt-frame", "otel-train: a report from the exporter "
                                   "process could not be read (%d so far)",
                                   self.corrupt_frames)
                continue
            kind = msg[0]
            if kind in ("stats", "final"):
                self._counts(msg[1], msg[2], msg[3], msg[4], final=kind == "final")
                if len(msg) > 5 and msg[5] is not None:
                    self._ring_counts(msg[5])
            elif kind == "startup":
                self.startup_cpu_seconds = float(msg[1])
            elif kind == "flushed":
                self._answers[msg[1]] = bool(msg[2])
            elif kind == "log":
                _log.log(msg[1], "%s", msg[2])
            elif kind == "derived":
                self._link.load_state(msg[1])
            elif kind == "derive_failed":
                self._link.fed_here = True
                _log.warning("otel-train: the exporter process could not run the derived "
                             "metrics (%s); they run in the training process from now on "
                             "(steps handed over before this are not in them)", msg[1])
            elif kind == "console":
                _write_console(msg[1])
            elif kind == "error":
                self._warn.warning("child", "otel-train: the exporter process: %s", msg[1])

    def _counts(self, exported: int, failures: int, drops: dict[str, int], sampled_out: int,
                final: bool) -> None:
        """Apply cumulative counts; the first report readies the client, ``final`` ends it."""
        lifecycle = self._lifecycle
        # Reports still buffered after a take-over or the close carry counts only.
        if lifecycle.state is ClientState.STARTING:
            lifecycle.child_ready()
        if final and lifecycle.state is ClientState.READY:
            lifecycle.child_final()
        self.exported = exported
        self.sampled_out = sampled_out
        self.export_failures = failures
        for reason in set(drops) | set(self.child_drops):
            delta = drops.get(reason, 0) - self.child_drops.get(reason, 0)
            if delta > 0:
                self._drops.add(reason, delta)
            elif delta < 0:
                self._drops.retract(reason, -delta)
        self.child_drops = dict(drops)


    def _ring_counts(self, counts: dict[str, Any]) -> None:
        """The child's ring reader's cumulative counts (never raises)."""
        self.frames_settled = int(counts.get("frames_settled", 0))
        if counts.get("ring_position") is not None:
            self.ring_position = int(counts["ring_position"])
            self.ring_partial_spans = int(counts.get("ring_partial_spans", 0))
        self.ring_counts = counts
        if self.on_ring_counts is not None:
            try:
                self.on_ring_counts(counts)
            except Exception as exc:
                self._warn.warning("ring-counts", "otel-train: the step ring's counts: %r",
                                   exc)


def _write_console(text: str) -> None:
    """The child's console lines, to this process's stderr (where notebooks capture it)."""
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except Exception:
        pass
