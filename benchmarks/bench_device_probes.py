"""Host-side cost per step of the device probes: timing events and allocator peaks at phase
boundaries (``otel_train/recording/device_probes.py``), on the fake accelerator of the tests,
and what the background adds per step to resolve them (and to label every step).

Each variant runs 7-span steps (``run.steps`` + 5 phases, a bare Recorder, no run) on the
training thread; ``time.thread_time_ns`` around a chunk of steps, the median chunk per step,
against the plain recorder (host clock only). The fake's event and allocator calls are pure
Python (a lock and a clock read per event; a small dict per allocator read): on CUDA,
``cudaEventRecord`` through ``torch.Event`` and ``torch._C._accelerator_getDeviceStats`` are
C++ calls of a few microseconds each, so the per-call costs printed for the fake stand in for
them only roughly; the number of calls per step is exact. The background part times
``StepRecordBuilder.record`` on the same steps.

Usage::

    python benchmarks/bench_device_probes.py [--steps 2000] [--chunks 15]
    python benchmarks/bench_device_probes.py --smoke   # a few hundred steps: proves it runs
"""

from __future__ import annotations

import argparse
import statistics
import sys
import timeit
from pathlib import Path
from time import thread_time_ns
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from fake_accelerator import FakeAccelerator, FakeAllocator  # noqa: E402

from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.util.instrumentation import InstrumentationScope  # noqa: E402

from otel_train.common.drop_counter import DropCounter  # noqa: E402
from otel_train.common.identity import RunIdentity  # noqa: E402
from otel_train.recording.device import resolve_device_timing  # noqa: E402
from otel_train.recording.device_probes import resolve_device_probes  # noqa: E402
from otel_train.recording.recorder import HOT_PATH, Recorder  # noqa: E402
from otel_train.records.device_readings import HostRss  # noqa: E402
from otel_train.records.step_records import StepRecordBuilder, epoch_offset_ns  # noqa: E402

PHASES = ("forward", "backward", "clip", "optimizer", "zero_grad")


def _recorder(events: bool, memory: bool, every: int) -> Recorder:
    dev = FakeAccelerator()
    timing = resolve_device_timing("events" if events else "off", accelerator=dev,
                                   event_class=dev.Event)
    probes = resolve_device_probes(timing.make_event, "cuda", every,
                                   "on" if memory else "off",
                                   memory=FakeAllocator().peaks() if memory else None)
    return Recorder(10 ** 6, DropCounter(), None, probes)


def _chunk(rec: Recorder, steps: int) -> float:
    """ns per step on the training thread for one chunk of 7-span steps."""
    t0 = thread_time_ns()
    for step in rec.steps(range(steps), None):
        for name in PHASES:
            with step.phase(name):
                pass
    return (thread_time_ns() - t0) / steps


def _builder() -> StepRecordBuilder:
    ident = RunIdentity("bench", rank=0, world_size=1, local_rank=0, run_id_source="option")
    return StepRecordBuilder(ident, Resource.create({}), InstrumentationScope("b", "0"), False,
                             "cuda", lambda t: True, epoch_offset_ns())


def _measure(variant: dict[str, Any], steps: int, chunks: int) -> tuple[float, float]:
    """(hot path ns per step, background ns per step) medians."""
    hot, bg = [], []
    builder = _builder()
    for _ in range(chunks):
        rec = _recorder(variant["events"], variant["memory"], variant["every"])
        rec.next_index = 1  # step 0 would be sampled at any interval
        hot.append(_chunk(rec, steps))
        records = list(rec.queue)
        t0 = thread_time_ns()
        for s in records:
            builder.record(s)
        bg.append((thread_time_ns() - t0) / len(records))
    return statistics.median(hot), statistics.median(bg)


VARIANTS = {
    "plain (host clock)": {"events": False, "memory": False, "every": 1},
    "events, every step": {"events": True, "memory": False, "every": 1},
    "events, 1 in 10": {"events": True, "memory": False, "every": 10},
    "events on, unsampled steps": {"events": True, "memory": False, "every": 10 ** 9},
    "peaks, every step": {"events": False, "memory": True, "every": 1},
    "events + peaks, every step": {"events": True, "memory": True, "every": 1},
    "events + peaks, 1 in 10": {"events": True, "memory": True, "every": 10},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=2000, help="steps per chunk")
    ap.add_argument("--chunks", type=int, default=15)
    ap.add_argument("--smoke", action="store_true", help="300 steps x 3 chunks")
    args = ap.parse_args()
    steps, chunks = (300, 3) if args.smoke else (args.steps, args.chunks)
    print(f"hot path: {HOT_PATH}; 7-span steps, {chunks} chunks of {steps} steps")
    base = None
    for name, variant in VARIANTS.items():
        hot, bg = _measure(variant, steps, chunks)
        base = hot if base is None else base
        print(f"  {name:28s} training thread {hot / 1000:7.2f} us/step "
              f"(+{(hot - base) / 1000:6.2f} us)   background {bg / 1000:7.2f} us/step")
    dev = FakeAccelerator()
    timing = resolve_device_timing("events", accelerator=dev, event_class=dev.Event)
    peaks = FakeAllocator().peaks()
    rss = HostRss()
    n = 20000 if not args.smoke else 2000
    for label, fn in (("fake event create + record", timing.make_event),
                      ("fake allocator read + reset", peaks.read_and_reset),
                      ("host RSS (/proc/self/statm pread)", rss.read_bytes)):
        ns = min(timeit.repeat(fn, number=n, repeat=3)) / n * 1e9
        print(f"  one {label:34s} {ns:8.0f} ns")


if __name__ == "__main__":
    main()
