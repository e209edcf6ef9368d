"""The exporter-process client's lifecycle: one state, legal moves in one table, illegal ones
refused and logged, never raised."""

from __future__ import annotations

import logging

import pytest

from otel_train.export.process.lifecycle import (
    LEGAL_MOVES,
    ClientLifecycle,
    ClientState,
)

S = ClientState
# A legal path from STARTING to each state.
_PATHS: dict[ClientState, list[str]] = {
    S.STARTING: [],
    S.READY: ["child_ready"],
    S.FINAL: ["child_ready", "child_final"],
    S.TAKEN_OVER: ["take_over"],
    S.CLOSED: ["close"],
    S.FORKED: ["fork"],
}
# The transition method that moves to each state.
_METHOD = {S.READY: "child_ready", S.FINAL: "child_final", S.TAKEN_OVER: "take_over",
           S.CLOSED: "close", S.FORKED: "fork"}


def _in(state: ClientState) -> ClientLifecycle:
    lifecycle = ClientLifecycle()
    for method in _PATHS[state]:
        assert getattr(lifecycle, method)()
    assert lifecycle.state is state
    return lifecycle


def test_a_client_starts_in_starting_and_every_state_has_its_legal_moves() -> None:
    assert ClientLifecycle().state is S.STARTING
    assert set(LEGAL_MOVES) == set(ClientState)
    assert all(to is not S.STARTING for moves in LEGAL_MOVES.values() for to in moves)


# Sorted: the moves are sets, and every collection (an xdist worker's too) must list them alike.
@pytest.mark.parametrize("start,to", [(a, b) for a, moves in LEGAL_MOVES.items()
                                      for b in sorted(moves, key=lambda s: s.name)],
                         ids=lambda s: s.name)
def test_each_legal_transition_moves_to_its_state_and_logs_nothing(
        start: ClientState, to: ClientState, caplog: pytest.LogCaptureFixture) -> None:
    lifecycle = _in(start)
    with caplog.at_level(logging.DEBUG, logger="otel_train"):
        assert getattr(lifecycle, _METHOD[to])() is True
    assert lifecycle.state is to
    assert lifecycle.refused_moves == 0
    assert caplog.records == []


_ILLEGAL = [(a, b) for a in ClientState for b in _METHOD if b not in LEGAL_MOVES[a]]


@pytest.mark.parametrize("start,to", _ILLEGAL, ids=lambda s: s.name)
def test_an_illegal_transition_is_refused_counted_and_logged_never_raised(
        start: ClientState, to: ClientState, caplog: pytest.LogCaptureFixture) -> None:
    lifecycle = _in(start)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        assert getattr(lifecycle, _METHOD[to])() is False
    assert lifecycle.state is start
    assert lifecycle.refused_moves == 1
    (record,) = caplog.records
    assert f"refused to move from {start.name} to {to.name}" in record.getMessage()


def test_a_repeated_illegal_transition_is_counted_each_time_and_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    lifecycle = _in(S.FINAL)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for _ in range(5):
            lifecycle.take_over()
    assert lifecycle.refused_moves == 5
    assert len(caplog.records) == 1  # rate-limited: a background thread may ask again


@pytest.mark.parametrize("start", list(ClientState), ids=lambda s: s.name)
def test_fork_from_every_state_makes_the_copy_forked_and_inert(start: ClientState) -> None:
    lifecycle = _in(start)
    assert lifecycle.fork() is True
    assert lifecycle.state is S.FORKED
    assert lifecycle.inert and not lifecycle.child_expected


@pytest.mark.parametrize("start", list(ClientState), ids=lambda s: s.name)
def test_close_from_every_live_state_closes_and_a_closed_or_forked_copy_stays_as_it_is(
        start: ClientState) -> None:
    lifecycle = _in(start)
    closed = lifecycle.close()
    if start in (S.CLOSED, S.FORKED):
        assert not closed and lifecycle.state is start and lifecycle.refused_moves == 1
    else:
        assert closed and lifecycle.state is S.CLOSED
    assert lifecycle.inert


@pytest.mark.parametrize("state", list(ClientState), ids=lambda s: s.name)
def test_the_child_is_expected_to_report_only_while_starting_or_ready(
        state: ClientState) -> None:
    assert _in(state).child_expected is (state in (S.STARTING, S.READY))
