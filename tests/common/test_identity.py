"""Run identity: deterministic per-step trace ids, rank/world size, a run id all ranks share."""

from __future__ import annotations

import logging
import socket

import pytest
from train_helpers import clean_env  # noqa: F401  (autouse fixture)

from otel_train.common.identity import resolve_identity, resource_attributes, step_trace_id
from otel_train.common.sdk_config import build_resource

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


# -- launchers: every rank reads the same environment, so no collective is needed ---------

def _ranks(env: dict[str, str], n: int, rank_var: str = "RANK") -> list:
    return [resolve_identity(environ={**env, rank_var: str(r)}) for r in range(n)]


def test_every_srun_task_gets_the_job_and_step_as_run_id_and_its_rank_from_slurm():
    env = {"SLURM_JOB_ID": "4711", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4",
           "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}
    idents = _ranks(env, 4, rank_var="SLURM_PROCID")
    assert {i.run_id for i in idents} == {"slurm-4711.0"}
    assert {i.run_id_source for i in idents} == {"slurm"}
    assert [i.rank for i in idents] == [0, 1, 2, 3]
    assert {i.world_size for i in idents} == {4}  # the step's tasks, not the allocation's
    assert {i.local_rank for i in idents} == {1}


def test_torchrun_inside_srun_keeps_torchrun_ranks_and_shares_the_slurm_run_id():
    env = {"SLURM_JOB_ID": "4711", "SLURM_STEP_ID": "2", "SLURM_PROCID": "1",
           "SLURM_NTASKS": "2", "WORLD_SIZE": "16", "LOCAL_RANK": "3",
           "TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "node1", "MASTER_PORT": "29500"}
    idents = _ranks(env, 16)
    assert {i.run_id for i in idents} == {"slurm-4711.2"}
    assert [i.rank for i in idents] == list(range(16))
    assert {(i.world_size, i.local_rank) for i in idents} == {(16, 3)}


def test_a_single_process_in_the_batch_script_does_not_reuse_the_job_id():
    # Successive runs in one batch script would otherwise share every step's trace id.
    env = {"SLURM_JOB_ID": "4711", "SLURM_NTASKS": "8", "SLURM_PROCID": "0"}
    a, b = resolve_identity(environ=env), resolve_identity(environ=env)
    assert a.run_id != b.run_id and a.run_id_source == "generated"
    assert (a.rank, a.world_size) == (0, 1)  # the allocation's 8 tasks are not this run's


def test_the_batch_step_of_slurm_is_not_an_srun_step():
    env = {"SLURM_JOB_ID": "4711", "SLURM_STEP_ID": "4294967294", "WORLD_SIZE": "2",
           "RANK": "1", "MASTER_ADDR": "n1", "MASTER_PORT": "1"}
    assert resolve_identity(environ=env).run_id == "slurm-4711"


def test_train_run_id_in_otel_resource_attributes_is_the_run_id_for_every_rank():
    env = {"OTEL_RESOURCE_ATTRIBUTES": "team=nlp,train.run.id=exp%2042,host.name=h",
           "WORLD_SIZE": "3", "TORCHELASTIC_RUN_ID": "elastic", "SLURM_JOB_ID": "1",
           "SLURM_STEP_ID": "0"}
    idents = _ranks(env, 3)
    assert {(i.run_id, i.run_id_source) for i in idents} == {("exp 42", "resource")}


def test_kubernetes_job_names_give_every_pod_the_same_run_id():
    for env, want in (
        ({"OTEL_RESOURCE_ATTRIBUTES": "k8s.job.name=llm-pretrain"}, "k8s-llm-pretrain"),
        ({"JOBSET_NAME": "llm-jobset"}, "k8s-llm-jobset"),
        ({"KUBEFLOW_JOB_NAME": "pytorchjob-a"}, "k8s-pytorchjob-a"),
    ):
        idents = _ranks({**env, "WORLD_SIZE": "4", "MASTER_ADDR": "x-master-0",
                         "MASTER_PORT": "23456"}, 4)
        assert {(i.run_id, i.run_id_source) for i in idents} == {(want, "kubernetes")}, env


def test_the_option_still_wins_over_every_launcher():
    env = {"OTEL_RESOURCE_ATTRIBUTES": "train.run.id=r", "SLURM_JOB_ID": "1",
           "SLURM_STEP_ID": "0", "JOBSET_NAME": "j"}
    assert resolve_identity(run_id="mine", environ=env).run_id_source == "option"


def test_resource_attributes_name_the_rank_its_host_and_its_pod():
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "trainer-0-3",
           "POD_NAMESPACE": "ml"}
    ident = resolve_identity(run_id="r1", rank=3, world_size=8, environ=env)
    attrs = resource_attributes(ident, env)
    assert attrs["service.instance.id"] == "r1/rank3"
    assert attrs["train.run.id"] == "r1"
    assert attrs["host.name"] == socket.gethostname()
    assert attrs["k8s.pod.name"] == "trainer-0-3"
    assert attrs["k8s.namespace.name"] == "ml"
    # Outside Kubernetes HOSTNAME is not a pod name.
    plain = resource_attributes(ident, {"HOSTNAME": "laptop"})
    assert "k8s.pod.name" not in plain


def test_attributes_the_user_set_win_except_the_per_rank_instance_id():
    env = {"OTEL_RESOURCE_ATTRIBUTES": "host.name=given,service.instance.id=same-for-all",
           "K8S_POD_NAME": "p-1"}
    attrs = resource_attributes(resolve_identity(run_id="r", rank=1, world_size=2,
                                                 environ=env), env)
    assert "host.name" not in attrs  # the SDK's environment detector puts the given one in
    assert attrs["k8s.pod.name"] == "p-1"
    assert attrs["service.instance.id"] == "r/rank1"


def test_a_run_resource_carries_the_identity_and_the_users_attributes(monkeypatch):
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,host.name=h1")
    ident = resolve_identity(run_id="r9", rank=2, world_size=4, environ={})
    resource = build_resource("svc", resource_attributes(ident))
    attrs = dict(resource.attributes)
    assert attrs["service.instance.id"] == "r9/rank2"
    assert attrs["host.name"] == "h1"
    assert attrs["deployment.environment"] == "prod"
    assert attrs["service.name"] == "svc"
