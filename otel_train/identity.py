"""Who this process is in a (possibly distributed) run, and the ids its traces get.

Every rank of one run must agree on the run id, so that step N of every rank lands in one
trace: the trace id is derived from (run id, step), never drawn at random.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import sys
import time
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
    run_id_source: str  # "option", "torchelastic", "broadcast", "rendezvous", "generated"


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
    if rank is None:
        rank = dist.get_rank() if dist is not None else _env_int(env, "RANK")
    if world_size is None:
        world_size = dist.get_world_size() if dist is not None else _env_int(env, "WORLD_SIZE")
    rank = 0 if rank is None else rank
    world_size = 1 if world_size is None else world_size
    if local_rank is None:
        local_rank = _env_int(env, "LOCAL_RANK")
    local_rank = rank if local_rank is None and world_size == 1 else (local_rank or 0)

    source = "option"
    if run_id is None:
        elastic = env.get("TORCHELASTIC_RUN_ID")
        if elastic and elastic != "none":
            run_id, source = elastic, "torchelastic"
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
