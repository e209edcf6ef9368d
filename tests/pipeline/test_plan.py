"""plan_pipeline decides the route, where the derived metrics run, which processors exist and
the export target, from the options and a plain-data environment, with a reason for each."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from train_helpers import clean_env  # noqa: F401  (autouse fixture)

from otel_train.common.options import RunOptions
from otel_train.pipeline.plan import (
    HERE,
    MODE_APP,
    MODE_DISABLED,
    MODE_FOREIGN,
    MODE_OURS,
    ROUTE_APPLICATION,
    ROUTE_NONE,
    ROUTE_PROCESS,
    ROUTE_STAGE,
    THERE,
    PipelineEnvironment,
    plan_pipeline,
)

APP_OTLP = "OTLP grpc -> collector:4317 (the application's exporter)"
OTLP = {"exporter": "otlp", "otlp_endpoint": "http://collector:4317"}


def _env(mode: str = MODE_OURS, app_exporter: str | None = None, drops: bool = False,
         **extra: object) -> PipelineEnvironment:
    return PipelineEnvironment(
        provider_mode=mode, app_exporter=app_exporter,
        sampler="TraceIdRatioBased{0.5}" if drops else "ParentBased{root:AlwaysOnSampler}",
        sampler_always_samples=not drops, status_dir=Path("runs/r"), **extra)


def _plan(env: PipelineEnvironment, **options: object):
    return plan_pipeline(RunOptions.resolve(environ={}, **options), env)


# options, environment -> route, where the metrics run, tail sampler, OTLP metrics, joins app
TABLE = [
    ("defaults: the span file from the exporter process", {}, _env(),
     ROUTE_PROCESS, THERE, False, False, False),
    ("OTLP from the exporter process", OTLP, _env(), ROUTE_PROCESS, THERE, False, False, False),
    ("export_process=False", dict(OTLP, export_process=False), _env(),
     ROUTE_STAGE, HERE, False, False, False),
    ("the console exporter stays in this process", {"exporter": "console"}, _env(),
     ROUTE_STAGE, HERE, False, False, False),
    ("exporter none", {"exporter": "none"}, _env(), ROUTE_NONE, HERE, False, False, False),
    ("sample_ratio: tail sampling, still in the exporter process",
     dict(OTLP, sample_ratio=0.1), _env(), ROUTE_PROCESS, THERE, True, False, False),
    ("sample_ratio in-process", dict(OTLP, sample_ratio=0.1, export_process=False), _env(),
     ROUTE_STAGE, HERE, True, False, False),
    ("sample_ratio with nothing exported: no tail sampler", {"exporter": "none",
                                                             "sample_ratio": 0.1},
     _env(), ROUTE_NONE, HERE, False, False, False),
    ("an SDK sampler that drops keeps the metrics here", OTLP, _env(drops=True),
     ROUTE_PROCESS, HERE, False, False, False),
    ("tail sampling overrides a dropping SDK sampler", dict(OTLP, sample_ratio=0.1),
     _env(drops=True), ROUTE_PROCESS, THERE, True, False, False),
    ("metrics over OTLP keep the metrics here", dict(OTLP, metrics_exporter="otlp"), _env(),
     ROUTE_PROCESS, HERE, False, True, False),
    ("metrics_in_export_process=False", dict(OTLP, metrics_in_export_process=False), _env(),
     ROUTE_PROCESS, HERE, False, False, False),
    ("console off changes no route", dict(OTLP, console=False), _env(),
     ROUTE_PROCESS, THERE, False, False, False),
    ("a foreign provider: we export on our own", OTLP, _env(MODE_FOREIGN),
     ROUTE_PROCESS, THERE, False, False, False),
    ("the application's OTLP exporter: our stage, its endpoint", {},
     _env(MODE_APP, APP_OTLP), ROUTE_STAGE, HERE, False, False, False),
    ("the application's exporter with sampling", {"sample_ratio": 0.1},
     _env(MODE_APP, APP_OTLP), ROUTE_STAGE, HERE, True, False, False),
    ("trace_export=application joins its pipeline", {"trace_export": "application"},
     _env(MODE_APP, APP_OTLP), ROUTE_APPLICATION, HERE, False, False, True),
    ("no reusable application exporter joins its pipeline", {}, _env(MODE_APP),
     ROUTE_APPLICATION, HERE, False, False, True),
    ("an explicit exporter beside the application's provider goes to both", OTLP,
     _env(MODE_APP, APP_OTLP), ROUTE_PROCESS, HERE, False, False, True),
    ("an explicit exporter none beside the application's provider", {"exporter": "none"},
     _env(MODE_APP), ROUTE_APPLICATION, HERE, False, False, True),
]


@pytest.mark.parametrize("case", TABLE, ids=[row[0] for row in TABLE])
def test_each_setting_gives_its_route_metrics_placement_and_processors(case):
    _, options, env, route, where, tail, otlp_metrics, joins = case
    plan = _plan(env, **options)
    assert (plan.route, plan.metrics_where, plan.tail_sampler, plan.otlp_metrics,
            plan.joins_application) == (route, where, tail, otlp_metrics, joins)
    assert plan.console == options.get("console", True)


def test_a_disabled_run_plans_nothing_and_says_why():
    plan = _plan(_env(disabled_by="OTEL_SDK_DISABLED=true"), **OTLP)
    assert (plan.route, plan.metrics_where, plan.provider_mode) == (ROUTE_NONE, None,
                                                                    MODE_DISABLED)
    assert plan.export.kind == "none" and "OTEL_SDK_DISABLED" in plan.reasons[0]


def test_the_exporter_process_plan_carries_the_in_process_stage_for_when_it_cannot_start():
    plan = _plan(_env(), **OTLP)
    assert plan.route == ROUTE_PROCESS
    fallback = plan.if_process_fails
    assert fallback is not None and fallback.if_process_fails is None
    assert (fallback.route, fallback.metrics_where) == (ROUTE_STAGE, HERE)
    assert fallback.export == plan.export
    assert any("exporter process could not start" in r for r in fallback.reasons)
    assert _plan(_env(), **OTLP, export_process=False).if_process_fails is None


def test_the_plan_that_reuses_the_applications_exporter_carries_the_one_made_without_it():
    plan = _plan(_env(MODE_APP, APP_OTLP))
    assert plan.app_exporter and plan.export.kind == APP_OTLP
    without = plan.without_app_exporter()
    assert not without.app_exporter and without.route == ROUTE_APPLICATION
    with pytest.raises(ValueError, match="application's exporter settings"):
        _plan(_env(), **OTLP).without_app_exporter()


SETTINGS = {
    "mode": [(MODE_OURS, None), (MODE_APP, APP_OTLP), (MODE_APP, None), (MODE_FOREIGN, None)],
    "exporter": [{}, OTLP, {"exporter": "console"}, {"exporter": "none"}],
    "export_process": [True, False],
    "trace_export": ["own", "application"],
    "sampling": [{}, {"sample_ratio": 0.1}, "sdk drops"],
    "metrics": [{}, {"metrics_exporter": "otlp"}],
    "console": [True, False],
}


def test_every_combination_users_can_set_gives_a_consistent_plan_with_a_reason_each():
    seen = set()
    for combo in itertools.product(*SETTINGS.values()):
        (mode, app), exporter, process, trace_export, sampling, metrics, console = combo
        options = dict(exporter, export_process=process, trace_export=trace_export,
                       console=console, **metrics,
                       **(sampling if isinstance(sampling, dict) else {}))
        plan = _plan(_env(mode, app, drops=sampling == "sdk drops"), **options)
        seen.add(plan.route)
        topics = [r.split(":")[0] for r in plan.reasons]
        for topic in ("export target", "route", "tail sampling", "derived metrics",
                      "console report", "metrics over OTLP"):
            assert topic in topics, (combo, plan.reasons)
        # The tail sampler runs only where our export takes the spans.
        assert not plan.tail_sampler or plan.route in (ROUTE_PROCESS, ROUTE_STAGE), combo
        # The metrics move only to a running exporter process with nothing keeping them.
        if plan.metrics_where == THERE:
            assert plan.route == ROUTE_PROCESS and not plan.otlp_metrics, combo
            assert not plan.joins_application and process, combo
        # The application's provider is joined only in its mode.
        assert not plan.joins_application or mode == MODE_APP, combo
        assert plan.provider_mode == mode
    assert seen == {ROUTE_PROCESS, ROUTE_STAGE, ROUTE_APPLICATION, ROUTE_NONE}


def test_the_plan_reads_like_a_plan():
    text = _plan(_env(), **dict(OTLP, sample_ratio=0.25)).describe()
    assert text.splitlines()[0] == "route: exporter process"
    assert "tail sampling: on" in text and "keeps 25% of ordinary steps" in text


@pytest.mark.parametrize(("options", "env", "reader"), [
    (OTLP, _env(), "exporter process"),
    (dict(OTLP, sample_ratio=0.1), _env(), "exporter process"),  # the tail sampler there
    (dict(OTLP, export_process=False), _env(), "span worker"),
    (dict(OTLP, metrics_in_export_process=False), _env(), "span worker"),
    (OTLP, _env(drops=True), "span worker"),  # the SDK sampler drops steps: metrics here
])
def test_the_plan_says_who_reads_the_step_ring(options, env, reader):
    from otel_train.pipeline.plan import step_ring_in_exporter

    plan = _plan(env, step_ring="on", **options)
    said = [r for r in plan.reasons if r.startswith("step ring:")]
    assert len(said) == 1 and f"read by the {reader}" in said[0]
    assert step_ring_in_exporter(plan.route, plan.metrics_where) == (
        reader == "exporter process")
    assert plan.step_ring == reader
    off = _plan(env, step_ring="off", **options)
    assert off.step_ring is None and not [r for r in off.reasons if r.startswith("step ring:")]


@pytest.mark.parametrize(("options", "env", "reader"), [
    (OTLP, _env(), "exporter process"),
    (dict(OTLP, sample_ratio=0.1), _env(), "exporter process"),
    (dict(OTLP, export_process=False), _env(), None),
    (dict(OTLP, metrics_in_export_process=False), _env(), None),
    (OTLP, _env(drops=True), None),
])
def test_the_default_step_ring_is_on_only_where_the_exporter_process_reads_it(
        options, env, reader):
    plan = _plan(env, **options)  # step_ring="auto", the default
    said = [r for r in plan.reasons if r.startswith("step ring:")]
    assert plan.step_ring == reader and len(said) == 1 and "step_ring=auto" in said[0]
    if reader is None:
        assert "off, steps are queued" in said[0] and "costs no less than the queue" in said[0]
    else:
        assert "read by the exporter process" in said[0]
        # The fallback when the exporter process cannot start queues every step.
        assert plan.if_process_fails.step_ring is None


def test_step_ring_names_its_choices_when_it_is_set_wrong():
    with pytest.raises(ValueError, match="step_ring.*auto, on, off"):
        RunOptions.resolve(environ={}, step_ring="yes")
