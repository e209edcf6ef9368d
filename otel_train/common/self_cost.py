"""otel-train's own cost to a run: what the training thread loses, per step, and the CPU beside it.

The figures (``SelfCostMeter.figures``, under ``own_cost`` in ``run.costs()`` and
monitoring_costs.json; docs/monitoring-costs.md explains each):

- ``hot_path_us_per_step``: the step and phase context managers on the training thread,
  estimated as recorded spans x a cost per span calibrated at start-up (timing the hot path
  on the hot path would double it): the cold figure for a step long enough to have evicted
  the hot path from the core's caches (``COLD_STEP_NS_PER_SPAN`` of step time per span), the
  warm one otherwise (recording/hot_path_cost.py). Drains the training thread runs itself
  when it asks for them (``run.costs()``, ``run.flush()``) are measured and reported apart
  (``training_thread_drains_seconds``): they come when the user calls, not with each step;
- ``wait_us_per_step``: the training thread's measured wait caused by otel-train's threads,
  from its ``/proc/self/task/<tid>/schedstat`` sampled by the span worker around each drain
  and (every 0.25 s) between drains: over each interval, time the training thread was
  neither on a CPU nor runnable (on CPython: waiting for the GIL) up to the CPU
  otel-train's background thread spent in
  it (``gil``), and time it was runnable but waiting for a CPU up to what the exporter
  process (and the rest of the background thread's CPU) ran in it (``run_queue``). ``None``
  with ``wait_unavailable`` saying why where schedstat is missing (not Linux);
- ``shared_interpreter_us_per_step``: the training thread's extra *on-CPU* time per step for
  sharing its interpreter with the span worker: the worker's CPU while the loop trains x
  ``SHARED_INTERPRETER_FACTOR`` (a measured factor; the wait for the GIL is the ``gil`` above);
- ``cpu_interference_us_per_step``: the training thread's extra *on-CPU* time per step while
  the exporter process runs beside it (shared core, caches, memory bandwidth), estimated in
  the run by regressing its CPU per step on the exporter's busy share, interval by interval
  (cpu_interference.py); ``cpu_interference_us_per_busy_step`` is that line's slope;
- ``share_of_step_time``: (hot path + wait + shared interpreter + interference) / the loop's
  wall time (first step's start to the last step's end), 0..1: the share of its time the
  training loop loses, the figure an A/B of the same loop with and without otel-train
  measures (1 - bare / instrumented);
- ``background_cpu_us_per_step`` (this process's otel-train threads) and
  ``exporter_process_cpu_us_per_step`` (start-up left out): CPU that runs beside training;
- ``device_work`` (on an accelerator; None on CPU): the device work otel-train adds on the
  training thread, timed where it happens (``device_work.py``): the synchronize waits at
  training boundaries (``device_sync="sync"``: an upper bound on the overlap lost), event
  records, allocator reads and tensor copies are in ``lost_us_per_step`` and the share; the
  waits at monitoring boundaries (``monitor_sync``) are reported apart, and what the figures
  leave out is said in ``left_out``;
- ``startup``: start_run's own time, the time until the first step, the exporter process's
  start-up CPU: reported apart, never averaged into the steps.

Usage::

    cost = calibrate_hot_path()
    meter = SelfCostMeter(cost.warm_ns_per_span, started_ns=perf_counter_ns(),
                          cold_ns_per_span=cost.cold_ns_per_span)
    meter.note_ready()                                 # start_run returned
    meter.note_steps(steps, first_start_ns, last_end_ns)   # the span worker, per drain
    meter.sample(background_ns, exporter_cpu_ns, loop_active)   # the span worker, per sample
    meter.figures(exporter_cpu_seconds=1.2, exporter_startup_cpu_seconds=0.4)
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
from collections import deque
from time import perf_counter_ns
from typing import Any

from otel_train.common.cpu_interference import CpuInterferenceRegression
from otel_train.common.device_work import DeviceWorkClock
from otel_train.common.proc_files import ProcFileReader

_MARKS = 64  # drains remembered for the recent window
_MIN_STEP_NS = 2_000
#: The interference line is fitted on intervals of at least this many steps, at a pace of at
#: least half the usual one: the usual pace is the median over the last ``_RATES`` such
#: intervals, and nothing is fitted before ``_MIN_RATES`` of them (the run's first seconds,
#: warming up, would set a slow pace as the usual one and fit their slow steps).
_MIN_FIT_STEPS = 4
_RATES = 64
_MIN_RATES = 8
#: Training-thread CPU lost per unit of the span worker's CPU while the loop trains: two
#: threads of one CPython process hand the GIL and the interpreter's objects back and forth,
#: and the training thread computes slower after each hand-over. The factor is the loop's:
#: extra span-worker Python cost a loop of short calls (~1.7 ms MLP steps) 0.87 us of
#: training CPU per us, on a 2-vCPU VM and on a 16-core host alike, and a loop of long
#: kernels run without the GIL (~14 ms GPT steps) the GIL wait and little more
#: (docs/benchmarks.md); 1.0 sits between the two.
SHARED_INTERPRETER_FACTOR = 1.0
#: A step with at least this much of its own time per recorded span has evicted the hot path
#: from the core's caches between two calls (2 MiB of work takes ~50-100 us to touch): its
#: spans are charged at the cold cost per span.
COLD_STEP_NS_PER_SPAN = 50_000


def is_cold_step(step_wall_ns: int, spans: int) -> bool:
    """A step that took ``step_wall_ns`` for ``spans`` spans is charged the cold cost."""
    return spans > 0 and step_wall_ns >= spans * COLD_STEP_NS_PER_SPAN


class TrainingThreadSchedstat:
    """The training thread's scheduler clock: ns on a CPU and ns runnable, waiting for one."""

    def __init__(self, native_tid: int) -> None:
        self.path = f"/proc/self/task/{native_tid}/schedstat"
        self.unavailable: str | None = None
        if not sys.platform.startswith("linux"):
            self.unavailable = f"no per-thread schedstat on {sys.platform}"
        elif not os.path.exists(self.path):
            self.unavailable = f"{self.path} is missing (kernel without schedstats)"
        # Read at each own-cost sample of the span worker: one pread, not an open/read/close
        # (proc_files.py).
        self._file = ProcFileReader(self.path, 128)

    def read(self) -> tuple[int, int] | None:
        """(on-CPU ns, run-queue wait ns) so far, or None where it cannot be read."""
        if self.unavailable is not None:
            return None
        data = self._file.read()
        if data is None:  # the thread has exited
            return None
        try:
            on, wait = data.split()[:2]
            return int(on), int(wait)
        except ValueError:
            return None


