"""A sampled step's boundary readings (``recording/device_probes.py``) become span attributes,
and every step gets its bound label; in the background, never on the training thread.

Device events sit on the stream in order, so the device time between a phase's start and end
events is the stream time the phase spanned: its kernels, plus any gap in which the stream
waited for the host to queue more (``train.device.busy_seconds``). The data phase queues no
compute: the stream reaches its start event when the previous step's work drains, and its end
event once the host has the batch, so the time between them is the device idling for input
(``train.device.idle_seconds``; a copy the loader itself queues counts there too). In
``run.steps`` the data phase opens with the step (its start is the step's start event) and the
next boundary closes it (the first phase of the body: the host time in between is counted).

The step's bound (``train.step.bound``), first rule that holds (``BOUND_*_SHARE`` below):

1. ``communication``: the root has ``train.comm.exposed_seconds`` >= 30% of the step;
2. ``input``: the data phase took >= 30% of the step on the host clock, and (with device
   events) the device idled for at least half of that wait;
3. ``compute``: the device was busy >= 50% of the step and ran behind the host: the phases'
   device and host times differ by >= 20% of the step in all (the host queued work faster
   than the device ran it, then waited for it). Without device readings (CPU, a step not
   sampled) the host clock can't tell the host's own work from the device's: ``compute``;
4. ``host``: otherwise: the device kept pace with the host (each phase's device time is its
   host time: the stream waited on Python, launches or synchronizations) or idled. A single
   phase around forward, backward and a ``.item()`` can't show the device running behind:
   give the step its phases.

A step between sampled ones has no device readings: rules 1 and 2 still apply, and in place
of 3/4 it takes the last sampled step's ``compute``/``host`` verdict.

Usage::

    extra, root, durations = device_readings(step, decode_events(step.ev))
    bound = step_bound(wall_seconds, data_seconds, data_idle, busy, comm_exposed)
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from time import perf_counter_ns
from typing import Any

from otel_train.common import attributes as A
from otel_train.records.span_rows import (
    P_DEVICE_SECONDS,
    P_DURATION,
    P_EXTRA,
    P_NAME,
    P_PARENT_ID,
)

_log = logging.getLogger("otel_train")

BOUND_COMM_SHARE = 0.3  # exposed communication / step wall
BOUND_INPUT_SHARE = 0.3  # data phase host time / step wall
BOUND_INPUT_IDLE_SHARE = 0.5  # device idle in the data phase / data phase host time
BOUND_COMPUTE_SHARE = 0.5  # device busy / step wall
BOUND_LAG_SHARE = 0.2  # sum over phases of |device - host| / step wall: the device ran behind
_DATA, _IDLE, _BUSY, _COMM, _BOUND = (A.PHASE_DATA, A.DEVICE_IDLE, A.DEVICE_BUSY,
                                      A.COMM_EXPOSED, A.STEP_BOUND)
_INPUT, _COMPUTE = A.BOUND_INPUT, A.BOUND_COMPUTE
_END = 1 << 62  # the step's end reading (-2) sorts after every boundary


def _key(pos: int) -> int:
    return _END if pos == -2 else pos


def device_readings(step: Any, phases: Sequence[Any]
                    ) -> tuple[dict[int, dict[str, Any]], dict[str, Any], dict[int, float]]:
    """(phase ordinal -> attributes, root attributes, phase ordinal -> device seconds).

    Nothing here waits for the device: the span worker builds a step once its last event
    has completed (``device_values.record_ready``), or, past a bound, without device time.
    """
    dev = step.dev or {}
    extra: dict[int, dict[str, Any]] = {}
    root: dict[str, Any] = {}
    seconds: dict[int, float] = {}
    keys = sorted(_key(p) for p in dev)
    events = {_key(p): r[0] for p, r in dev.items() if r[0] is not None}
    peaks = [(_key(p), r[1]) for p, r in dev.items() if r[1] is not None]
    try:
        if events:
            _resolve_events(step, phases, dev, keys, events, extra, root, seconds)
    except Exception as exc:  # a device error must not lose the host-timed spans
        _log.debug("device event timing unavailable: %r", exc)
    if peaks:
        for ph in phases:
            if not (ph.start_pos in dev or ph.start_pos == 0 or ph.end_pos in dev):
                continue  # a fetch timed without boundaries of its own (step.iter_data)
            end = ph.end_pos if ph.end_ns else _END
            inside = [p for k, p in peaks if ph.start_pos < k <= _end_key(keys, end)]
            if inside:
                attrs = extra.setdefault(ph.ordinal, {})
                attrs[A.MEMORY_PEAK_ALLOCATED] = max(p[0] for p in inside)
                attrs[A.MEMORY_PEAK_RESERVED] = max(p[1] for p in inside)
    return extra, root, seconds


def _end_key(keys: list[int], end_pos: int) -> int:
    """The boundary that closes a phase: its own, else the next one recorded after it."""
    for k in keys:
        if k >= end_pos:
            return k
    return end_pos


def _resolve_events(step: Any, phases: Sequence[Any], dev: dict[int, Any], keys: list[int],
                    events: dict[int, Any], extra: dict[int, dict[str, Any]],
                    root: dict[str, Any], seconds: dict[int, float]) -> None:
    last = events[max(events)]
    if not last.query():
        # Never a wait here: the span worker holds a step back until its events have
        # completed (device_values.record_ready), up to a bound; past it, no device time.
        _log.debug("device events of step %s not complete when built: left out", step.index)
        return
    first = events.get(-1)
    if first is not None and _END in events:
        root[A.DEVICE_DURATION] = first.elapsed_time(events[_END]) / 1000.0
    busy_total = 0.0
    busy_known = False
    for ph in phases:
        start = events.get(ph.start_pos)
        if start is None and ph.start_pos == 0:
            start = first  # run.steps: the data phase opens with the step
        end = events.get(_end_key(keys, ph.end_pos if ph.end_ns else _END))
        if start is None or end is None:
            continue
        elapsed = max(0.0, start.elapsed_time(end) / 1000.0)
        seconds[ph.ordinal] = elapsed
        attrs = extra.setdefault(ph.ordinal, {})
        if ph.phase.name == A.PHASE_DATA and ph.parent < 0:
            attrs[A.DEVICE_IDLE] = elapsed
        else:
            attrs[A.DEVICE_BUSY] = elapsed
            if ph.parent < 0:
                busy_total += elapsed
                busy_known = True
    if busy_known:
        root[A.DEVICE_BUSY] = busy_total
        wall = (step.end_ns - step.start_ns) / 1e9
        root[A.DEVICE_IDLE] = max(0.0, wall - busy_total)


def step_bound(wall_seconds: float, data_seconds: float, data_idle_seconds: float | None,
               busy_seconds: float | None, comm_exposed_seconds: float | None,
               lag_seconds: float = 0.0) -> str:
    """The step's bound by the module's rule (``input`` | ``compute`` | ``communication`` |
    ``host``)."""
    if wall_seconds <= 0:
        return A.BOUND_COMPUTE
    if comm_exposed_seconds is not None and (
            comm_exposed_seconds >= BOUND_COMM_SHARE * wall_seconds):
        return A.BOUND_COMM
    if data_seconds >= BOUND_INPUT_SHARE * wall_seconds and (
            data_idle_seconds is None
            or data_idle_seconds >= BOUND_INPUT_IDLE_SHARE * data_seconds):
        return A.BOUND_INPUT
    if busy_seconds is None:
        return A.BOUND_COMPUTE
    if (busy_seconds >= BOUND_COMPUTE_SHARE * wall_seconds
            and lag_seconds >= BOUND_LAG_SHARE * wall_seconds):
        return A.BOUND_COMPUTE
    return A.BOUND_HOST


def label_step(root_attrs: dict[str, Any], phases: Sequence[tuple[Any, ...]],
               wall_ns: int, root_id: int, step_attrs: dict[str, Any] | None = None,
               last_device_bound: str | None = None) -> str | None:
    """Set ``train.step.bound`` on a step's root attributes from its record phases (and the
    exposed communication time on the root or the step's own attributes, if any).

    A step without device readings between sampled ones takes ``last_device_bound`` (the
    last sampled step's ``compute`` or ``host``) where the host clock alone would say
    ``compute``. Returns this step's device-based ``compute``/``host`` verdict, else None.
    """
    data_ns = 0
    data_idle = None
    lag = 0.0
    for ph in phases:  # record phases: name, kind, loader, duration_ns, ordinal+1, parent
        if ph[P_PARENT_ID] != root_id:
            continue
        if ph[P_NAME] == _DATA:
            data_ns += ph[P_DURATION]
            extra = ph[P_EXTRA]
            if extra and _IDLE in extra:
                data_idle = (data_idle or 0.0) + extra[_IDLE]
        elif ph[P_DEVICE_SECONDS] is not None:  # how far the device ran behind the host
            lag += abs(ph[P_DEVICE_SECONDS] - ph[P_DURATION] / 1e9)
    comm = root_attrs.get(_COMM)
    if comm is None and step_attrs:
        comm = step_attrs.get(_COMM)
    if comm is not None and not isinstance(comm, (int, float)):
        try:
            comm = float(comm)  # a 0-d tensor, read here in the background
        except (TypeError, ValueError):
            comm = None
    busy = root_attrs.get(_BUSY)
    if comm is None and busy is None:  # the host clock alone (CPU, unsampled): input/compute
        root_attrs[_BOUND] = (_INPUT if data_ns >= BOUND_INPUT_SHARE * wall_ns > 0
                              else last_device_bound or _COMPUTE)
        return None
    bound = step_bound(wall_ns / 1e9, data_ns / 1e9, data_idle, busy, comm, lag)
    if busy is None and bound == _COMPUTE and last_device_bound is not None:
        bound = last_device_bound
    root_attrs[_BOUND] = bound
    if busy is not None:
        # What the device readings alone say, for the steps until the next sampled one.
        return step_bound(wall_ns / 1e9, 0.0, None, busy, None, lag)
    return None


def device_verdict(root_attrs: dict[str, Any], phases: Sequence[tuple[Any, ...]],
                   wall_ns: int, root_id: int) -> str | None:
    """What a built step record's device readings alone say (``compute``/``host``), the
    verdict :func:`label_step` returned when the record was built; None without readings.

    A builder that did not build the record (the exporter process's, reading the step ring,
    for a step the training process built) takes it over from here, so the steps after it
    carry the verdict the training process's builder would have carried."""
    busy = root_attrs.get(_BUSY)
    if not isinstance(busy, (int, float)) or isinstance(busy, bool):
        return None
    lag = 0.0
    for ph in phases:
        if (ph[P_PARENT_ID] == root_id and ph[P_NAME] != _DATA
                and ph[P_DEVICE_SECONDS] is not None):
            lag += abs(ph[P_DEVICE_SECONDS] - ph[P_DURATION] / 1e9)
    return step_bound(wall_ns / 1e9, 0.0, None, busy, None, lag)


# Steps whose records are built within this long share one RSS reading: each read is a
# syscall that lets go of the GIL, which the training thread then waits to take back.
HOST_RSS_REUSE_NS = 250_000_000


class HostRss:
    """This process's resident set size from ``/proc/self/statm`` (one ``pread``, ~2 us),
    read at most every 0.25 s (``HOST_RSS_REUSE_NS``); another's with ``pid`` (the exporter
    process reads the training process's)."""

    def __init__(self, pid: int | None = None) -> None:
        self._path = "/proc/self/statm" if pid is None else f"/proc/{int(pid)}/statm"
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._fd: int | None = None
        self._tried = False
        self._last: int | None = None
        self._read_ns = 0

    def read_bytes(self) -> int | None:
        """Resident bytes now (the reading of the last 0.25 s), or None where ``/proc`` has
        no statm."""
        now = perf_counter_ns()
        if self._read_ns and now - self._read_ns < HOST_RSS_REUSE_NS:
            return self._last
        self._read_ns = now
        self._last = self._read()
        return self._last

    def _read(self) -> int | None:
        if self._fd is None:
            if self._tried:
                return None
            self._tried = True  # opened on first use, kept open: each read is one pread
            try:
                self._fd = os.open(self._path, os.O_RDONLY)
            except OSError:  # not Linux: no RSS
                return None
        try:
            return int(os.pread(self._fd, 128, 0).split()[1]) * self._page
        except (OSError, ValueError, IndexError):
            return None
