"""The derived-metrics chain and its state: a copy loaded from another chain's state goes on
exactly as the original would (what the training process relies on when the exporter process
feeds the metrics, and when it takes over from a dead one)."""

from __future__ import annotations

import io
import logging
import marshal
from typing import Any

import pytest
from prometheus_client import generate_latest
from span_trees import feed, monitor_span, step_spans, train_step

from otel_train.derived.chain import StepChain
from otel_train.pipeline.settings import chain_settings
from otel_train.common.identity import RunIdentity
from otel_train.common.options import RunOptions
from otel_train.common.self_cost import SelfCostMeter
from otel_train.common import attributes as A
from otel_train.records.steps_view import SharedStepSpanProcessor, StepViewProcessor

IDENT = RunIdentity("test-run", rank=0, world_size=1, local_rank=0, run_id_source="option")


def _chain(**options: Any) -> tuple[StepChain, SharedStepSpanProcessor, io.StringIO]:
    settings = chain_settings(RunOptions.resolve(environ={}, console=True, log_every=5,
                                                 console_min_interval_seconds=0, **options),
                              IDENT)
    stream = io.StringIO()
    meter = SelfCostMeter()
    meter.add_background_ns(1_000_000)
    chain = StepChain(marshal.loads(marshal.dumps(settings)), meter, console_stream=stream)
    return chain, SharedStepSpanProcessor(chain.processors), stream


def _steps(first: int, count: int) -> list[Any]:
    """Every shape the chain counts: two loaders, monitoring in and between steps, slow
    steps, a failed-looking long operation."""
    spans: list[Any] = []
    for i in range(first, first + count):
        if i % 17 == 9:
            spans += train_step(i, step_ms=900.0)  # slow against a ~100 ms baseline
        elif i % 10 == 0:
            spans += train_step(i, step_ms=130.0, monitor_ms=30.0)
        elif i % 7 == 3:
            spans += step_spans(i, [("data", "train", 0, 40, None, "val"),
                                    ("forward", "train", 40, 90)], 95.0, loader="val")
        else:
            spans += train_step(i, step_ms=100.0 + (i % 5))
        if i % 11 == 0:
            spans.append(monitor_span("checkpoint", i, 40_000.0, start_ms=i * 10_000 + 200))
    return spans


def _figures(chain: StepChain) -> dict[str, Any]:
    text = generate_latest(chain.metrics.registry).decode()
    return {
        "overhead": chain.overhead.snapshot(),
        "slow": (chain.slow.slow_steps, chain.slow.median_seconds(), chain.slow.last_slow,
                 chain.slow.unexplained),
        "budget": (dict(chain.budget.slow_operations), chain.budget.status()),
        "console": chain.console.lines_written if chain.console else None,
        "prometheus": [ln for ln in text.splitlines() if not ln.startswith("#")],
    }


def test_a_chain_loaded_from_another_chains_state_goes_on_exactly_as_the_original() -> None:
    original, shared, _ = _chain()
    copy, copy_shared, copy_stream = _chain()
    feed(shared, _steps(0, 60))
    with shared.lock:
        state = marshal.loads(marshal.dumps(original.export_state()))  # as it crosses the pipe
    with copy_shared.lock:
        copy.load_state(state)
    assert _figures(copy) == _figures(original)

    more = _steps(60, 60)
    feed(shared, more)
    feed(copy_shared, more)
    after = _figures(original)
    assert after == _figures(copy)
    assert after["slow"][0] >= 4  # slow steps were judged after the hand-over, alike
    assert "checkpoint" in after["budget"][0]
    assert copy_stream.getvalue()  # the copy's console went on too


def test_a_chain_that_missed_the_state_judges_differently() -> None:
    # The check above can fail: a fresh chain fed only the later steps disagrees.
    original, shared, _ = _chain()
    fresh, fresh_shared, _ = _chain()
    feed(shared, _steps(0, 60))
    more = _steps(60, 60)
    feed(shared, more)
    feed(fresh_shared, more)
    assert _figures(fresh) != _figures(original)


@pytest.mark.parametrize("role", ["slow", "overhead", "budget", "metrics", "console", "comm"])
def test_every_stateful_processor_is_in_the_state(role: str) -> None:
    original, shared, _ = _chain()
    feed(shared, _steps(0, 40))
    with shared.lock:
        state = original.export_state()
    assert role in state and state[role]
    marshal.dumps(state)  # plain data only


def test_settings_follow_the_options() -> None:
    settings = chain_settings(RunOptions.resolve(environ={}, slow_step_factor=4.0,
                                                 console=False, budget=0.02), IDENT)
    chain = StepChain(settings, None)
    assert chain.slow.factor == 4.0 and chain.budget.budget == 0.02
    assert chain.console is None
    assert "console" not in chain.export_state()