class SelfCostMeter:
    """otel-train's own cost so far, in nanoseconds, monotonically increasing.

    Background threads add their measured thread CPU time; the hot path is accounted as
    ``spans x calibrated cost per span``; the span worker samples the training thread's wait.
    """

    def __init__(self, hot_path_ns_per_span: float = 0.0, started_ns: int | None = None,
                 training_tid: int | None = None, window_steps: int = 100,
                 cold_ns_per_span: float | None = None,
                 device_work: DeviceWorkClock | None = None,
                 batch_counter: Any = None) -> None:
        self.hot_path_ns_per_span = hot_path_ns_per_span
        self.cold_ns_per_span = (hot_path_ns_per_span if cold_ns_per_span is None
                                 else max(hot_path_ns_per_span, cold_ns_per_span))
        self.window_steps = window_steps
        # The thread that started the run trains (run.steps is driven from it).
        self.training_tid = training_tid or threading.get_native_id()
        self.schedstat = TrainingThreadSchedstat(self.training_tid)
        self._lock = threading.Lock()
        self._background_ns = 0
        self._hot_path_ns = 0.0
        self._on_training_thread_ns = 0  # drains the training thread ran itself
        self._gil_wait_ns = 0
        self._runq_wait_ns = 0
        self._worker_beside_ns = 0  # the span worker's CPU while the loop trained
        self.started_ns = perf_counter_ns() if started_ns is None else started_ns
        self.ready_ns: int | None = None
        self.steps = 0
        self.first_step_ns: int | None = None
        self.last_step_end_ns = 0
        self._prev: tuple[int, tuple[int, int] | None, int | None, int | None] | None = None
        # (steps drained, last step end ns, hot path + waits ns, interference's busy steps)
        self._marks: deque[tuple[int, int, float, float]] = deque(maxlen=_MARKS)
        self.interference = CpuInterferenceRegression()
        self._rates: deque[float] = deque(maxlen=_RATES)  # steps per ns, recent intervals
        self._training_thread_drained = False  # in the interval being sampled
        # The device work otel-train adds on the training thread (syncs, events, allocator
        # reads, tensor copies), timed where it happens; None on CPU (device_work.py).
        self.device_work = device_work
        # The batch counter (recording/step_counts.py), when the run counts tokens and
        # samples from each batch: its ``spent_ns``, timed on the training thread.
        self.batch_counter = batch_counter

    # -- feeding ------------------------------------------------------------------------
    def add_background_ns(self, ns: int) -> None:
        """Add CPU time a background thread spent on telemetry."""
        with self._lock:
            self._background_ns += ns

    def add_hot_path_spans(self, spans: int, cold_spans: int = 0) -> None:
        """Account the estimated hot-path cost of ``spans`` recorded spans at the warm cost
        and ``cold_spans`` at the cold one."""
        with self._lock:
            self._hot_path_ns += (spans * self.hot_path_ns_per_span
                                  + cold_spans * self.cold_ns_per_span)

    def add_training_thread_ns(self, ns: int) -> None:
        """Add otel-train work the training thread did itself (a drain in ``run.costs()``)."""
        with self._lock:
            self._on_training_thread_ns += ns
            self._training_thread_drained = True

    def on_training_thread(self) -> bool:
        """The calling thread is the training thread."""
        return threading.get_native_id() == self.training_tid

    def note_ready(self) -> None:
        """start_run has returned: what came before is start-up."""
        self.ready_ns = perf_counter_ns()

    def note_steps(self, steps: int, first_start_ns: int | None, last_end_ns: int) -> None:
        """``steps`` more steps were drained; the first one's start and the latest end."""
        with self._lock:
            if self.first_step_ns is None and first_start_ns is not None:
                self.first_step_ns = first_start_ns
            self.steps += steps
            self.last_step_end_ns = max(self.last_step_end_ns, last_end_ns)
            if steps:
                self._marks.append((self.steps, self.last_step_end_ns, self._accounted_locked(),
                                    self.interference.busy_steps))

    def sample(self, background_ns: int, exporter_cpu_ns: int | None, loop_active: bool,
               steps_begun: int | None = None) -> None:
        """One interval of the span worker: its CPU (``background_ns``), the exporter
        process's CPU so far, whether training ran in it and the steps begun so far;
        attributes the training thread's wait in the interval to otel-train's threads,
        bounded by their CPU, and adds the interval to the on-CPU interference regression."""
        now = perf_counter_ns()
        stat = self.schedstat.read()
        with self._lock:
            self._background_ns += background_ns
            prev, self._prev = self._prev, (now, stat, exporter_cpu_ns, steps_begun)
            drained, self._training_thread_drained = self._training_thread_drained, False
            if prev is None or stat is None or prev[1] is None or not loop_active:
                return
            wall = now - prev[0]
            on_cpu = stat[0] - prev[1][0]
            runq = stat[1] - prev[1][1]
            blocked = max(0, wall - on_cpu - runq)
            gil = min(blocked, background_ns)
            exporter = 0
            if exporter_cpu_ns is not None and prev[2] is not None:
                exporter = max(0, exporter_cpu_ns - prev[2])
            self._gil_wait_ns += gil
            self._runq_wait_ns += min(max(0, runq), exporter + background_ns - gil)
            self._worker_beside_ns += background_ns
            begun = None if steps_begun is None or prev[3] is None else steps_begun - prev[3]
            # A jump of the index (a resumed run's first explicit index) is not steps run:
            # no instrumented step takes under 2 us.
            if begun is not None and 0 < begun and begun * _MIN_STEP_NS <= wall:
                # The span worker's own share is charged above (SHARED_INTERPRETER_FACTOR):
                # the line takes the exporter process's.
                self.interference.add(exporter / wall, on_cpu / begun, begun,
                                      fit=self._fits_locked(begun / wall, begun, drained))

    def _fits_locked(self, rate: float, begun: int, drained: bool) -> bool:
        """An interval is a point of the interference line when it trained at the run's usual
        pace; slower ones (warming up, an evaluation, work between steps on this thread, a
        drain the training thread ran itself) are charged only (cpu_interference.py)."""
        if begun < _MIN_FIT_STEPS:  # one evaluation or slow step would be the whole figure
            return False
        rates = self._rates
        usual = statistics.median(rates) if len(rates) >= _MIN_RATES else None
        rates.append(rate)
        return usual is not None and not drained and rate >= 0.5 * usual

    # -- reading ------------------------------------------------------------------------
    def _accounted_locked(self) -> float:
        work = self.device_work
        return (self._hot_path_ns + self._gil_wait_ns + self._runq_wait_ns
                + SHARED_INTERPRETER_FACTOR * self._worker_beside_ns
                + (work.charged_ns if work is not None else 0) + self._counting_ns())

    def _counting_ns(self) -> int:
        """The training thread's time counting batches so far (0 without a counter)."""
        counter = self.batch_counter
        return counter.spent_ns if counter is not None else 0

    def _lost_locked(self) -> float:
        return self._accounted_locked() + self.interference.charge_ns()

    @property
    def total_ns(self) -> int:
        """Background plus estimated hot-path CPU time so far (batch counting included)."""
        with self._lock:
            return int(self._background_ns + self._hot_path_ns + self._counting_ns())

    def lost_parts(self) -> tuple[float, float]:
        """(hot path + waits ns, interference's busy steps) so far: a caller that compares
        two moments charges the busy steps between them at the final slope."""
        with self._lock:
            return self._accounted_locked(), self.interference.busy_steps

    def recent_share(self) -> float | None:
        """Share of the loop's wall time lost over the last ``window_steps`` steps (at least
        one drain), None before any step was drained."""
        with self._lock:
            marks = self._marks
            if not marks:
                return None
            steps, end, waits, busy = marks[-1]
            base: tuple[int, int, float, float] | None = None
            for mark in reversed(marks):
                if steps - mark[0] >= self.window_steps:
                    base = mark
                    break
            if base is None:  # fewer steps than the window: the whole loop so far
                if self.first_step_ns is None:
                    return None
                base = (0, self.first_step_ns, 0.0, 0.0)
            wall = end - base[1]
            lost = waits - base[2] + self.interference.charge_ns(busy - base[3])
            return min(1.0, max(0.0, lost / wall)) if wall > 0 else None

    def figures(self, exporter_cpu_seconds: float | None = None,
                exporter_startup_cpu_seconds: float | None = None) -> dict[str, Any]:
        """The own-cost figures as plain data (the costs file's ``own_cost``)."""
        with self._lock:
            steps = self.steps
            lost = self._lost_locked()
            wall = (self.last_step_end_ns - self.first_step_ns
                    if self.first_step_ns is not None else 0)
            hot, own = self._hot_path_ns, self._on_training_thread_ns
            counting = self._counting_ns()
            gil, runq, background = self._gil_wait_ns, self._runq_wait_ns, self._background_ns
            interference = self.interference.charge_ns()
            slope = self.interference.slope_ns()
            shared = SHARED_INTERPRETER_FACTOR * self._worker_beside_ns
        unavailable = self.schedstat.unavailable

        def per_step(ns: float | None) -> float | None:
            return None if ns is None or not steps else round(ns / steps / 1e3, 3)

        exporter_steady = None
        if exporter_cpu_seconds is not None:
            exporter_steady = max(0.0, exporter_cpu_seconds - (exporter_startup_cpu_seconds
                                                               or 0.0)) * 1e9
        waits = None if unavailable else gil + runq
        return {
            "steps": steps,
            "step_wall_us": per_step(wall) if wall > 0 else None,
            "share_of_step_time": (min(1.0, lost / wall) if wall > 0 and steps else None),
            "recent_share_of_step_time": self.recent_share(),
            "lost_us_per_step": per_step(lost),
            "hot_path_us_per_step": per_step(hot),
            "hot_path_ns_per_span": {"warm": round(self.hot_path_ns_per_span, 1),
                                     "cold": round(self.cold_ns_per_span, 1)},
            "batch_counting_us_per_step": (per_step(counting) if self.batch_counter is not None
                                           else None),
            "wait_us_per_step": per_step(waits),
            "wait_gil_us_per_step": None if unavailable else per_step(gil),
            "wait_run_queue_us_per_step": None if unavailable else per_step(runq),
            "wait_unavailable": unavailable,
            "shared_interpreter_us_per_step": None if unavailable else per_step(shared),
            "cpu_interference_us_per_step": None if unavailable else per_step(interference),
            "cpu_interference_us_per_busy_step": (None if slope is None
                                                  else round(slope / 1e3, 3)),
            "background_cpu_us_per_step": per_step(background),
            "exporter_process_cpu_us_per_step": per_step(exporter_steady),
            "training_thread_drains_seconds": round(own / 1e9, 6),
            "startup": self._startup(exporter_startup_cpu_seconds),
            # On an accelerator: what of the device work is in lost_us_per_step, what is not.
            "device_work": (self.device_work.figures(steps)
                            if self.device_work is not None else None),
        }

    def _startup(self, exporter_startup_cpu_seconds: float | None) -> dict[str, Any]:
        """Start-up, apart: start_run's own time, until the first step, the exporter's CPU."""
        def secs(end: int | None) -> float | None:
            return None if end is None else round(max(0, end - self.started_ns) / 1e9, 6)

        return {"start_run_seconds": secs(self.ready_ns),
                "until_first_step_seconds": secs(self.first_step_ns),
                "exporter_process_cpu_seconds": exporter_startup_cpu_seconds}
