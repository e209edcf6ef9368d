"""Where the span worker hands a drain's span records: one sink per route.

Every route carries span records (steps) and span rows (user spans); the derived metrics have
already seen the drain's ``StepView``s (``span_worker.py``). A sink applies the tail sampler
where it runs in this process, then hands the records on:

- :class:`StageSink`: the in-process export stage (``export_process=False``, the console
  exporter, an application's OTLP endpoint): ``BoundedBatchSpanProcessor.on_records``;
- :class:`ProcessSink`: the exporter process (``ExportProcessClient.send_record``), which
  takes user spans itself (``on_end``, made rows there) and frames a drain at ``end_drain``;
- ``application_export.ApplicationProviderSink``: an application's own span processors, the
  one place span records become SDK spans in this process.

Usage::

    sink = StageSink(stage, sampler)
    sink.on_records(records, user_rows)   # one drain
    sink.close()                          # the worker stopped: spans still held go out
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from otel_train.common.drop_counter import DropCounter
from otel_train.common.rate_limited_log import RateLimitedLogger
from otel_train.records.span_rows import C_FLAGS, record_span_count

if TYPE_CHECKING:
    from otel_train.derived.sampling import StepTailSampler
    from otel_train.export.process.client import ExportProcessClient
    from otel_train.export.stage import BoundedBatchSpanProcessor

_log = logging.getLogger("otel_train")


class RecordSink(Protocol):
    """Takes one drain's span records and user span rows."""

    def on_records(self, records: Sequence[tuple[Any, ...]],
                   rows: Sequence[tuple[Any, ...]] = ()) -> None:
        """Hand one drain on; never raises."""

    def close(self) -> None:
        """The worker stopped: hand on what is still held."""


class StageSink:
    """Records and user rows to the in-process export stage, through the tail sampler."""

    def __init__(self, stage: BoundedBatchSpanProcessor,
                 sampler: StepTailSampler | None) -> None:
        self.stage = stage
        self.sampler = sampler

    def on_records(self, records: Sequence[tuple[Any, ...]],
                   rows: Sequence[tuple[Any, ...]] = ()) -> None:
        """The sampler's decision on the drain (a user span waits for its step), then the
        stage."""
        if self.sampler is not None:
            records, rows = self.sampler.filter_frame(list(records), list(rows))
        self.stage.on_records(records, rows)

    def close(self) -> None:
        """User spans still waiting for their step go out (fail open)."""
        if self.sampler is not None:  # and, in summary mode, the last partial summary
            self.stage.on_records(self.sampler.take_summaries(final=True),
                                  self.sampler.release_held())


class ProcessSink:
    """Records to the exporter process; the tail sampler here only where the derived
    metrics stay in this process (user spans then wait in it as SDK spans, ``on_end``)."""

    def __init__(self, client: ExportProcessClient, sampler: StepTailSampler | None,
                 drops: DropCounter) -> None:
        self.client = client
        self.sampler = sampler
        self._drops = drops
        self._warn = RateLimitedLogger(_log)

    def on_records(self, records: Sequence[tuple[Any, ...]],
                   rows: Sequence[tuple[Any, ...]] = ()) -> None:
        """Queue each sampled record the sampler keeps; the drain's frame goes at
        ``end_drain``."""
        sampler = self.sampler
        # Unsampled by the SDK sampler (e.g. always_off): never exported.
        self._send([rec for rec in records
                    if rec[C_FLAGS] & 1 and (sampler is None or sampler.keep_record(rec))])
        if sampler is not None:
            self._send(sampler.take_summaries())  # summary mode: intervals just closed

    def _send(self, records: Sequence[tuple[Any, ...]]) -> None:
        """Queue records for the exporter process; a failure is counted, never raised."""
        for rec in records:
            spans = record_span_count(rec)
            try:
                self.client.send_record(rec, spans)
            except Exception as exc:
                self._drops.add("export_failed", spans)
                self._warn.warning("send", "otel-train: could not queue spans for "
                                   "export: %r", exc)

    def close(self) -> None:
        """User spans still waiting in the sampler go out (fail open), and the last partial
        summary in summary mode."""
        if self.sampler is not None:
            self._send(self.sampler.take_summaries(final=True))
            self.sampler.shutdown()


class FanOutSink:
    """Several sinks, each given every drain (our export and an application's processors)."""

    def __init__(self, sinks: Sequence[RecordSink]) -> None:
        self.sinks = tuple(sinks)

    def on_records(self, records: Sequence[tuple[Any, ...]],
                   rows: Sequence[tuple[Any, ...]] = ()) -> None:
        """Each sink in turn."""
        for sink in self.sinks:
            sink.on_records(records, rows)

    def close(self) -> None:
        """Each sink in turn."""
        for sink in self.sinks:
            sink.close()
