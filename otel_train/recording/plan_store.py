"""Where governed intervals are published for every rank (``schedule.py``'s plan steps).

One process: an in-process dict. Several ranks: the key-value store of the default process
group (the ``TCPStore`` every rank already reaches: set by rank 0, read by the others with a
bounded wait). No collective is issued: the store is a side channel over TCP, outside the
communication streams. ``torch.distributed`` has no public accessor for the default group's
store, so its internal ``_get_default_store`` is used; where it is missing (another torch),
or the group is not initialized, there is no store and governing falls back (``schedule.py``).

Usage::

    store, reason = resolve_plan_store(world_size)
    store.set("k", "v"); store.get_plan("k", 30.0)
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any


class LocalPlanStore:
    """One process: plans in a dict."""

    def __init__(self) -> None:
        self._values: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        """Publish ``value`` under ``key``."""
        self._values[key] = value

    def get_plan(self, key: str, timeout_seconds: float) -> str | None:
        """The value under ``key`` (None: none was published)."""
        return self._values.get(key)


class ProcessGroupPlanStore:
    """Several ranks: the default process group's store."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def set(self, key: str, value: str) -> None:
        """Publish ``value`` under ``key`` (rank 0)."""
        self._store.set(key, value)

    def get_plan(self, key: str, timeout_seconds: float) -> str:
        """The value under ``key``, waiting at most ``timeout_seconds`` for it (raises on
        a timeout: the caller falls back)."""
        self._store.wait([key], timedelta(seconds=timeout_seconds))
        raw = self._store.get(key)
        return raw.decode() if isinstance(raw, bytes) else str(raw)


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
