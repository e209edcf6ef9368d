"""Who this process is in a (possibly distributed) run, and the ids its traces get.

Every rank of one run must agree on the run id, so that step N of every rank lands in one
trace: the trace id is derived from (run id, step), never drawn at random. The run id comes,
first found wins, from: the ``run_id`` option; ``train.run.id`` in ``OTEL_RESOURCE_ATTRIBUTES``;
``TORCHELASTIC_RUN_ID`` (torchrun); ``SLURM_JOB_ID`` + ``SLURM_STEP_ID`` (srun); a Kubernetes
job name (``k8s.job.name`` in ``OTEL_RESOURCE_ATTRIBUTES``, or ``JOBSET_NAME`` /
``KUBEFLOW_JOB_NAME`` exposed through the downward API); a one-time broadcast when
torch.distributed is initialized; the rendezvous address; else a fresh id. Every launcher
source is read from the environment every rank inherits, so no collective is needed.

Usage::

    ident = resolve_identity()                         # rank 3 of 8, run "slurm-4711.0"
    attrs = resource_attributes(ident)                 # host.name, k8s.pod.name, ...
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import socket
import sys
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

_log = logging.getLogger("otel_train")


@dataclass(frozen=True)
class RunIdentity:
    """Run id, rank, world size and local rank of this process."""

    run_id: str
    rank: int
    world_size: int
    local_rank: int
    # "option", "resource", "torchelastic", "slurm", "kubernetes", "broadcast", "rendezvous",
    # "generated"
    run_id_source: str


def step_trace_id(run_id: str, step: int) -> int:
    """The 128-bit trace id every rank uses for step ``step`` of run ``run_id``."""
    digest = hashlib.blake2b(f"{run_id}\x00{step}".encode(), digest_size=16).digest()
    value = int.from_bytes(digest, "big")
    return value or 1  # 0 is the invalid trace id


def _dist():
    # Only look at torch.distributed if the application already imported torch: importing
    # torch just to learn that it is not distributed would cost a second at start-up.
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = getattr(torch, "distributed", None)
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist
    except Exception:  # pragma: no cover - defensive against odd builds
        return None
    return None


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        _log.warning("otel-train: ignoring %s=%r (not an integer)", name, raw)
        return None


def resolve_identity(
    run_id: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> RunIdentity:
    """Rank and world size from the options, torch.distributed or the torchrun environment."""
    env = os.environ if environ is None else environ
    dist = _dist()
    # srun starts one process per task and says which (only inside a step: the batch
    # script itself sees the allocation's task count, not its own).
    srun = _slurm_step(env) is not None
    if rank is None:
        rank = dist.get_rank() if dist is not None else _env_int(env, "RANK")
        if rank is None and srun and dist is None:
            rank = _env_int(env, "SLURM_PROCID")
    if world_size is None:
        world_size = dist.get_world_size() if dist is not None else _env_int(env, "WORLD_SIZE")
        if world_size is None and srun and dist is None and "RANK" not in env:
            world_size = _env_int(env, "SLURM_STEP_NUM_TASKS") or _env_int(env, "SLURM_NTASKS")
    rank = 0 if rank is None else rank
    world_size = 1 if world_size is None else world_size
    if local_rank is None:
        local_rank = _env_int(env, "LOCAL_RANK")
        if local_rank is None and srun and "RANK" not in env:
            local_rank = _env_int(env, "SLURM_LOCALID")
    local_rank = rank if local_rank is None and world_size == 1 else (local_rank or 0)

    source = "option"
    if run_id is None:
        launched = _launcher_run_id(env, world_size)
        if launched is not None:
            run_id, source = launched
        elif world_size > 1 and dist is not None:
            # An explicit, one-time collective at start-up: rank 0 draws the id, all agree.
            box = [_generated_run_id() if rank == 0 else None]
            dist.broadcast_object_list(box, src=0)
            run_id, source = str(box[0]), "broadcast"
        elif world_size > 1 and env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
            # Every rank sees the same rendezvous address: derive a shared id from it. On one
            # node the ranks also share their launcher (torchrun's agent) as parent process,
            # which tells apart successive jobs on the same address and port.
            seed = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
            local_world = _env_int(env, "LOCAL_WORLD_SIZE")
            if local_world == world_size:
                seed += f":{os.getppid()}"
            run_id = "rdzv-" + hashlib.blake2b(seed.encode(), digest_size=6).hexdigest()
            source = "rendezvous"
        else:
            if world_size > 1:
                _log.warning(
                    "otel-train: %d ranks but no shared run id (set run_id= or "
                    "OTEL_TRAIN_RUN_ID); step traces of different ranks will not line up",
                    world_size,
                )
            run_id, source = _generated_run_id(), "generated"
    return RunIdentity(run_id, rank, world_size, local_rank, source)


def _generated_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


# Slurm's numeric ids of the batch and extern steps (SLURM_BATCH_SCRIPT, SLURM_EXTERN_CONT).
_SLURM_NON_SRUN_STEPS = {"batch", "extern", "interactive", "4294967294", "4294967295",
                         "4294967293"}


def _slurm_step(env: Mapping[str, str]) -> str | None:
    """The srun step id, or None outside an srun step (no Slurm, or the batch script)."""
    step = (env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID") or "").strip()
    if not step or step in _SLURM_NON_SRUN_STEPS or not env.get("SLURM_JOB_ID"):
        return None
    return step


def parse_resource_attributes(raw: str | None) -> dict[str, str]:
    """``OTEL_RESOURCE_ATTRIBUTES`` (``k=v,k2=v2``, values percent-encoded) as a dict."""
    out: dict[str, str] = {}
    for item in (raw or "").split(","):
        key, sep, value = item.partition("=")
        key = key.strip()
        if sep and key:
            out[key] = urllib.parse.unquote(value.strip())
    return out


def _launcher_run_id(env: Mapping[str, str], world_size: int) -> tuple[str, str] | None:
    """(run id, source) from what a launcher put in every rank's environment, or None."""
    resource = parse_resource_attributes(env.get("OTEL_RESOURCE_ATTRIBUTES"))
    explicit = resource.get("train.run.id", "").strip()
    if explicit:
        return explicit, "resource"
    elastic = env.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic != "none":
        return elastic, "torchelastic"
    job = (env.get("SLURM_JOB_ID") or "").strip()
    if job:
        step = _slurm_step(env)
        if step is not None:
            return f"slurm-{job}.{step}", "slurm"
        if world_size > 1:
            # Several ranks in the batch step itself (one launcher per node started there).
            return f"slurm-{job}", "slurm"
        # One process in the batch script: successive runs of one script must not share ids.
    for name in (resource.get("k8s.job.name"), env.get("JOBSET_NAME"),
                 env.get("KUBEFLOW_JOB_NAME")):
        if name and name.strip():
            return f"k8s-{name.strip()}", "kubernetes"
    return None


