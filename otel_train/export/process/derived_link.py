"""Where the derived metrics are fed when the exporter process runs them (derived/chain.py).

The child feeds its own chain from the records it is sent and sends the chain's state back;
this process loads that state into its copy. Until the child is ready (its interpreter and
imports take ~0.5 s), this process feeds its copy itself, so the console's first lines print
on time; the child then gets that state and goes on from it. Should the child be unable to run the chain,
or die, this process feeds its copy itself from then on (``fed_here``), going on from the
last state it loaded.

Usage::

    link = DerivedMetricsLink()
    link.attach(self_cost, on_state, feed, take_state)    # derive_metrics()
    link.feed_here(recs)      # before the child is ready: the console prints on time
    state = link.hand_over()  # once it is ready: the child goes on from there
    link.load_state(state)    # a "derived" report from the child
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
        self.take_state: Callable[[], Any] | None = None
        self._fed_before_ready = False  # fed here before the child was ready: hand over

    def attach(self, self_cost: Any, on_state: Callable[[Any], None],
               feed: Callable[[list[tuple[Any, ...]]], None],
               take_state: Callable[[], Any] | None = None) -> None:
        """The chain is handed to the exporter process from now on; with ``take_state``
        this process feeds it until the child is ready, then hands the state over."""
        self.self_cost, self.on_state, self.feed = self_cost, on_state, feed
        self.take_state = take_state

    @property
    def feeds_until_ready(self) -> bool:
        """Records sent before the child is ready go through this process's chain."""
        return self.take_state is not None and self.feed is not None and not self.fed_here

    def hand_over(self) -> Any:
        """The chain's state for the child, once, if this process fed it (else None)."""
        if not self._fed_before_ready or self.take_state is None:
            return None
        self._fed_before_ready = False
        try:
            return self.take_state()
        except Exception as exc:
            self._warn.warning("state", "otel-train: could not hand the metrics state to "
                               "the exporter process: %r", exc)
            return None

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
        self._fed_before_ready = not self.fed_here  # the child needs this state
        try:
            self.feed(recs)
        except Exception as exc:
            self._warn.warning("feed", "otel-train: derived metrics failed: %r", exc)
