"""What an OTLP exporter's export stage queues: encoded spans, made from span records a frame
at a time.

``OtlpSpanFields`` is the OTLP exporters' ``SpanItems`` (``export/span_items.py``): each
record's spans as ScopeSpans.spans fields (``encoding._Encoder``), each user span row as one.
A frame of records (the exporter process hands up to 512 steps at once) is encoded by
:func:`encode_frame`: runs of the usual step go to the C encoder in one call
(``_encode_c.steps_fields``), their phases' span ids drawn at once (the same ids as a draw a
record, ``span_rows.draw_span_ids``); any other record, and every record with
``OTEL_TRAIN_PURE_PYTHON=1``, goes through ``_Encoder.record``, to the same bytes.

Usage::

    items = OtlpSpanFields(run_constants)
    fields = items.from_records(records, failed)   # failed(rec, exc): counted, the rest go on
    field = items.from_row(row)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from otel_train.export.otlp.encoding import _Encoder
from otel_train.records.span_rows import C_IDS, C_PHASES, draw_span_ids

__all__ = ["OtlpSpanFields", "encode_frame"]

_DRAW_CHUNK = 1024  # the most ids span_rows.draw_span_ids draws in one getrandbits call


def encode_frame(enc: _Encoder, recs: Sequence[tuple[Any, ...]], constants: Mapping[str, Any],
                 failed: Callable[[tuple[Any, ...], Exception], None]) -> list[bytes]:
    """The encoded spans of ``recs``, in order, as ``enc.record`` encodes each, with the
    same span ids: the phase ids of each run of records that draws its own (no ids handed to
    user spans) are drawn at once. A record that cannot be encoded goes to ``failed``; the
    others go on."""
    out: list[bytes] = []
    record = enc.record
    keys, block, many = enc.frame_parts(constants)
    count_c = enc.run_draws_c
    recs = recs if type(recs) is list else list(recs)
    pool: list[int] = []
    at = k = 0
    while k < len(recs):
        rec, first = recs[k], k
        try:
            phases, ids = rec[C_PHASES], rec[C_IDS]
            if not phases or ids:  # draws none, or its own: as record() does
                k += 1
                out += record(rec, constants)
                continue
            n = len(phases)
            if at + n > len(pool):  # the ids of this run of records, drawn at once
                drawn = count_c(recs, k) if count_c is not None else None
                pool = _draw_ids(_run_draws(recs, k) if drawn is None else drawn)
                at = 0
            if many is not None:  # the run's usual steps in one C call
                j, at = many(recs, k, pool, at, block, keys, out)
                enc.records_in_c += j - k
                if j > k:
                    k = j
                    continue
            k += 1  # this one here, with its ids, whether or not it can be encoded
            at += n
            out += record(rec, constants, pool[at - n:at])
        except Exception as exc:
            failed(rec, exc)
            k = max(k, first + 1)  # never the same record twice
    return out


def _draw_ids(n: int) -> list[int]:
    """``n`` span ids, those ``draw_span_ids(n)`` gives, drawn ``_DRAW_CHUNK`` at a time
    (its widest single draw: one ``getrandbits`` and one unpack; a wider one is drawn id by
    id)."""
    if n <= _DRAW_CHUNK:
        return draw_span_ids(n)
    pool: list[int] = []
    for start in range(0, n, _DRAW_CHUNK):
        pool += draw_span_ids(min(_DRAW_CHUNK, n - start))
    return pool


def _run_draws(recs: Sequence[tuple[Any, ...]], k: int) -> int:
    """Phase ids the run of records from ``k`` draws, up to the first that draws none or its
    own (a record with no phases, or with ids handed to user spans)."""
    total = 0
    for rec in recs[k:]:
        phases = rec[C_PHASES]
        if not phases or rec[C_IDS]:
            break
        total += len(phases)
    return total


class OtlpSpanFields:
    """An OTLP exporter's queue items: encoded spans (ScopeSpans.spans fields), made where
    records arrive, with caches of their own (the export thread encodes requests apart)."""

    def __init__(self, run_constants: Mapping[str, Any]) -> None:
        self._encoder = _Encoder()
        self._constants = dict(run_constants)  # one object: the record cache goes by identity

    def from_record(self, rec: tuple[Any, ...]) -> list[bytes]:
        """One step's (or operation's) encoded spans."""
        return self._encoder.record(rec, self._constants)

    def from_records(self, recs: Sequence[tuple[Any, ...]],
                     failed: Callable[[tuple[Any, ...], Exception], None]) -> list[bytes]:
        """The encoded spans of a frame of records, in order (:func:`encode_frame`)."""
        return encode_frame(self._encoder, recs, self._constants, failed)

    def from_row(self, row: tuple[Any, ...]) -> bytes:
        """One span row, encoded."""
        return self._encoder.row_field(row, self._constants)