def _kubernetes_pod_name(env: Mapping[str, str]) -> str | None:
    """The pod's name: a downward-API variable, else HOSTNAME (a pod's hostname is its name)."""
    for var in ("K8S_POD_NAME", "POD_NAME", "KUBERNETES_POD_NAME"):
        value = (env.get(var) or "").strip()
        if value:
            return value
    if env.get("KUBERNETES_SERVICE_HOST"):
        value = (env.get("HOSTNAME") or "").strip()
        if value:
            return value
    return None


def resource_attributes(identity: RunIdentity,
                        environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Per-rank resource attributes: ``service.instance.id``, ``host.name``, ``k8s.*``.

    Values the user set in ``OTEL_RESOURCE_ATTRIBUTES`` win over what is detected here
    (``service.instance.id`` excepted: it must differ per rank, so it is always ours).
    """
    env = os.environ if environ is None else environ
    given = parse_resource_attributes(env.get("OTEL_RESOURCE_ATTRIBUTES"))
    attrs: dict[str, str] = {
        "service.instance.id": f"{identity.run_id}/rank{identity.rank}",
        "train.run.id": identity.run_id,
    }
    detected: dict[str, str | None] = {"host.name": socket.gethostname() or None}
    detected["k8s.pod.name"] = _kubernetes_pod_name(env)
    detected["k8s.namespace.name"] = (env.get("K8S_NAMESPACE") or env.get("POD_NAMESPACE")
                                      or None)
    detected["k8s.node.name"] = env.get("K8S_NODE_NAME") or env.get("NODE_NAME") or None
    for key, value in detected.items():
        if value and key not in given:
            attrs[key] = value
    return attrs
