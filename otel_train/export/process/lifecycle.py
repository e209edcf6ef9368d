"""The exporter-process client's lifecycle: one explicit state, its legal moves in one table.

::

    STARTING --child_ready--> READY --child_final--> FINAL
        |                       |
        +-------take_over-------+
                    |
                    v
                TAKEN_OVER

    STARTING, READY, FINAL, TAKEN_OVER --close--> CLOSED
    every state --fork--> FORKED (a forked training process's inert copy)

- STARTING: the child runs but has not reported yet; frames wait in this process.
- READY: the child reported once (its exporter is made); frames go down the pipe.
- FINAL: the child reported its final counts after a ``stop``.
- TAKEN_OVER: the child died or never started in time; this process exports.
- CLOSED: shut down; nothing more is sent.
- FORKED: this copy lives in a forked training process and never touches the child.

A move the table does not allow is refused, counted and logged (rate-limited), never
raised: the client's threads run beside training. Moves are made under the client's I/O
lock; the fork's move runs where only the forking thread exists.

Usage::

    lifecycle = ClientLifecycle()
    lifecycle.child_ready(); lifecycle.state is ClientState.READY
    lifecycle.close()
"""

from __future__ import annotations

import enum
import logging

from otel_train.common.rate_limited_log import RateLimitedLogger

_log = logging.getLogger("otel_train")


class ClientState(enum.Enum):
    """Where the exporter-process client stands (see the module's diagram)."""

    STARTING = "starting"
    READY = "ready"
    FINAL = "final"
    TAKEN_OVER = "taken_over"
    CLOSED = "closed"
    FORKED = "forked"


_S = ClientState
# Each state's legal next states: the whole lifecycle in one place.
LEGAL_MOVES: dict[ClientState, frozenset[ClientState]] = {
    _S.STARTING: frozenset({_S.READY, _S.TAKEN_OVER, _S.CLOSED, _S.FORKED}),
    _S.READY: frozenset({_S.FINAL, _S.TAKEN_OVER, _S.CLOSED, _S.FORKED}),
    _S.FINAL: frozenset({_S.CLOSED, _S.FORKED}),
    _S.TAKEN_OVER: frozenset({_S.CLOSED, _S.FORKED}),
    _S.CLOSED: frozenset({_S.FORKED}),
    # A fork of a forked copy is a copy all the same.
    _S.FORKED: frozenset({_S.FORKED}),
}
# The states in which the child is running and is expected to report.
CHILD_EXPECTED = frozenset({_S.STARTING, _S.READY})
# The states in which nothing more is sent or exported by this copy.
INERT = frozenset({_S.CLOSED, _S.FORKED})


class ClientLifecycle:
    """The client's one lifecycle state; each transition is one method."""

    def __init__(self) -> None:
        self.state = ClientState.STARTING
        self.refused_moves = 0  # illegal moves asked for (each logged, rate-limited)
        self.was_taken_over = False  # this process exported at some point (closed since)
        self._warn = RateLimitedLogger(_log)

    def child_ready(self) -> bool:
        """The child reported for the first time: its exporter is made."""
        return self._move(ClientState.READY)

    def child_final(self) -> bool:
        """The child reported its final counts (after a ``stop``)."""
        return self._move(ClientState.FINAL)

    def take_over(self) -> bool:
        """The child died or never started in time: this process exports from now on."""
        moved = self._move(ClientState.TAKEN_OVER)
        self.was_taken_over = self.was_taken_over or moved
        return moved

    def close(self) -> bool:
        """Shut down: nothing more is sent."""
        return self._move(ClientState.CLOSED)

    def fork(self) -> bool:
        """This copy is in a forked training process: inert from now on."""
        return self._move(ClientState.FORKED)

    @property
    def inert(self) -> bool:
        """Closed or forked: nothing more to send or export."""
        return self.state in INERT

    @property
    def child_expected(self) -> bool:
        """The child should be alive and reporting (starting or ready)."""
        return self.state in CHILD_EXPECTED

    def _move(self, to: ClientState) -> bool:
        """Move to ``to`` if the table allows it; else refuse, count and log."""
        now = self.state
        if to in LEGAL_MOVES[now]:
            self.state = to
            return True
        self.refused_moves += 1
        self._warn.warning(f"move:{now.name}->{to.name}",
                           "otel-train: the exporter process client refused to move from "
                           "%s to %s (it stays %s)", now.name, to.name, now.name)
        return False
