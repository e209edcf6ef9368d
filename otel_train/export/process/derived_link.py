"""Where the derived metrics are fed when the exporter process runs them (derived/chain.py).

The child feeds its own chain from the records it is sent and sends the chain's state back;
this process loads that state into its copy. Should the child be unable to run the chain,
or die, this process feeds its copy itself from then on (``fed_here``), going on from the
last state it loaded.

Usage::

    link = DerivedMetricsLink()
    link.attach(self_cost, on_state, feed)    # derive_metrics()
    link.load_state(state)                    # a "derived" report from the child
    if link.fed_here: link.feed_here(recs)    # the records the child will never see
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from otel_train.common.rate_limited_log import RateLimitedLogger


class DerivedMetricsLink:
    """The derived-metrics chain of this process, as the exporter process's copy."""

    def __init__(self, warn: RateLimitedLogger) -> None:
        self._warn = warn
        self.self_cost: Any = None  # this process's own cost meter (its ``total_ns``)
        self.on_state: Callable[[Any], None] | None = None
        self.feed: Callable[[list[tuple[Any, ...]]], None] | None = None
        # Not lifecycle but routing: this process feeds the chain (the child could not run
        # it, or export was taken over).
        self.fed_here = False

    def attach(self, self_cost: Any, on_state: Callable[[Any], None],
               feed: Callable[[list[tuple[Any, ...]]], None]) -> None:
        """The chain is handed to the exporter process from now on."""
        self.self_cost, self.on_state, self.feed = self_cost, on_state, feed

    @property
    def attached(self) -> bool:
        """The chain was handed to the exporter process."""
        return self.feed is not None

    def self_cost_ns(self) -> int:
        """The training process's own cost so far, for the child's overhead figures."""
        return self.self_cost.total_ns if self.self_cost is not None else 0

    def load_state(self, state: Any) -> None:
        """Load the child's chain state into this process's copy (never raises)."""
        if self.on_state is None or self.fed_here:
            return
        try:
            self.on_state(state)
        except Exception as exc:
            self._warn.warning("state", "otel-train: could not load the exporter process's "
                               "metrics state: %r", exc)

    def feed_here(self, recs: list[tuple[Any, ...]]) -> None:
        """Feed records to this process's chain, which goes on from the last state."""
        if self.feed is None:
            return
        try:
            self.feed(recs)
        except Exception as exc:
            self._warn.warning("feed", "otel-train: derived metrics failed: %r", exc)
