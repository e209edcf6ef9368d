"""Export from the training process when the exporter process cannot: the take-over's stage.

If the child never starts in time or dies, the client makes the in-process export stage
(``BoundedBatchSpanProcessor`` with the planned exporter, fed the same records and rows) and
sends it everything the child will never get. If that stage cannot be made either, what it
would have exported is counted as ``export_failed``.

Usage::

    fallback = FallbackExport(make_stage, factory, drops)
    take_over(lifecycle, process, outbox, metrics, fallback)   # the child is given up
    fallback.send(recs, rows)
    fallback.force_flush(ms); fallback.shutdown(seconds)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from otel_train.common.drop_counter import DropCounter
from otel_train.export.process.derived_link import DerivedMetricsLink
from otel_train.export.process.launch import ExporterProcess
from otel_train.export.process.lifecycle import ClientLifecycle, ClientState
from otel_train.export.process.outbox import Outbox
from otel_train.records.span_rows import RowSpanFactory, record_span_count

_log = logging.getLogger("otel_train")


class FallbackExport:
    """The in-process export stage, made only when the exporter process is given up."""

    def __init__(self, make_stage: Callable[[], Any] | None, factory: RowSpanFactory,
                 drops: DropCounter) -> None:
        self._make_stage = make_stage
        self._factory = factory
        self._drops = drops
        self.stage: Any = None  # made by start(); None if it could not be
        # The tail sampler of the training process's chain (sampling.py), when the child
        # decided what to export: it decides here from the take-over on, so sample_ratio,
        # export_ranks and summary mode hold after the child is given up.
        self.sampler: Any = None

    @property
    def possible(self) -> bool:
        """A stage can be made (the client was given a way to make one)."""
        return self._make_stage is not None

    def start(self) -> None:
        """Make the stage (never raises: a failure is logged and its spans counted later)."""
        try:
            self.stage = self._make_stage() if self._make_stage is not None else None
            if self.stage is not None:
                self.stage.use_rows(self._factory)
        except Exception as exc:  # never into training, nor into its exit
            self.stage = None
            _log.warning("otel-train: could not export from the training process either: "
                         "%r; the spans the exporter process did not take are lost "
                         "(counted)", exc)

    def send(self, recs: list[tuple[Any, ...]], rows: list[tuple[Any, ...]],
             skip: int = 0) -> None:
        """Export a frame's records and rows here (the caller feeds the metrics), but its
        first ``skip`` spans (the child settled them before it died)."""
        if self.sampler is not None:
            recs, rows = self.sampler.filter_frame(list(recs), list(rows))  # never raises
        if self.stage is None:
            self.count_lost(sum(record_span_count(r) for r in recs) + len(rows) - skip)
        else:
            self.stage.on_records(recs, rows, skip)  # as the child would (export/stage.py)

    def count_lost(self, spans: int) -> None:
        """Count spans neither the child nor this process will export."""
        self._drops.add("export_failed", spans)

    def force_flush(self, timeout_millis: int) -> bool:
        """Flush the stage; False without one (its spans were counted as lost)."""
        if self.stage is None:
            return False
        return bool(self.stage.force_flush(timeout_millis))

    def shutdown(self, timeout_seconds: float) -> None:
        """Shut the stage down within ``timeout_seconds`` (what the sampler still holds, and
        summary mode's last partial summary, go out first)."""
        if self.stage is not None:
            if self.sampler is not None:
                self.stage.on_records(self.sampler.take_summaries(final=True),
                                      self.sampler.release_held())
            self.stage.shutdown(max(0.0, timeout_seconds))


def take_over(lifecycle: ClientLifecycle, process: ExporterProcess, outbox: Outbox,
              metrics: DerivedMetricsLink, fallback: FallbackExport,
              resend: list[tuple[Any, ...]] | None = None, skip: int = 0) -> None:
    """Move to TAKEN_OVER and export here what the child never got (under the I/O lock),
    after the frames it got and never confirmed (``resend``: the first ``skip`` spans of the
    first of them it settled; their steps fed the child's metrics already, or never will).

    The derived metrics are fed here from now on; the steps of frames the child never read
    are fed now, unless this process fed them already: the child could not run the chain,
    or the frame was queued before the child was ready (``fed`` in the frame).
    """
    was_ready = lifecycle.state is ClientState.READY
    fed = metrics.fed_here  # the frames still here were fed when they were queued
    if not lifecycle.take_over():
        return
    metrics.fed_here = metrics.attached
    process.close_pipes()
    fallback.start()
    for i, (recs, rows, _) in enumerate(resend or ()):
        fallback.send(recs, rows, skip if i == 0 else 0)
    left, cut = outbox.take_unsent()
    fallback.count_lost(cut)  # a frame that could not be read back
    feed_left = metrics.fed_here and not fed  # the child never saw these steps
    for recs, rows, fed_when_queued in left:
        if feed_left and recs and not fed_when_queued:
            metrics.feed_here(recs)
        fallback.send(recs, rows)
    if feed_left and was_ready:
        # (A child that never started took no step: every step was fed here, above.)
        _log.warning("otel-train: the derived metrics go on in the training process from the "
                     "exporter process's last state (steps it took since are not in them)")
