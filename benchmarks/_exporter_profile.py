"""Stage-by-stage CPU of the exporter process, for benchmarks/bench_processors.py.

Two uses, both printing "stage -> µs per step":

- ``timed_on_views``: ``SharedStepSpanProcessor.on_views`` with each processor group's
  CPU over the frame (``time.thread_time_ns`` once per group and frame, not per view: a
  CPU-clock read costs about as much as a small processor's step);
- ``install``: run in a live exporter process before ``child_main`` (bench_processors.py
  ``--live`` puts it in the child's boot line). It wraps the child's per-frame stages (the
  frame read, ``marshal.loads``, the derived chain group by group, the tail sampler, the
  records queued for export, the count and state reports) with the same clock, reads every
  thread's CPU from ``/proc/self/task/<tid>/schedstat`` (the export and watch threads
  whole), and writes the figures as JSON to ``$OTEL_TRAIN_EXPORTER_PROFILE`` when the
  process is told to stop. The wrappers cost a few clock reads per frame (256 steps), not per
  step.
"""

from __future__ import annotations

import gc
import json
import os
import threading
from collections import defaultdict
from time import thread_time_ns
from typing import Any


def group_label(group: list[tuple[Any, ...]]) -> str:
    """A processor group's name: its processors' class names, shortened."""
    return " + ".join(type(member[0]).__name__.replace("SpanProcessor", "")
                      for member in group)


def timed_on_views(shared: Any, views: Any, acc: dict[str, int]) -> None:
    """``shared.on_views(views)``, each group's thread CPU added to ``acc[label]``; the
    groups of consecutive ``view_by_view`` processors (split after their last reader)
    under one label, "Overhead + Budget + Throughput" with the console off."""
    labels = _joined_labels(shared._groups)
    with shared.lock:
        shared._assembler.views += len(views)
        steps_only = all(view.is_step for view in views)
        for group, label in zip(shared._groups, labels):
            t0 = thread_time_ns()
            shared.feed_group(group, views, steps_only)
            acc[label] += thread_time_ns() - t0


def _joined_labels(groups: list[list[tuple[Any, ...]]]) -> list[str]:
    """Each group's label: its processors' names, a run of view-by-view groups joined."""
    runs: list[list[int]] = []
    for i, group in enumerate(groups):
        by_view = all(member[0].view_by_view for member in group)
        if by_view and runs and all(m[0].view_by_view for m in groups[runs[-1][-1]]):
            runs[-1].append(i)
        else:
            runs.append([i])
    labels = [""] * len(groups)
    for run in runs:
        label = "chain: " + " + ".join(group_label(groups[i]) for i in run)
        for i in run:
            labels[i] = label
    return labels


