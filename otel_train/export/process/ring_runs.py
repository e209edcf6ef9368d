"""The steps at the head of the ring reader's items taken in one go, up to the next marker.

``ChildRingFeed._pass`` (ring_feed.py) goes through what it read item by item where a step
may have to wait (the run's first step for ``start_run``'s time, a step for the collectives'
entries that cover it); otherwise every step up to the next ``QUEUED`` marker goes into the
same run, and this takes them at once, in C loops (``map``, ``list.index``), not a Python
statement a step.

Usage::

    run: list[RingStep] = []
    end = take_steps(items, run)   # items: deque of (step or QUEUED, end, ordinal)
"""

from __future__ import annotations

from collections import deque
from operator import itemgetter
from typing import Any

from otel_train.recording.step_ring import QUEUED

__all__ = ["take_steps"]

_ITEM = itemgetter(0)
_END = itemgetter(1)


def take_steps(items: deque[tuple[Any, int, int]], run: list[Any]) -> int:
    """Pop the steps at the head of ``items`` up to the first marker (or all of them) and
    append them to ``run``, in order; the byte position after the last one taken. The head of
    ``items`` must be a step."""
    heads = list(map(_ITEM, items))
    try:
        count = heads.index(QUEUED)
    except ValueError:  # no marker: all of them
        end = _END(items[-1])
        items.clear()
        run += heads
        return end
    end = _END(items[count - 1])
    for _ in range(count):
        items.popleft()
    run += heads[:count]
    return end