def test_with_the_console_on_each_warning_comes_after_its_steps_line_and_before_later_ones(
        ) -> None:
    """Processors take a frame one after another: the slow-step and budget warnings are held
    until the console has written their step's line, so one stream reads in step order."""
    chain, shared, stream = _chain()
    said: list[str] = []

    class Beside(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            # the console's lines so far, then this record: the order a terminal shows
            said.extend(line for line in stream.getvalue().splitlines()[len(_lines(said)):])
            said.append("WARN " + record.getMessage().splitlines()[0])

    handler = Beside()
    log = logging.getLogger("otel_train")
    log.addHandler(handler)
    try:
        spans = [s for i in range(40)
                 for s in train_step(i, step_ms=900.0 if i == 23 else 100.0 + i % 3)]
        feed(shared, spans)  # one frame: the chain sees steps 0..39 at once
        chain.console.shutdown() if chain.console is not None else None
    finally:
        log.removeHandler(handler)
    said.extend(stream.getvalue().splitlines()[len(_lines(said)):])
    warn = next(i for i, s in enumerate(said) if s.startswith("WARN") and "slow step 23" in s)
    step_lines = [(i, int(s.split("step ")[1].split()[0].rstrip(":")))
                  for i, s in enumerate(said) if s.startswith("⏱️  step ")]
    assert any(n == 23 for _, n in step_lines)
    assert all(i < warn for i, n in step_lines if n <= 23)
    assert all(i > warn for i, n in step_lines if n > 23)
    assert [n for _, n in step_lines] == sorted(n for _, n in step_lines)


def _lines(said: list[str]) -> list[str]:
    """The console lines among what was said (every entry not a warning)."""
    return [s for s in said if not s.startswith("WARN")]


def _record(i: int, start_ns: int, phases_ms: list[tuple[str, str, str | None, float]],
            gap_ms: float = 0.2) -> tuple[Any, ...]:
    """A step's span record (records/span_rows.py layout), its phases back to back."""
    root_id = 0x1000 + i
    rows, t = [], start_ns
    for k, (name, kind, loader, ms) in enumerate(phases_ms):
        dur = int(ms * 1e6)
        rows.append((name, kind, loader, dur, k + 1, root_id, t, t + dur, None, (), None, None))
        t += dur + int(gap_ms * 1e6)
    attrs = {"train.step": i, "train.dataloader": "train", "train.slow": False,
             "train.step.bound": "compute"}
    return ("train.step", (7 << 64) + i, root_id, 1, start_ns, t, attrs, None, (), rows, None)


def _operation(i: int, start_ns: int, name: str, ms: float) -> tuple[Any, ...]:
    """A monitoring operation between steps (a record without phases)."""
    attrs = {"train.step": i, "train.phase": name, "train.phase.kind": "monitor"}
    return (name, (9 << 64) + i, 0x9000 + i, 1, start_ns, start_ns + int(ms * 1e6), attrs,
            None, (), None, None)


def _frames_of_records(count: int) -> list[list[Any]]:
    """256-record frames: plain steps, evaluation steps (monitors, a val loader's data),
    slow steps, and checkpoints between steps, with durations across the buckets."""
    out, t = [], 1_700_000_000_000_000_000
    for i in range(count):
        train_ms = 3.0 + (i % 7) * 0.9 + (40.0 if i % 97 == 60 else 0.0)  # some slow
        phases = [("data", "train", "train", 0.4 + (i % 3) * 0.3),
                  ("forward", "train", None, train_ms), ("backward", "train", None, 2 * train_ms),
                  ("optimizer", "train", None, 0.7)]
        if i % 10 == 0:
            phases += [("inference", "monitor", None, 1.5),
                       ("data", "monitor", "val", 0.3 * (1 + i % 4)),
                       ("val_loss", "monitor", None, 2.5 + i % 11)]
        rec = _record(i, t, phases)
        out.append(rec)
        t = rec[5] + 100_000
        if i % 50 == 25:
            out.append(_operation(i, t, "checkpoint", 30.0 + i % 300))
            t = out[-1][5] + 100_000
    return [out[k:k + 256] for k in range(0, len(out), 256)]


def test_the_chain_s_step_histograms_scrape_the_same_as_prometheus_client_s_own() -> None:
    """The exporter process's path (span records, frame by frame) against a reference
    registry fed the same durations through prometheus_client's Histogram and Counter:
    every bucket, sum, count and counter of the real /metrics text is the same number."""
    import urllib.request

    from prometheus_client import CollectorRegistry, Counter, Histogram
    from prometheus_client.parser import text_string_to_metric_families

    from otel_train.derived.chain import feed_records

    chain, shared, _ = _chain()
    frames = _frames_of_records(1200)
    for frame in frames:
        feed_records(shared, frame, 0)
    ref = CollectorRegistry(auto_describe=False)
    bounds = chain.metrics._bounds
    step_h = Histogram("otel_train_step_duration_seconds", "", ["rank"], registry=ref,
                       buckets=bounds)
    phase_h = Histogram("otel_train_phase_duration_seconds", "",
                        ["phase", "kind", "loader", "rank"], registry=ref, buckets=bounds)
    steps_c = Counter("otel_train_steps", "", ["rank"], registry=ref)
    slow_c = Counter("otel_train_slow_steps", "", ["rank"], registry=ref)
    slow = 0
    for frame in frames:
        for rec in frame:
            if rec[9] is None:  # an operation between steps
                phase_h.labels(rec[6]["train.phase"], "monitor", "", "0").observe(
                    (rec[5] - rec[4]) / 1e9)
                continue
            step_h.labels("0").observe((rec[5] - rec[4]) / 1e9)
            steps_c.labels("0").inc()
            if rec[6]["train.slow"]:  # marked on the record's root by the chain
                slow_c.labels("0").inc()
                slow += 1
            for ph in rec[9]:
                phase_h.labels(ph[0], ph[1], ph[2] or "", "0").observe(ph[3] / 1e9)
    assert slow >= 5  # the slow counter is compared on real slow steps

    url = chain.metrics.start_server("127.0.0.1", 0)
    try:
        text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    finally:
        chain.metrics.stop_server()

    def contract(body: str) -> dict[tuple[str, tuple[Any, ...]], float]:
        names = ("otel_train_step_duration_seconds", "otel_train_phase_duration_seconds",
                 "otel_train_steps_total", "otel_train_slow_steps_total")
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(body) for s in fam.samples
                if s.name.startswith(names) and not s.name.endswith("_created")}

    ours, theirs = contract(text), contract(generate_latest(ref).decode())
    assert len(theirs) > 100
    assert ours == theirs


