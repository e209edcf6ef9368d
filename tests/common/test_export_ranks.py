"""export_ranks and span_mode: which ranks send ordinary steps, read from the option, the
same ranks on every restart, and a plan that turns the tail decision on where it is needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_train.common.export_ranks import (
    AUTO_ALL_MAX_WORLD_SIZE,
    parse_export_ranks,
    rank_hash_unit,
    resolve_export_ranks,
    routine_export,
)
from otel_train.common.identity import RunIdentity
from otel_train.common.options import RunOptions
from otel_train.derived.sampling import build_step_sampler
from otel_train.pipeline.settings import at_scale_banner, sampling_settings
from otel_train.pipeline.plan import PipelineEnvironment, plan_pipeline


def _exporting(value: object, world: int, per_node: int = 8) -> list[int]:
    choice = resolve_export_ranks(value, world)
    return [r for r in range(world) if choice.exports(r, r % per_node)]


def test_each_form_of_the_option_picks_its_ranks():
    assert _exporting("all", 16) == list(range(16))
    assert _exporting("first-per-node", 16) == [0, 8]
    assert _exporting(0, 16) == [0]
    assert _exporting("0,8,9", 16) == [0, 8, 9]
    assert _exporting([3, 5], 16) == [3, 5]
    assert _exporting("fraction:1", 16) == list(range(16))


def test_auto_is_all_up_to_64_ranks_then_first_per_node():
    assert AUTO_ALL_MAX_WORLD_SIZE == 64
    assert _exporting("auto", 64) == list(range(64))
    assert _exporting("auto", 128) == list(range(0, 128, 8))
    assert resolve_export_ranks("auto", 128).describe() == \
        "first-per-node (the default above 64 ranks)"


def test_a_fraction_picks_about_that_share_by_a_stable_hash_and_always_rank_0():
    picked = _exporting("fraction:0.1", 1000)
    assert 0 in picked and 60 <= len(picked) <= 140
    # The hash is of the rank alone: the same ranks on every restart and every host.
    assert picked == _exporting("FRACTION:0.1", 1000)
    assert rank_hash_unit(7) == rank_hash_unit(7) != rank_hash_unit(8)
    assert set(_exporting("fraction:0.05", 1000)) <= set(picked)


@pytest.mark.parametrize("bad", ["some", "fraction:0", "fraction:2", "fraction:x", "-1",
                                 "0,,1", [], [-1], True, 1.5])
def test_a_malformed_choice_is_refused_naming_the_option(bad: object):
    with pytest.raises(ValueError):
        parse_export_ranks(bad)
    with pytest.raises(ValueError, match="export_ranks"):
        RunOptions.resolve(environ={}, export_ranks=bad)


def test_the_options_are_read_from_the_environment():
    opts = RunOptions.resolve(environ={"OTEL_TRAIN_EXPORT_RANKS": "First-Per-Node",
                                       "OTEL_TRAIN_SPAN_MODE": "summary",
                                       "OTEL_TRAIN_SUMMARY_EVERY_STEPS": "10",
                                       "OTEL_TRAIN_METRICS_RANK_LABEL": "gauges"})
    assert routine_export(opts, rank=9, world_size=16, local_rank=1) == (False, True)
    assert routine_export(opts, rank=8, world_size=16, local_rank=0) == (True, True)
    assert opts.summary_every_steps == 10 and opts.metrics_rank_label == "gauges"
    for bad in ({"span_mode": "spans"}, {"summary_every_steps": 0},
                {"summary_every_seconds": 0.0}, {"metrics_rank_label": "none"}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RunOptions.resolve(environ={}, **bad)


def _identity(rank: int, world: int) -> RunIdentity:
    return RunIdentity("r", rank, world, rank % 8, "option")


def test_a_rank_left_out_keeps_only_the_steps_that_matter_and_says_so():
    opts = RunOptions.resolve(environ={}, export_ranks="0")
    out = build_step_sampler(sampling_settings(opts, _identity(3, 4)))
    assert out is not None and out.ratio == 0.0 and out.keep_first_steps == 0
    assert not out.keep_monitor and out.summary is None
    assert build_step_sampler(sampling_settings(opts, _identity(0, 4))) is None
    assert "only slow, failed, stalled and truncated steps" in at_scale_banner(
        opts, _identity(3, 4))[0]
    assert at_scale_banner(RunOptions.resolve(environ={}), _identity(3, 4)) == []
    summary = build_step_sampler(sampling_settings(
        RunOptions.resolve(environ={}, span_mode="summary"), _identity(1, 4)))
    assert summary is not None and summary.summary is not None


def test_the_plan_turns_the_tail_decision_on_for_a_rank_left_out():
    opts = RunOptions.resolve(environ={}, export_ranks="first-per-node", exporter="otlp",
                              otlp_endpoint="http://collector:4317")
    env = dict(status_dir=Path("runs/r"), world_size=16)
    assert plan_pipeline(opts, PipelineEnvironment(rank=8, local_rank=0, **env)
                         ).tail_sampler is False
    plan = plan_pipeline(opts, PipelineEnvironment(rank=9, local_rank=1, **env))
    assert plan.tail_sampler is True
    assert any("rank 9 exports only slow" in r for r in plan.reasons)
