"""RunOptions: defaults, precedence (argument > OTEL_TRAIN_* > default), validation messages."""

from __future__ import annotations

import dataclasses

import pytest
from train_helpers import clean_env  # noqa: F401  (autouse fixture)

import otel_train
from otel_train.common.options import DEFAULT, RunOptions

pytestmark = pytest.mark.timeout(30)


def test_defaults_apply_when_nothing_is_given():
    opts = RunOptions.resolve(environ={})
    assert opts.budget == 0.05
    assert opts.critical == 0.10
    assert opts.device_sync == "auto"
    assert opts.console is True
    assert opts.prometheus_port is DEFAULT
    assert opts.prometheus_host == "127.0.0.1"
    assert opts.service_name is None and opts.run_id is None
    assert opts.exporter is None and opts.otlp_endpoint is None
    assert opts.max_queued_steps == 4096 and opts.max_queued_spans == 16384
    assert opts.shutdown_timeout_seconds == 2.0
    assert opts.rank is None and opts.world_size is None
    assert dict(opts.sources) == {}


def test_environment_overrides_defaults_and_records_its_source():
    env = {"OTEL_TRAIN_BUDGET": "0.02", "OTEL_TRAIN_CONSOLE": "false",
           "OTEL_TRAIN_SERVICE_NAME": "from-env", "OTEL_TRAIN_MAX_QUEUED_STEPS": "7",
           "OTEL_TRAIN_SLOW_STEP_SECONDS": "1.5", "OTEL_TRAIN_DEVICE_SYNC": "off"}
    opts = RunOptions.resolve(environ=env)
    assert opts.budget == 0.02
    assert opts.console is False
    assert opts.service_name == "from-env"
    assert opts.max_queued_steps == 7
    assert opts.slow_step_seconds == 1.5
    assert opts.device_sync == "off"
    assert opts.sources["budget"] == "OTEL_TRAIN_BUDGET"


def test_keyword_arguments_beat_the_environment():
    env = {"OTEL_TRAIN_BUDGET": "0.02", "OTEL_TRAIN_SERVICE_NAME": "from-env"}
    opts = RunOptions.resolve(environ=env, budget=0.03, service_name="from-arg")
    assert opts.budget == 0.03
    assert opts.service_name == "from-arg"
    assert opts.sources["budget"] == "argument"


def test_resolve_reads_os_environ_when_no_mapping_is_passed(monkeypatch):
    monkeypatch.setenv("OTEL_TRAIN_CRITICAL", "0.2")
    assert RunOptions.resolve().critical == 0.2


@pytest.mark.parametrize("value", [0, 1, 2, -0.1, float("nan"), True, "0.05"])
def test_budget_outside_zero_one_is_rejected_naming_option_and_rule(value):
    with pytest.raises(ValueError) as exc:
        RunOptions.resolve(environ={}, budget=value)
    assert "'budget'" in str(exc.value)
    assert "between 0 and 1" in str(exc.value)


def test_critical_not_above_budget_is_rejected_naming_both():
    with pytest.raises(ValueError) as exc:
        RunOptions.resolve(environ={}, budget=0.1, critical=0.1)
    msg = str(exc.value)
    assert "'critical'" in msg and "'budget'" in msg and "greater than" in msg
    with pytest.raises(ValueError, match="'critical'"):
        RunOptions.resolve(environ={}, budget=0.2)  # default critical 0.10 < 0.2


def test_unknown_device_sync_is_rejected_listing_the_choices():
    with pytest.raises(ValueError) as exc:
        RunOptions.resolve(environ={}, device_sync="events-maybe")
    msg = str(exc.value)
    assert "'device_sync'" in msg
    assert "auto" in msg and "sync" in msg and "off" in msg


@pytest.mark.parametrize("port", [-1, 70000, True, 1.5, "9464"])
def test_bad_prometheus_port_is_rejected(port):
    with pytest.raises(ValueError) as exc:
        RunOptions.resolve(environ={}, prometheus_port=port)
    assert "'prometheus_port'" in str(exc.value)
    assert "None (off), 0 (a free port) or 1..65535" in str(exc.value)


@pytest.mark.parametrize("port", [None, 0, 1, 65535])
def test_valid_prometheus_ports_are_accepted(port):
    assert RunOptions.resolve(environ={}, prometheus_port=port).prometheus_port == port


@pytest.mark.parametrize("raw,expected", [("none", None), ("None", None), ("off", None),
                                          ("0", 0), ("9500", 9500)])
def test_prometheus_port_from_env(raw, expected):
    opts = RunOptions.resolve(environ={"OTEL_TRAIN_PROMETHEUS_PORT": raw})
    assert opts.prometheus_port == expected


def test_prometheus_port_env_auto_means_default():
    opts = RunOptions.resolve(environ={"OTEL_TRAIN_PROMETHEUS_PORT": "auto"})
    assert opts.prometheus_port is DEFAULT


def test_unknown_option_name_is_rejected_naming_it():
    with pytest.raises(ValueError) as exc:
        RunOptions.resolve(environ={}, budjet=0.05)
    assert "budjet" in str(exc.value)
    assert "known options" in str(exc.value)


