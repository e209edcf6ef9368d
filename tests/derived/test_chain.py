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
from otel_train.records.steps_view import SharedStepSpanProcessor

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
