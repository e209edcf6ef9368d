"""Finished spans, assembled into one view per training step (grouped by trace).

Every derived-metrics processor needs the same thing: a step's root span with its phases,
and which monitoring time to count. ``StepAssembler`` groups the spans of a trace until its
root ``train.step`` arrives (children end before their parents, so they come first), then
hands one ``StepView`` to its consumers. Monitoring work done between steps arrives as a root
span of kind ``monitor`` and becomes a ``StepView`` with ``is_step=False`` (an "operation").

It works on any span that follows the attribute contract (ours, or SDK spans from any
tracer); spans without the contract's attributes are ignored. Incomplete traces are bounded:
the oldest is evicted (and counted) when too many wait for their root.

Usage::

    class MyProcessor(StepViewProcessor):
        def on_step(self, view: StepView) -> None:
            print(view.step, view.duration_ns, view.monitor_ns)

    provider.add_span_processor(MyProcessor())          # standalone: assembles by itself
    shared = SharedStepSpanProcessor([MyProcessor(), OtherProcessor()])  # assemble once
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from otel_train.common import attributes as A
from otel_train.common import sdk_private
from otel_train.common.rate_limited_log import RateLimitedLogger

_log = logging.getLogger("otel_train")

# A phase, as a tuple (cheaper to build than an object on every span):
# (name, kind, loader, duration_ns, span_id, parent_span_id)
P_NAME, P_KIND, P_LOADER, P_DURATION, P_SPAN_ID, P_PARENT_ID = range(6)
P_KEY = slice(P_NAME, P_LOADER + 1)  # a phase's (name, kind, loader), one C-level slice
_kind_of = itemgetter(P_KIND)
# The contract's names as module constants (a global lookup, not a module attribute, per use)
_ROOT_NAME, _STEP, _RANK, _LOADER = A.STEP_SPAN_NAME, A.STEP, A.RANK, A.DATALOADER
_span_fields = sdk_private.readable_span_fields
_KIND, _MONITOR, _PHASE = A.PHASE_KIND, A.KIND_MONITOR, A.PHASE


class StepView:
    """One step (root + phases), or one monitoring operation done between steps."""

    __slots__ = ("is_step", "name", "trace_id", "root_span_id", "step", "rank", "loader",
                 "start_ns", "end_ns", "duration_ns", "phases", "operations", "monitor_ns",
                 "span", "slow", "slow_explained", "envelope", "events")

    def __init__(self, is_step: bool, name: str, span: ReadableSpan, ctx: Any, attrs: Any,
                 start_ns: int, end_ns: int, phases: list[tuple[Any, ...]]) -> None:
        self.is_step = is_step
        self.name = name
        self.trace_id: int = ctx[0]  # SpanContext is a tuple (trace_id, span_id, ...)
        self.root_span_id: int = ctx[1]
        self.step: int = attrs.get(_STEP, -1)
        self.rank: Any = attrs.get(_RANK, 0)
        self.loader: str | None = attrs.get(_LOADER)
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.duration_ns: int = end_ns - start_ns if end_ns > start_ns else 0
        self.phases = phases
        # Top-level monitoring operations of this view: (name, duration_ns). A monitor nested
        # in another monitor is part of its parent's time, so it is not listed (not counted twice).
        self.operations: list[tuple[str, int]] = []
        self.monitor_ns = 0
        self.span = span
        self.slow = False
        self.slow_explained = False  # a slow step whose breakdown is printed (slow_steps.py)
        # The job's envelope (train.startup): neither training nor monitoring; only the
        # processors that say ``takes_envelope`` see it (derived/goodput.py).
        self.envelope = False
        self.events: tuple[Any, ...] = ()  # the root's span events in row form (span records)

    def top_level_phases(self) -> list[tuple[Any, ...]]:
        """Phases whose parent is the root span (their times do not overlap)."""
        root = self.root_span_id
        return [p for p in self.phases if p[P_PARENT_ID] == root]

    def __repr__(self) -> str:
        what = "step" if self.is_step else f"operation {self.name!r}"
        return f"<StepView {what} {self.step} {self.duration_ns / 1e9:.3f}s>"


def set_span_attribute(span: ReadableSpan, key: str, value: Any) -> None:
    """Set an attribute on a finished span, for the exporters that run after us.

    Our spans keep a plain dict in ``_attributes`` (documented private use); spans of other
    tracers have an immutable mapping there, replaced by a mutable copy.
    """
    attrs = sdk_private.span_attributes(span)
    if type(attrs) is dict:
        attrs[key] = value
        return
    new = dict(attrs or {})
    new[key] = value
    sdk_private.replace_span_attributes(span, new)


class StepAssembler:
    """Groups spans by trace id until the root arrives; calls back with a StepView.

    Callbacks run with ``lock`` held, so consumers sharing the lock read consistent state.
    """

    def __init__(
        self,
        on_view: Callable[[StepView], None],
        lock: threading.RLock | None = None,
        max_pending_traces: int = 256,
        max_phases_per_trace: int = 100_000,
    ) -> None:
        if max_pending_traces < 1:
            raise ValueError("max_pending_traces must be >= 1")
        self._on_view = on_view
        self.lock = lock if lock is not None else threading.RLock()
        # trace id -> phases so far. One process is one rank, so the trace id alone is a step.
        self._pending: dict[int, list[tuple[Any, ...]]] = {}
        self._max_pending = max_pending_traces
        self._max_phases = max_phases_per_trace
        self._warn = RateLimitedLogger(_log)
        self.evicted_traces = 0  # incomplete traces dropped from the metrics (never from export)
        self.ignored_spans = 0  # spans without the contract's attributes
        self.views = 0

    def add(self, span: ReadableSpan) -> None:
        """Take one finished span."""
        # Hot in the background (every span of every step): ReadableSpan's fields read
        # directly, and SpanContext indexed (a tuple: trace_id, span_id, is_remote, ...)
        # instead of through its named properties.
        attrs, ctx, name, parent, start, end = _span_fields(span)
        if ctx is None or not attrs:
            self.ignored_spans += 1
            return
        if name == _ROOT_NAME and _STEP in attrs:
            phases = self._pending.pop(ctx[0], None)
            view = StepView(True, name, span, ctx, attrs, start, end,
                            phases if phases is not None else [])
            if phases:
                count_monitoring(view)
            with self.lock:
                self._emit(view)
            return
        kind = attrs.get(_KIND)
        if kind is None:
            self.ignored_spans += 1
            return
        if parent is None or parent[2]:  # no parent, or a remote one: a root of its own
            if kind == _MONITOR:  # monitoring work between steps
                view = StepView(False, attrs.get(_PHASE, name), span, ctx, attrs, start, end,
                                [])
                view.operations.append((view.name, view.duration_ns))
                view.monitor_ns = view.duration_ns
                with self.lock:
                    self._emit(view)
            else:
                self.ignored_spans += 1
            return
        # No lock for the phases: one trace's spans come from one thread (a trace is one
        # step), and single dict/list operations are atomic.
        pending = self._pending
        phases = pending.get(ctx[0])
        if phases is None:
            if len(pending) >= self._max_pending:
                self._evict_oldest()
            phases = pending[ctx[0]] = []
        elif len(phases) >= self._max_phases:
            self.ignored_spans += 1
            return
        phases.append((name, kind, attrs.get(_LOADER),
                       end - start if end > start else 0, ctx[1], parent[1]))

    def _emit(self, view: StepView) -> None:
        self.views += 1
        self._on_view(view)

    def _evict_oldest(self) -> None:
        # dicts keep insertion order: the first key is the trace waiting longest for its root
        try:
            oldest = next(iter(self._pending))
        except (StopIteration, RuntimeError):  # emptied or changed by another thread
            return
        if self._pending.pop(oldest, None) is None:
            return
        self.evicted_traces += 1
        self._warn.warning(
            "evict", "otel-train: a trace's root span never arrived; its phases were left out "
            "of the derived metrics (%d incomplete trace(s) so far)", self.evicted_traces)


def count_monitoring(view: StepView) -> None:
    """Fill ``view.operations`` / ``monitor_ns`` with the top-level monitor phases."""
    phases = view.phases
    if _MONITOR not in map(_kind_of, phases):  # one C-level pass: no monitoring
        return
    monitors = [p for p in phases if p[P_KIND] == _MONITOR]
    ops = view.operations
    root = view.root_span_id
    total = 0
    for ph in monitors:  # the usual step: every monitor a child of the root, no walk, no dict
        if ph[P_PARENT_ID] != root:
            break
        total += ph[P_DURATION]
    else:
        ops.extend([(ph[P_NAME], ph[P_DURATION]) for ph in monitors])
        view.monitor_ns = total
        return
    parents = {p[P_SPAN_ID]: p for p in phases}
    total = 0
    for ph in monitors:
        parent = parents.get(ph[P_PARENT_ID])
        nested = False
        hops = 0
        while parent is not None and hops < 1000:  # bounded: a malformed cycle must not hang
            if parent[P_KIND] == A.KIND_MONITOR:
                nested = True
                break
            parent = parents.get(parent[P_PARENT_ID])
            hops += 1
        if not nested:
            ops.append((ph[P_NAME], ph[P_DURATION]))
            total += ph[P_DURATION]
    view.monitor_ns = total


class StepViewProcessor(SpanProcessor):
    """Base of the derived-metrics processors: override ``on_step`` (and ``on_operation``).

    Standalone, it assembles spans itself; inside a ``SharedStepSpanProcessor`` it is fed
    views assembled once for all. ``on_step`` runs with ``self._lock`` held; readers take it.
    """

    # The running figures ``export_state`` copies: what another copy of this processor
    # needs to continue exactly where this one is (the exporter process feeds the chain
    # and the training process keeps a copy, derived/chain.py).
    state_fields: tuple[str, ...] = ()
    # Whether ``on_operation`` also gets the job envelope's views (train.startup).
    takes_envelope = False
    # Whether, in a frame, this processor takes each view right after the processors before
    # it took that view (consecutive ones form a group fed view by view): what reads others'
    # figures *as of its step* (the console's verdict of step 10 is step 10's, not the
    # frame's end).
    view_by_view = False
    # In a ``view_by_view`` group: whether this processor reads the figures of the members
    # before it as of its step (the budget reads the overhead's, the console everyone's).
    # The members after the group's last reader take a frame whole, each alone.
    reads_before = True

    def __init__(self) -> None:
        self._lock: threading.RLock = threading.RLock()
        self._assembler: StepAssembler | None = None

    def export_state(self) -> dict[str, Any]:
        """The running figures as plain data (``marshal``-able); call with the lock held."""
        return {name: _plain(getattr(self, name)) for name in self.state_fields}

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from ``export_state``'s figures (of a processor built the same way)."""
        for name in self.state_fields:
            if name in state:
                current = getattr(self, name)
                value = state[name]
                if isinstance(current, deque):
                    value = deque(value, maxlen=current.maxlen)
                setattr(self, name, value)

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        """Nothing to do at start: everything is derived from finished spans."""

    def on_end(self, span: ReadableSpan) -> None:
        """Assemble ``span`` into its step; never raises."""
        if self._assembler is None:
            self._assembler = StepAssembler(self.on_view, self._lock)
        self._assembler.add(span)

    def on_view(self, view: StepView) -> None:
        """Dispatch one view to ``on_step`` or ``on_operation``."""
        if view.is_step:
            self.on_step(view)
        else:
            self.on_operation(view)

    def on_step(self, view: StepView) -> None:
        """One finished step."""

    def on_steps(self, views: Sequence[StepView],
                 failed: Callable[[StepViewProcessor, StepView, Exception], None]) -> None:
        """A frame of finished steps, in order (``SharedStepSpanProcessor.on_views``): each
        to ``on_step``; a step it fails on goes to ``failed``, the others go on. A
        processor overrides it where a loop of its own costs less a step."""
        on_step = self.on_step
        for view in views:
            try:
                on_step(view)
            except Exception as exc:
                failed(self, view, exc)

    def take_group(self, before: Sequence[StepViewProcessor], views: Sequence[StepView],
                   failed: Callable[[StepViewProcessor, StepView, Exception], None]) -> bool:
        """As the last member of a ``view_by_view`` group fed a frame of steps: take the
        frame for the whole group (``before``: the members before it, in order), each view
        to each member in turn as the group would, at less cost; False (the default): the
        group is fed as usual."""
        return False

    def on_operation(self, view: StepView) -> None:
        """One monitoring operation done between steps."""

    def shutdown(self) -> None:
        """Nothing to release by default."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Views are handled synchronously: nothing is ever pending."""
        return True


