"""Where governed intervals are published for every rank (``schedule.py``'s plan steps).

One process: an in-process dict. Several ranks: the key-value store of the default process
group (the ``TCPStore`` every rank already reaches: set by rank 0, read by the others with a
bounded wait). No collective is issued: the store is a side channel over TCP, outside the
communication streams. ``torch.distributed`` has no public accessor for the default group's
store, so its internal ``_get_default_store`` is used; where it is missing (another torch),
or the group is not initialized, there is no store and governing falls back (``schedule.py``).

Usage::

    store, reason = resolve_plan_store(world_size)
    store.set("k", {"val_loss": (167, 0.15)}); store.get_plan("k", 30.0)
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any


Plan = dict[str, Any]  # {operation: [interval, share at the interval it replaces]}


class LocalPlanStore:
    """One process: plans in a dict (the latest two kept)."""

    def __init__(self) -> None:
        self._values: dict[str, Plan] = {}

    def set(self, key: str, plan: Plan) -> None:
        """Publish ``plan`` under ``key``."""
        if len(self._values) >= 2:
            self._values.pop(next(iter(self._values)))
        self._values[key] = dict(plan)

    def get_plan(self, key: str, timeout_seconds: float) -> Plan | None:
        """The plan under ``key`` (None: none was published)."""
        return self._values.get(key)


class ProcessGroupPlanStore:
    """Several ranks: the default process group's store, plans as JSON."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def set(self, key: str, plan: Plan) -> None:
        """Publish ``plan`` under ``key`` (rank 0)."""
        self._store.set(key, json.dumps({name: list(v) for name, v in plan.items()}))

    def get_plan(self, key: str, timeout_seconds: float) -> Plan:
        """The plan under ``key``, waiting at most ``timeout_seconds`` for it (raises on
        a timeout: the caller falls back)."""
        self._store.wait([key], timedelta(seconds=timeout_seconds))
        raw = self._store.get(key)
        plan: Plan = json.loads(raw.decode() if isinstance(raw, bytes) else str(raw))
        return plan


def resolve_plan_store(world_size: int) -> tuple[Any, str]:
    """(store, "") or (None, why there is none)."""
    if world_size <= 1:
        return LocalPlanStore(), ""
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d
    except Exception as exc:  # torch missing or built without distributed
        return None, f"torch.distributed cannot be imported ({exc!r})"
    if not dist.is_available() or not dist.is_initialized():
        return None, (f"world_size={world_size} but torch.distributed is not initialized, so "
                      "there is no process-group store to keep every rank's intervals equal")
    getter = getattr(distributed_c10d, "_get_default_store", None)
    if getter is None:
        return None, "this torch has no default process-group store to publish intervals in"
    try:
        return ProcessGroupPlanStore(getter()), ""
    except Exception as exc:
        return None, f"the process group's store is not reachable ({exc!r})"
