"""Run identity: deterministic per-step trace ids, rank/world size, a run id all ranks share."""

from __future__ import annotations

import logging

import pytest
from train_helpers import clean_env  # noqa: F401  (autouse fixture)

from otel_train.identity import resolve_identity, step_trace_id

pytestmark = pytest.mark.timeout(30)


def test_step_trace_id_is_deterministic_128_bit_and_valid():
    a = step_trace_id("run-a", 7)
    assert a == step_trace_id("run-a", 7)
    assert 0 < a < 2**128


def test_step_trace_ids_differ_across_steps_and_runs():
    ids = {step_trace_id(run, step) for run in ("run-a", "run-b", "run-a1") for step in range(1000)}
    assert len(ids) == 3000
    # No accidental concatenation collisions ("run-a", 11) vs ("run-a1", 1).
    assert step_trace_id("run-a", 11) != step_trace_id("run-a1", 1)


def test_single_process_defaults_rank_zero_world_one_and_a_fresh_run_id():
    a = resolve_identity(environ={})
    b = resolve_identity(environ={})
    assert (a.rank, a.world_size, a.local_rank) == (0, 1, 0)
    assert a.run_id_source == "generated"
    assert a.run_id != b.run_id


def test_rank_world_size_and_local_rank_come_from_torchrun_env():
    ident = resolve_identity(environ={"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                                      "TORCHELASTIC_RUN_ID": "job-1"})
    assert (ident.rank, ident.world_size, ident.local_rank) == (3, 8, 1)


def test_torchelastic_run_id_is_the_run_id():
    ident = resolve_identity(environ={"RANK": "1", "WORLD_SIZE": "2",
                                      "TORCHELASTIC_RUN_ID": "elastic-42",
                                      "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"})
    assert ident.run_id == "elastic-42"
    assert ident.run_id_source == "torchelastic"


def test_torchelastic_run_id_none_is_not_an_id():
    env = {"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none",
           "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    ident = resolve_identity(environ=env)
    assert ident.run_id != "none"
    assert ident.run_id_source == "rendezvous"


def test_rendezvous_address_gives_every_rank_the_same_run_id():
    base = {"WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    r0 = resolve_identity(environ={**base, "RANK": "0", "LOCAL_RANK": "0"})
    r1 = resolve_identity(environ={**base, "RANK": "1", "LOCAL_RANK": "1"})
    assert r0.run_id == r1.run_id
    assert r0.run_id_source == r1.run_id_source == "rendezvous"
    assert (r0.rank, r1.rank) == (0, 1)
    other = resolve_identity(environ={**base, "RANK": "0", "MASTER_PORT": "29501"})
    assert other.run_id != r0.run_id
    # ... so step N of both ranks lands in one trace.
    assert step_trace_id(r0.run_id, 5) == step_trace_id(r1.run_id, 5)


def test_explicit_options_win_over_the_environment():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "TORCHELASTIC_RUN_ID": "elastic"}
    ident = resolve_identity(run_id="mine", rank=1, world_size=2, local_rank=0, environ=env)
    assert (ident.run_id, ident.rank, ident.world_size, ident.local_rank) == ("mine", 1, 2, 0)
    assert ident.run_id_source == "option"


def test_many_ranks_without_a_shared_id_warn(caplog):
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        ident = resolve_identity(environ={"RANK": "0", "WORLD_SIZE": "4"})
    assert ident.run_id_source == "generated"
    assert any("no shared run id" in r.getMessage() for r in caplog.records)


def test_non_integer_rank_env_is_ignored_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        ident = resolve_identity(environ={"RANK": "zero", "WORLD_SIZE": "1"})
    assert ident.rank == 0
    assert any("RANK" in r.getMessage() for r in caplog.records)
