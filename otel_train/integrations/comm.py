"""Communication per step: DDP's gradient all-reduce and explicit ``torch.distributed`` calls.

otel-train never adds a collective; it only timestamps the ones the training already runs:

- ``instrument_ddp(model, run)`` registers a DDP communication hook that wraps the default
  all-reduce hook (or yours: ``hook=``, ``state=``). Per gradient bucket it takes one
  timestamp when DDP hands the bucket over (on the thread running backward) and one when
  the bucket's future completes (a done-callback on the process group's thread), and
  returns the wrapped hook's own future: no extra future, no extra copy. DDP allows one
  hook per model, registered before the first backward.
- ``instrument_collectives(run)`` wraps the ``torch.distributed`` functions (``all_reduce``,
  ``all_gather*``, ``reduce_scatter*``, ``broadcast``, ``reduce``, ``all_to_all*``,
  ``barrier``) until ``remove()``: blocking calls are timed around the call, ``async_op=True``
  calls up to their future's completion. FSDP (``fully_shard``) issues its all-gathers and
  reduce-scatters through these functions, so they are counted with it on; their exposed
  time is not measured (the wait is FSDP's own stream/``wait()`` logic).

Each step's root span then carries ``train.comm.count``, ``train.comm.bytes``,
``train.comm.seconds``, ``train.comm.exposed_seconds`` and ``train.own_work_seconds``
(``records/comm_summary.py``, ``derived/comm_metrics.py``).

Usage::

    model = DistributedDataParallel(net)
    with otel_train.start_run() as run:
        otel_train.instrument_ddp(model, run)
        with otel_train.instrument_collectives(run):   # optional: explicit dist.* calls
            for step in run.steps(loader):
                ...
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from otel_train.recording.collectives import (
    KIND_ASYNC,
    KIND_BLOCKING,
    KIND_OVERLAPPED,
    CollectiveLog,
)
from otel_train.run import Run

# The functions instrument_collectives wraps, with the position of the tensor (or list of
# tensors) this rank sends: its bytes are the collective's payload.
COLLECTIVES: dict[str, int | None] = {
    "all_reduce": 0, "broadcast": 0, "reduce": 0,
    "all_gather": 1, "all_gather_into_tensor": 1, "all_gather_single": 1,
    "reduce_scatter": 1, "reduce_scatter_tensor": 1, "reduce_scatter_single": 1,
    "all_to_all": 1, "all_to_all_single": 1, "barrier": None,
}
# Set while a DDP hook of ours runs on this thread: the default hook calls dist.all_reduce,
# which instrument_collectives must not count a second time.
_inside_ddp_hook = threading.local()


def instrument_ddp(model: Any, run: Run, hook: Callable[..., Any] | None = None,
                   state: Any = None, op: str | None = None) -> bool:
    """Register a comm hook on ``model`` (a ``DistributedDataParallel``) that times each
    gradient bucket's reduction for ``run``; ``hook``/``state`` as for
    ``register_comm_hook`` (default: torch's ``allreduce_hook`` on the default group).
    Returns False when the run is disabled (``hook`` is registered untimed)."""
    if hook is None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import (
            allreduce_hook,
        )

        hook, op = allreduce_hook, op or "all_reduce"
    log = run.collective_log()
    if log is None:
        model.register_comm_hook(state, hook)
        return False
    name = op or getattr(hook, "__name__", "ddp_comm_hook")  # a partial has no __name__
    model.register_comm_hook(state, timed_comm_hook(hook, log, name))
    return True


def timed_comm_hook(hook: Callable[..., Any], log: CollectiveLog, op: str
                    ) -> Callable[[Any, Any], torch.futures.Future]:
    """``hook`` with a timestamp at hand-over and one when its future completes."""
    begin, end = log.begin, log.end
    inside = _inside_ddp_hook

    # No annotations: DDP's register_comm_hook compares them with dist.GradBucket and
    # Future[Tensor], and under ``from __future__ import annotations`` they are strings.
    def otel_train_timed_hook(state, bucket):  # type: ignore[no-untyped-def]
        buffer = bucket.buffer()
        entry = begin(op, buffer.numel() * buffer.element_size(), KIND_OVERLAPPED)
        inside.active = True
        try:
            fut = hook(state, bucket)
        finally:
            inside.active = False
        fut.add_done_callback(lambda _fut: end(entry))
        return fut

    return otel_train_timed_hook


class CollectiveWrappers:
    """The ``torch.distributed`` functions wrapped for one run; ``remove()`` restores them."""

    def __init__(self, log: CollectiveLog | None) -> None:
        self._originals: dict[str, Callable[..., Any]] = {}
        if log is None:
            return
        for name, arg in COLLECTIVES.items():
            original = getattr(dist, name, None)
            if original is None or getattr(original, "_otel_train_wrapped", False):
                continue  # absent in this torch, or wrapped for another run still open
            self._originals[name] = original
            setattr(dist, name, _timed_collective(original, name, arg, log))

    def remove(self) -> None:
        """Put the original functions back."""
        for name, original in self._originals.items():
            setattr(dist, name, original)
        self._originals.clear()

    def __enter__(self) -> CollectiveWrappers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def instrument_collectives(run: Run) -> CollectiveWrappers:
    """Time explicit ``torch.distributed`` collectives for ``run`` until ``remove()``."""
    return CollectiveWrappers(run.collective_log())


def _timed_collective(original: Callable[..., Any], op: str, arg: int | None,
                      log: CollectiveLog) -> Callable[..., Any]:
    begin, end = log.begin, log.end
    inside = _inside_ddp_hook

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if getattr(inside, "active", False):
            return original(*args, **kwargs)  # DDP's bucket: the hook times it
        is_async = bool(kwargs.get("async_op"))
        entry = begin(op, payload_bytes(args, kwargs, arg),
                      KIND_ASYNC if is_async else KIND_BLOCKING)
        work = original(*args, **kwargs)
        if is_async and work is not None:
            work.get_future().add_done_callback(lambda _fut: end(entry))
        else:
            end(entry)
        return work

    timed._otel_train_wrapped = True  # type: ignore[attr-defined]
    return timed


_INPUT_KEYWORDS = ("tensor", "input_tensor", "input", "input_tensor_list", "input_list")


def payload_bytes(args: tuple[Any, ...], kwargs: dict[str, Any], arg: int | None) -> int:
    """Bytes of the tensor (or tensors) this rank sends; 0 where there is none."""
    if arg is None:
        return 0
    value = args[arg] if len(args) > arg else next(
        (kwargs[k] for k in _INPUT_KEYWORDS if k in kwargs), None)
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(t.numel() * t.element_size() for t in value if isinstance(t, torch.Tensor))
    return 0
