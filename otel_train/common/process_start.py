"""When this process started, in epoch nanoseconds: where the job's start-up begins.

Read from ``/proc/self/stat`` (field 22, ``starttime``, in clock ticks after boot) against
``/proc/uptime`` (seconds since boot, to 10 ms), without psutil: the process's age, taken from
the epoch clock now. Where ``/proc`` cannot tell (not Linux, a restricted container), the
caller falls back to the time ``start_run`` was called and says so (``source``).

Usage::

    start = process_start()            # ProcessStart(epoch_ns=..., source="process") or None
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessStart:
    """The process's start in epoch nanoseconds, and where that figure came from."""

    epoch_ns: int
    source: str  # "process" (/proc) | "start_run" (the fallback)


def process_age_seconds(stat_text: str, uptime_text: str, ticks_per_second: int) -> float:
    """The process's age from the text of ``/proc/self/stat`` and ``/proc/uptime``."""
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat_text[stat_text.rindex(")") + 2:].split()
    start_ticks = int(fields[19])  # field 22 overall; fields[0] here is field 3
    uptime_seconds = float(uptime_text.split()[0])
    return max(0.0, uptime_seconds - start_ticks / ticks_per_second)


def process_start() -> ProcessStart | None:
    """This process's start (epoch ns) from /proc, or None where /proc cannot tell."""
    try:
        with open("/proc/self/stat", encoding="ascii", errors="replace") as f:
            stat_text = f.read()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime_text = f.read()
        ticks = os.sysconf("SC_CLK_TCK")
        age = process_age_seconds(stat_text, uptime_text, ticks)
    except (OSError, ValueError, IndexError):
        return None
    return ProcessStart(time.time_ns() - int(age * 1e9), "process")