class SharedStepSpanProcessor(SpanProcessor):
    """Assembles each trace once and hands the view to several processors, in order.

    The processors share one lock, so a reader of any of them sees all of them consistent.
    A failing processor is logged (rate-limited) and counted; the others still run.
    """

    def __init__(self, processors: Sequence[StepViewProcessor],
                 max_pending_traces: int = 256, lock: Any = None) -> None:
        self.processors = list(processors)
        # ``lock``: an RLock others hold around reads of these processors too (the governor).
        self.lock = lock if lock is not None else threading.RLock()
        for proc in self.processors:
            proc._lock = self.lock
        self._assembler = StepAssembler(self._dispatch, self.lock, max_pending_traces)
        # on_end (per span) is the assembler's add itself: assemble the span, and dispatch
        # when its step is complete; one Python call less than a method forwarding to it.
        self.on_end = self._assembler.add  # type: ignore[method-assign]
        self._on_step = [(p, p.on_step) for p in self.processors]
        self._on_operation = [(p, p.on_operation) for p in self.processors]
        # on_views: runs of consecutive ``view_by_view`` processors, each other one alone;
        # each member with its bound handlers.
        self._groups: list[list[tuple[StepViewProcessor, Any, Any]]] = []
        for proc in self.processors:
            member = (proc, proc.on_step, proc.on_operation)
            if proc.view_by_view and self._groups and self._groups[-1][-1][0].view_by_view:
                self._groups[-1].append(member)
            else:
                self._groups.append([member])
        self._groups = [part for group in self._groups for part in _split_group(group)]
        self._warn = RateLimitedLogger(_log)
        self.errors = 0

    def on_view(self, view: StepView) -> None:
        """Take one view built elsewhere (the row path: span_rows.view_from_record)."""
        self.on_views((view,))

    def on_views(self, views: Sequence[StepView]) -> None:
        """Views built elsewhere, a frame of them at once: each processor takes them all,
        in order, before the next processor does. Each processor's state then stays in the
        caches through the frame, for less CPU than view by view
        (benchmarks/bench_processors.py prints both). A processor
        sees what the ones before it made of the whole frame: ``train.slow`` is marked on
        every view first. Consecutive processors that say ``view_by_view`` (the overhead,
        the budget, the throughput and the console) take the frame as a group, view by view,
        so the console's line of a step reads the figures as of that step; the members after
        the group's last reader (``reads_before``) each take it whole, and a frame of steps
        may be taken for the group by its last member (``take_group``). A frame of steps
        alone (the usual one) goes to each other processor in one call, its ``on_steps``.
        """
        with self.lock:
            self._assembler.views += len(views)
            steps_only = all(view.is_step for view in views)
            for group in self._groups:
                self.feed_group(group, views, steps_only)

    def feed_group(self, group: list[tuple[StepViewProcessor, Any, Any]],
                   views: Sequence[StepView], steps_only: bool) -> None:
        """One group of ``on_views`` takes the frame (``steps_only``: every view is a step).
        Never raises: a view a processor fails on is logged and counted, the rest go on."""
        if len(views) == 1:  # one view (a drain of a long step): on_step, no frame set-up
            steps_only = False
        if steps_only and len(group) == 1:
            proc = group[0][0]
            try:
                proc.on_steps(views, self._failed)
            except Exception as exc:  # an on_steps that does not guard its steps itself
                self._failed(proc, views[0], exc)
            return
        if steps_only:
            last = group[-1][0]
            try:
                if last.take_group([m[0] for m in group[:-1]], views, self._failed):
                    return
            except Exception as exc:  # a take_group that does not guard its steps itself
                self._failed(last, views[0], exc)
                return
        if steps_only:  # view by view, together: each step to each member in turn
            members = [(proc, on_step) for proc, on_step, _ in group]
            for view in views:
                for proc, on_step in members:
                    try:
                        on_step(view)
                    except Exception as exc:
                        self._failed(proc, view, exc)
            return
        for view in views:
            for proc, on_step, on_operation in group:
                try:
                    if view.is_step:
                        on_step(view)
                    elif not view.envelope or proc.takes_envelope:
                        on_operation(view)
                except Exception as exc:  # one processor's bug must not starve others
                    self._failed(proc, view, exc)

    def _failed(self, proc: StepViewProcessor, view: StepView, exc: Exception) -> None:
        self.errors += 1
        self._warn.warning(f"proc-{type(proc).__name__}", "otel-train: %s failed on step %s: %r",
                           type(proc).__name__, view.step, exc)

    def _dispatch(self, view: StepView) -> None:
        for proc, handle in (self._on_step if view.is_step else self._on_operation):
            if view.envelope and not proc.takes_envelope:
                continue
            try:
                handle(view)
            except Exception as exc:  # one processor's bug must not starve the others
                self._failed(proc, view, exc)

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        """Nothing to do at start."""

    def shutdown(self) -> None:
        """Shut every processor down."""
        for proc in self.processors:
            try:
                proc.shutdown()
            except Exception as exc:
                self._warn.warning("shutdown", "otel-train: %s shutdown failed: %r",
                                   type(proc).__name__, exc)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Synchronous: nothing is pending."""
        return True


def _split_group(group: list[Any]) -> list[list[Any]]:
    """A ``view_by_view`` group, the members after its last reader (``reads_before``;
    the first member has no one before it to read) each a group of its own: no one reads
    their figures as of a step, so they take a frame whole."""
    last = max((i for i, m in enumerate(group) if i and m[0].reads_before), default=0)
    return [group[:last + 1]] + [[m] for m in group[last + 1:]]


def _plain(value: Any) -> Any:
    """Containers of running figures as marshal-able values (deques become lists)."""
    if isinstance(value, deque):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