@pytest.mark.parametrize("var,raw", [("OTEL_TRAIN_BUDGET", "five percent"),
                                     ("OTEL_TRAIN_CONSOLE", "maybe"),
                                     ("OTEL_TRAIN_PROMETHEUS_PORT", "http"),
                                     ("OTEL_TRAIN_MAX_QUEUED_STEPS", "1e3x")])
def test_unparsable_env_value_names_the_variable(var, raw):
    with pytest.raises(ValueError) as exc:
        RunOptions.resolve(environ={var: raw})
    msg = str(exc.value)
    assert var in msg
    assert repr(raw) in msg
    assert "cannot be read as" in msg


def test_env_value_breaking_a_rule_names_the_variable():
    with pytest.raises(ValueError) as exc:
        RunOptions.resolve(environ={"OTEL_TRAIN_BUDGET": "2"})
    assert "OTEL_TRAIN_BUDGET" in str(exc.value)
    assert "between 0 and 1" in str(exc.value)


@pytest.mark.parametrize("kwargs,name", [
    ({"max_queued_steps": 0}, "max_queued_steps"),
    ({"log_every": True}, "log_every"),
    ({"console_min_interval_seconds": -1}, "console_min_interval_seconds"),
    ({"console_min_interval_seconds": float("inf")}, "console_min_interval_seconds"),
    ({"shutdown_timeout_seconds": 0}, "shutdown_timeout_seconds"),
    ({"export_interval_seconds": float("inf")}, "export_interval_seconds"),
    ({"slow_step_factor": 1.0}, "slow_step_factor"),
    ({"exporter": "zipkin"}, "exporter"),
    ({"otlp_protocol": "http/json"}, "otlp_protocol"),
    ({"service_name": "  "}, "service_name"),
    ({"console": "yes"}, "console"),
    ({"rank": -1}, "rank"),
    ({"world_size": 0}, "world_size"),
    ({"rank": 2, "world_size": 2}, "rank"),
    ({"warmup_steps": -1}, "warmup_steps"),
    ({"warmup_steps": 2.5}, "warmup_steps"),
    ({"console_breakdown_min_share": 1.5}, "console_breakdown_min_share"),
    ({"console_breakdown_min_share": "5%"}, "console_breakdown_min_share"),
    ({"eval_operations": "val_loss"}, "eval_operations"),
    ({"eval_operations": ["val_loss", ""]}, "eval_operations"),
])
def test_other_bad_options_are_rejected_naming_the_option(kwargs, name):
    with pytest.raises(ValueError, match=repr(name)):
        RunOptions.resolve(environ={}, **kwargs)


def test_start_run_rejects_a_bad_budget_before_starting_anything(tmp_path):
    with pytest.raises(ValueError, match="'budget'"):
        otel_train.start_run(budget=2, prometheus_port=None, console=False,
                             status_dir=str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_exporter_none_from_env_means_no_export():
    opts = RunOptions.resolve(environ={"OTEL_TRAIN_EXPORTER": "none"})
    assert opts.exporter == "none"


def test_signal_options_have_defaults_and_read_their_environment():
    opts = RunOptions.resolve(environ={})
    assert opts.warmup_steps == 5
    assert opts.console_breakdown_min_share == 0.05
    assert opts.eval_operations == ()
    assert opts.slow_step_factor == 2.5
    env = {"OTEL_TRAIN_WARMUP_STEPS": "0", "OTEL_TRAIN_CONSOLE_BREAKDOWN_MIN_SHARE": "0.2",
           "OTEL_TRAIN_EVAL_OPERATIONS": " inference, val_loss ,"}
    opts = RunOptions.resolve(environ=env)
    assert opts.warmup_steps == 0
    assert opts.console_breakdown_min_share == 0.2
    assert opts.eval_operations == ("inference", "val_loss")
    assert RunOptions.resolve(environ={}, eval_operations=["x"]).eval_operations == ("x",)
    with pytest.raises(ValueError, match="OTEL_TRAIN_WARMUP_STEPS"):
        RunOptions.resolve(environ={"OTEL_TRAIN_WARMUP_STEPS": "five"})


def test_every_option_is_read_from_the_environment_by_its_type():
    from otel_train.common.options import _ENV_KINDS
    names = {f.name for f in dataclasses.fields(RunOptions)} - {"sources"}
    assert set(_ENV_KINDS) == names  # derived from the annotations: none can be forgotten
    opts = RunOptions.resolve(environ={"OTEL_TRAIN_DEVICE_SYNC": "Events",
                                       "OTEL_TRAIN_PROMETHEUS_HOST": "0.0.0.0"})
    assert opts.device_sync == "events" and opts.prometheus_host == "0.0.0.0"


def test_budget_action_is_report_or_govern_and_read_from_the_environment() -> None:
    assert RunOptions.resolve().budget_action == "report"
    assert RunOptions.resolve(environ={"OTEL_TRAIN_BUDGET_ACTION": "Govern"}).budget_action == (
        "govern")
    with pytest.raises(ValueError, match="'budget_action'='always': must be 'report' or 'govern'"):
        RunOptions.resolve(budget_action="always")
