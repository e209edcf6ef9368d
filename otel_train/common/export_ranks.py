"""Which ranks export their ordinary steps, and in what form (the ``export_ranks`` and
``span_mode`` options).

Every rank always runs its derived metrics and serves ``/metrics``; these options only decide
which ranks send ordinary steps' spans. A rank left out still exports its slow, failed,
stalled and truncated steps (the tail sampler, ``derived/sampling.py``), and step N's trace
id is derived from the run id and N (``identity.step_trace_id``), so the ranks that export
step N land in one trace.

``export_ranks`` values:

- ``auto`` (the default): ``all`` up to ``AUTO_ALL_MAX_WORLD_SIZE`` (64) ranks, above it
  ``first-per-node``. 64 ranks at 100 steps/s send 32,000 spans/s, 8.6 MB/s
  (benchmarks/bench_capacity.py: 500 spans/s and 135 KB/s per rank): about two collector
  cores, and under Tempo's default per-tenant limit of 15 MB/s with room left; 128 ranks
  would pass it (docs/scaling.md);
- ``all``; ``first-per-node`` (the rank whose local rank is 0);
- ``fraction:F``: the ranks whose stable hash of the rank number falls below F (the same
  ranks every restart and every job), and rank 0 always;
- a rank or a list: ``0``, ``"0,8,16"`` (an int or a sequence of ints as an argument).

``span_mode``: ``steps`` (each step's spans) or ``summary`` (one ``train.summary`` span per
interval from each exporting rank, ``derived/step_summary.py``).

Usage::

    choice = resolve_export_ranks(options.export_ranks, world_size=128)
    choice.exports(rank=8, local_rank=0)          # True: first-per-node
    routine_export(options, rank, world_size, local_rank)   # (exports steps?, summary?)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

AUTO_ALL_MAX_WORLD_SIZE = 64
SPAN_MODES = ("steps", "summary")
_FIRST_PER_NODE = "first-per-node"


@dataclass(frozen=True)
class ExportRanks:
    """A parsed ``export_ranks``: which ranks send their ordinary steps."""

    kind: str  # all | first-per-node | fraction | list
    fraction: float = 1.0
    ranks: frozenset[int] = frozenset()
    auto: bool = False  # chosen by the default from the world size

    def exports(self, rank: int, local_rank: int) -> bool:
        """Whether ``rank`` sends its ordinary steps."""
        if self.kind == "all":
            return True
        if self.kind == _FIRST_PER_NODE:
            return local_rank == 0
        if self.kind == "fraction":
            return rank == 0 or rank_hash_unit(rank) < self.fraction
        return rank in self.ranks

    def describe(self) -> str:
        """The choice in words (the start-up banner, ``otel-train plan``)."""
        if self.kind == "fraction":
            text = f"fraction:{self.fraction:g} (by a hash of the rank, and rank 0)"
        elif self.kind == "list":
            text = "ranks " + ",".join(str(r) for r in sorted(self.ranks))
        else:
            text = self.kind
        if self.auto:
            text += f" (the default above {AUTO_ALL_MAX_WORLD_SIZE} ranks)"
        return text


def rank_hash_unit(rank: int) -> float:
    """A rank's stable place in [0, 1): the same on every restart, host and Python."""
    digest = hashlib.blake2b(f"otel-train-rank\x00{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def parse_export_ranks(value: Any) -> ExportRanks | None:
    """``export_ranks`` parsed; None for ``auto``. ValueError (the rule) when malformed."""
    if isinstance(value, bool):
        raise ValueError("not a rank choice")
    if isinstance(value, int):
        value = [value]
    if isinstance(value, Sequence) and not isinstance(value, str):
        ranks = list(value)
        if not ranks or any(isinstance(r, bool) or not isinstance(r, int) or r < 0
                            for r in ranks):
            raise ValueError("a list of ranks must hold integers >= 0")
        return ExportRanks("list", ranks=frozenset(ranks))
    if not isinstance(value, str):
        raise ValueError("not a rank choice")
    text = value.strip().lower()
    if text == "auto":
        return None
    if text in ("all", _FIRST_PER_NODE):
        return ExportRanks(text)
    if text.startswith("fraction:"):
        fraction = float(text.split(":", 1)[1])  # ValueError when not a number
        if not 0.0 < fraction <= 1.0:
            raise ValueError("the fraction must be > 0 and <= 1")
        return ExportRanks("fraction", fraction=fraction)
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() for p in parts):
        raise ValueError("not a rank choice")
    return ExportRanks("list", ranks=frozenset(int(p) for p in parts))


def resolve_export_ranks(value: Any, world_size: int) -> ExportRanks:
    """The choice for a run of ``world_size`` ranks (``auto`` resolved)."""
    parsed = parse_export_ranks(value)
    if parsed is not None:
        return parsed
    if world_size > AUTO_ALL_MAX_WORLD_SIZE:
        return ExportRanks(_FIRST_PER_NODE, auto=True)
    return ExportRanks("all", auto=True)


def routine_export(options: Any, rank: int, world_size: int, local_rank: int
                   ) -> tuple[bool, bool]:
    """(this rank sends its ordinary steps' spans, ... as summaries instead of steps)."""
    exports = resolve_export_ranks(options.export_ranks, world_size).exports(rank, local_rank)
    return exports, options.span_mode == "summary"