# -- a frame at a time (on_steps, take_group) against view by view, processor by processor

class _FailsEveryFifthStep(StepViewProcessor):
    """A processor with a bug: the chain must go on around it the same either way."""

    def on_step(self, view: Any) -> None:
        if view.step % 5 == 0:
            raise RuntimeError("a bug")


def _rich_record(i: int, start_ns: int) -> tuple[Any, ...]:
    """A step of one of the shapes each fast path sets apart: plain, evaluation (material
    monitoring, a slow operation), slow, a checkpoint phase, collectives, device readings
    and a queued wait on the monitoring, counted tokens, and a collective that cannot be
    read (the comm processor fails on it)."""
    train_ms = 3.0 + (i % 7) * 0.4 + (30.0 if i % 41 == 20 else 0.0)
    extra = ({A.DEVICE_BUSY: 0.002, A.MEMORY_PEAK_ALLOCATED: 1000 + i} if i % 13 == 5
             else None)
    loader = "val" if i % 5 == 2 else "train"  # a phase's key changing at its position
    phases: list[tuple[Any, ...]] = [("data", "train", loader, 0.3, None),
                                     ("forward", "train", None, train_ms, extra),
                                     ("backward", "train", None, 2 * train_ms, None)]
    if i % 6 == 0:
        phases.append(("inference", "monitor", None, 0.5, None))
    if i % 23 == 11:
        phases.append(("val_loss", "monitor", None, 40.0,
                       {A.DEVICE_QUEUED_WAIT: 0.001}))  # material, and slow (limit 0.03 s)
    if i % 31 == 7:
        phases.append(("checkpoint", "monitor", None, 5.0, None))
    if i % 29 == 14:  # a long step: a slow operation, not material monitoring
        phases[1] = ("forward", "train", None, 2000.0, None)
        phases.append(("inference", "monitor", None, 35.0, None))
    root_id = 0x1000 + i
    rows, t = [], start_ns
    for k, (name, kind, loader, ms, ex) in enumerate(phases):
        dur = int(ms * 1e6)
        rows.append((name, kind, loader, dur, k + 1, root_id, t, t + dur, None, (), ex, None))
        t += dur + 200_000
    attrs: dict[str, Any] = {"train.step": i, "train.dataloader": "train", "train.slow": False,
                             "train.step.bound": "input" if i % 9 == 0 else "compute"}
    events: tuple[Any, ...] = ()
    if i % 8 == 3:
        attrs[A.COMM_EXPOSED_SECONDS] = 0.001 if i % 16 == 3 else "unreadable"
        events = ((A.COMM_EVENT, t, {A.COMM_OP: "all_reduce", A.COMM_COUNT: 2,
                                     A.COMM_BYTES: 4096, A.COMM_SECONDS: 0.002}),)
    if i % 19 == 4:
        attrs[A.TOKENS] = 512
        attrs[A.DEVICE_IDLE] = 0.0005
        attrs[A.HOST_RSS] = 10_000 + i
    return ("train.step", (7 << 64) + i, root_id, 1, start_ns, t, attrs, None, events, rows,
            None)


