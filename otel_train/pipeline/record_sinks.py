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

The span worker holds one :class:`Export`: :class:`SinkExport` gives each drain to the route's
sinks and, with the exporter process, ends each drain, ticks between drains and sleeps on the
process's pipes; :class:`NullExport` where nothing is exported.

Usage::

    export = SinkExport([StageSink(stage, sampler)])
    export.on_records(records, user_rows)   # one drain
    export.end_drain()                      # the exporter process's frame (none here)
    export.close()                          # the worker stopped: spans still held go out
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


class Export(Protocol):
    """What the span worker calls on the route's export, and nothing else."""

    #: The exporter process's pid (its CPU is counted as own cost); None without one.
    pid: int | None
    #: True when ``wait_for_io`` sleeps on the exporter process's pipes.
    waits_on_io: bool

    def on_records(self, records: Sequence[tuple[Any, ...]],
                   rows: Sequence[tuple[Any, ...]] = ()) -> None:
        """Hand one drain on; never raises."""

    def end_drain(self) -> None:
        """The drain is complete (the exporter process gets one frame per drain)."""

    def tick(self, reports: bool) -> None:
        """Between drains: hand over what waits; read the exporter process's reports when
        ``reports`` (its report pipe was readable)."""

    def wait_for_io(self, seconds: float, wake_fd: int) -> bool:
        """Sleep until the exporter process reports, ``wake_fd`` is readable or ``seconds``
        pass; True when its reports are readable."""

    def close(self) -> None:
        """The worker stopped: hand on what is still held."""


class NullExport:
    """The export of a route that exports nothing: every call does nothing."""

    pid: int | None = None
    waits_on_io = False

    def on_records(self, records: Sequence[tuple[Any, ...]],
                   rows: Sequence[tuple[Any, ...]] = ()) -> None:
        """Nothing is exported."""

    def end_drain(self) -> None:
        """No exporter process."""

    def tick(self, reports: bool) -> None:
        """No exporter process."""

    def wait_for_io(self, seconds: float, wake_fd: int) -> bool:
        """Never called (``waits_on_io`` is False); no reports."""
        return False

    def close(self) -> None:
        """Nothing is held."""


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
                   rows: Sequence[tuple[Any, ...]] = (),
                   ordinals: Sequence[int] | None = None) -> None:
        """Queue each sampled record the sampler keeps; the drain's frame goes at
        ``end_drain``. ``ordinals``: each record's place among the queued records, when
        the exporter process reads the step ring (``pipeline/ring_source.py``)."""
        sampler = self.sampler
        if ordinals is not None:  # in scope every record is sampled and no sampler is here
            self._send([(rec, o) for rec, o in zip(records, ordinals) if rec[C_FLAGS] & 1])
            return
        # Unsampled by the SDK sampler (e.g. always_off): never exported.
        self._send([(rec, -1) for rec in records
                    if rec[C_FLAGS] & 1 and (sampler is None or sampler.keep_record(rec))])
        if sampler is not None:  # summary mode: intervals just closed
            self._send([(rec, -1) for rec in sampler.take_summaries()])

    def _send(self, records: Sequence[tuple[tuple[Any, ...], int]]) -> None:
        """Queue records (with their ordinals) for the exporter process; a failure is
        counted, never raised."""
        for rec, ordinal in records:
            spans = record_span_count(rec)
            try:
                self.client.send_record(rec, spans, ordinal)
            except Exception as exc:
                self._drops.add("export_failed", spans)
                self._warn.warning("send", "otel-train: could not queue spans for "
                                   "export: %r", exc)

    def close(self) -> None:
        """User spans still waiting in the sampler go out (fail open), and the last partial
        summary in summary mode."""
        if self.sampler is not None:
            self._send([(rec, -1) for rec in self.sampler.take_summaries(final=True)])
            self.sampler.shutdown()


class SinkExport(NullExport):
    """The route's export: each drain to every sink in turn (our export, an application's
    processors); with the exporter process's ``process`` client, its drain ends, ticks and
    sleeps on its pipes."""

    def __init__(self, sinks: Sequence[RecordSink],
                 process: ExportProcessClient | None = None) -> None:
        self.sinks = tuple(sinks)
        self._process = process
        self.waits_on_io = process is not None

    @property
    def pid(self) -> int | None:  # type: ignore[override]
        """The exporter process's pid, None without one."""
        return None if self._process is None else self._process.pid

    def on_records(self, records: Sequence[tuple[Any, ...]],
                   rows: Sequence[tuple[Any, ...]] = (),
                   ordinals: Sequence[int] | None = None) -> None:
        """Each sink in turn (``ordinals``, with the step ring read by the exporter process:
        to its sink; no other sink is on that route)."""
        for sink in self.sinks:
            if ordinals is not None and isinstance(sink, ProcessSink):
                sink.on_records(records, rows, ordinals)
            else:
                sink.on_records(records, rows)

    def end_drain(self) -> None:
        """One frame per drain to the exporter process."""
        if self._process is not None:
            self._process.end_drain()

    def tick(self, reports: bool) -> None:
        """Between drains: the exporter process's user spans, frames, reports."""
        if self._process is not None:
            self._process.tick(reports)

    def wait_for_io(self, seconds: float, wake_fd: int) -> bool:
        """The exporter process's pipes, or ``wake_fd``, or ``seconds``."""
        if self._process is None:
            return False
        return self._process.wait_for_io(seconds, wake_fd)

    def close(self) -> None:
        """Each sink in turn."""
        for sink in self.sinks:
            sink.close()