def _task_cpu_ns() -> dict[int, int]:
    """On-CPU ns of each thread of this process, by native thread id."""
    out = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/schedstat") as f:
                out[int(task)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


def install() -> None:
    """Wrap the exporter process's stages (call before ``child_main``)."""
    from otel_train.export.process import child as child_mod
    from otel_train.export.process import pipe as pipe_mod

    acc: dict[str, int] = defaultdict(int)
    counts: dict[str, int] = defaultdict(int)
    start: dict[str, Any] = {}
    lock = threading.Lock()

    def add(label: str, ns: int, n: int = 1) -> None:
        with lock:
            acc[label] += ns
            counts[label] += n

    def timed(label: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                add(label, thread_time_ns() - t0)
        return wrapper

    # The garbage collector's passes, by generation, on whichever thread they ran.
    gc_start: dict[int, int] = {}

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_start[threading.get_ident()] = thread_time_ns()
        else:
            t0 = gc_start.pop(threading.get_ident(), None)
            if t0 is not None:
                add(f"gc: generation {info['generation']} (inside the stages above)",
                    thread_time_ns() - t0)
    gc.callbacks.append(on_gc)

    real_read_one = pipe_mod.FrameReader.read_one
    pipe_mod.FrameReader.read_one = timed("main: frame read (pipe)", real_read_one)

    class _Marshal:
        loads = staticmethod(timed("main: marshal.loads of a frame", child_mod.marshal.loads))
        dumps = staticmethod(timed("reports: marshal.dumps", child_mod.marshal.dumps))
    child_mod.marshal = _Marshal  # type: ignore[assignment]

    from otel_train.export.otlp import transport
    base, http = transport._SingleAttemptBase, transport.SingleAttemptHttpSpanExporter
    base.encode = timed("export: request joined (encode)", base.encode)  # type: ignore[method-assign]
    http._post = timed("send: HTTP POST (_post)", http._post)  # type: ignore[attr-defined]

    Child = child_mod._Child
    real_derive, real_spans, real_stop = Child.derive, Child.spans, Child.stop
    steps = [0]

    def derive(self: Any, settings: Any) -> None:
        from otel_train.records.span_rows import views_from_records

        real_derive(self, settings)

        def feed(shared: Any, recs: Any, rank: Any) -> None:
            """chain.feed_records, the views' making and each group timed apart."""
            t0 = thread_time_ns()
            views = views_from_records(recs, rank, lambda exc: None)  # skipped, as there
            add("chain: views from records", thread_time_ns() - t0)
            if views:
                part: dict[str, int] = defaultdict(int)
                timed_on_views(shared, views, part)
                for label, ns in part.items():
                    add(label, ns)
        self._feed_records = feed
        if self.sampler is not None:
            self.sampler.filter_frame = timed("main: tail sampler (filter_frame)",
                                              self.sampler.filter_frame)
        self.chain.export_state = timed("reports: of which chain.export_state",
                                        self.chain.export_state)

    def spans(self: Any, recs: Any, rows: Any, *args: Any, **kwargs: Any) -> Any:
        if not start:  # the threads' clocks from the first frame on (start-up apart)
            start["tasks"] = _task_cpu_ns()
            self.export.on_records = timed("main: records queued for export (on_records)",
                                           self.export.on_records)
        steps[0] += len(recs)
        return real_spans(self, recs, rows, *args, **kwargs)

    def stop(self: Any, timeout_seconds: float) -> None:
        if not self._done.is_set() and start:
            end = _task_cpu_ns()
            names = {t.native_id: t.name for t in threading.enumerate()}
            threads = {}
            for tid, ns in end.items():
                name = names.get(tid, f"thread {tid}")
                if tid == os.getpid():
                    name = "main"
                threads[name] = threads.get(name, 0) + ns - start["tasks"].get(tid, 0)
            path = os.environ.get("OTEL_TRAIN_EXPORTER_PROFILE")
            if path:
                with lock:
                    data = {"steps": steps[0], "stages": dict(acc), "calls": dict(counts),
                            "threads": threads, "ring_reader": ring_reader}
                with open(path, "w") as f:
                    json.dump(data, f)
        real_stop(self, timeout_seconds)

    # The step ring (step_ring="on"): its records read and decoded, and the steps' span
    # records built (a run of steps between markers at a time).
    from otel_train.export.process import ring_feed
    from otel_train.recording import step_ring_reader

    if os.environ.get("OTEL_TRAIN_PROFILE_PYTHON_RING"):  # the Python reader and builder
        from otel_train.records import step_records

        step_ring_reader._C_READ_ITEMS = None
        step_records._flat_record = step_records._flat_records = None
    ring_reader = "C" if step_ring_reader._C_READ_ITEMS is not None else "Python"
    reader_cls = step_ring_reader.StepRingReader
    reader_cls.read_items = timed("ring: read and decode (read_items)",  # type: ignore[method-assign]
                                  reader_cls.read_items)
    feed_cls = ring_feed.ChildRingFeed
    feed_cls._build_run = timed("ring: build the steps' records (_build_run)",  # type: ignore[method-assign]
                                feed_cls._build_run)

    Child.derive, Child.spans, Child.stop = derive, spans, stop  # type: ignore[method-assign]
    Child.stats = timed("reports: counts (stats)", Child.stats)  # type: ignore[method-assign]
    Child.send_state = timed("reports: chain state (send_state)",  # type: ignore[method-assign]
                             Child.send_state)