def _rich_frames(count: int) -> list[list[Any]]:
    """Frames of 40 records from the start of a run (warm-up), operations between steps
    in some frames (frames that are not steps alone)."""
    out, t = [], 1_700_000_000_000_000_000
    for i in range(count):
        rec = _rich_record(i, t)
        out.append(rec)
        t = rec[5] + 100_000
        if i % 90 == 45:
            out.append(_operation(i, t, "checkpoint", 12.0))
            t = out[-1][5] + 100_000
    return [out[k:k + 40] for k in range(0, len(out), 40)]


def _general(shared: SharedStepSpanProcessor, views: list[Any]) -> None:
    """The general path: each processor (consecutive view_by_view ones together, view by
    view) takes each view through on_step / on_operation, no on_steps nor take_group."""
    groups: list[list[Any]] = []
    for proc in shared.processors:
        member = (proc, proc.on_step, proc.on_operation)
        if proc.view_by_view and groups and groups[-1][-1][0].view_by_view:
            groups[-1].append(member)
        else:
            groups.append([member])
    with shared.lock:
        for group in groups:
            shared.feed_group(group, views, False)


def _fed(console: bool, by_frame: bool) -> tuple[str, str, list[str], list[Any], int]:
    from otel_train.records.span_rows import views_from_records

    settings = chain_settings(RunOptions.resolve(
        environ={}, console=console, log_every=7, console_min_interval_seconds=0,
        slow_operation_seconds=0.03), IDENT)
    settings["envelope"] = {"job_start_epoch_ns": 1_699_999_999_000_000_000,  # goodput on
                            "start_from": "option", "attempt": 1, "carried_seconds": {},
                            "carried_job_seconds": 0.0, "previous_startup_trace_id": None,
                            "restart_lost_seconds": 0.0}
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    log = logging.getLogger("otel_train")
    log.addHandler(handler)
    try:
        chain = StepChain(settings, SelfCostMeter(), console_stream=io.StringIO())
        shared = SharedStepSpanProcessor(chain.processors + [_FailsEveryFifthStep()])
        frames = _rich_frames(600)
        states = []  # the running figures after each frame
        for k, frame in enumerate(frames):
            if k == 6:  # the GPU sampler's first round comes mid-run
                chain.gpu_steps.add_round((frame[10][4] + 1000, 0.75, 1 << 30))
            views = views_from_records(frame, 0, lambda exc: None)
            if k == 9:  # a rank change inside a frame
                for view in views[20:]:
                    view.rank = 1
            if by_frame:
                shared.on_views(views)
            else:
                _general(shared, views)
            states.append(repr(sorted(chain.export_state().items(), key=lambda kv: kv[0])))
        state = "\n".join(states)
        prom = generate_latest(chain.metrics.registry).decode()
        marks = [sorted(rec[6].items(), key=str) for frame in frames for rec in frame]
        return state, prom, said, marks, shared.errors
    finally:
        log.removeHandler(handler)


@pytest.mark.parametrize("console", [False, True])
def test_a_frame_at_a_time_gives_what_view_by_view_gives(console: bool) -> None:
    """Every fast path of the chain's frames (the processors' on_steps, the overhead and
    budget in one loop) against each processor's on_step view by view, on the same steps:
    warm-up, a rank change, operations between steps, slow steps and slow operations,
    material monitoring, a checkpoint phase, collectives (one unreadable: a failing
    processor), device readings, counted tokens, a GPU round, and a processor that fails.
    The running figures, the Prometheus text, the warnings in their order, the marks on
    the records and the failures counted are the same."""
    fast = _fed(console, by_frame=True)
    general = _fed(console, by_frame=False)
    state, prom, said, marks, errors = fast
    assert "'slow_steps': 0" not in state and "train.slow', True" in repr(marks)
    assert any("slow step" in s for s in said) and any("took" in s for s in said)
    assert 'bound="input"' in prom and "otel_train_collectives_total" in prom
    assert "'checkpoint_saves': 0" not in state  # checkpoint phases were counted
    assert errors > 100  # the failing processor's steps and the unreadable collectives
    assert fast[0] == general[0]
    assert fast[1] == general[1]
    assert fast[2] == general[2]
    assert fast[3] == general[3]
    assert fast[4] == general[4]
