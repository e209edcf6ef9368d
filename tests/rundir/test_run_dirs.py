"""Which run ``otel-train report``, ``export`` and ``costs`` read: a run directory as itself,
or the runs root's latest run (named on stderr); an input with nothing to read is refused
with a message and an exit status of 1, and nothing is written."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from train_helpers import clean_env, start_in_process_run  # noqa: F401

from otel_train.cli.main import main


def _run(run_dir: Path, steps: int) -> None:
    with start_in_process_run(run_dir, spans_path=None, run_id=run_dir.name) as run:
        for step in run.steps(range(steps), loader="train"):
            with step.phase("forward"):
                pass


def _runs_root(tmp_path: Path) -> Path:
    """A runs root with two runs: 'older' (3 steps, its files an hour old) and 'newer' (5).

    By name 'older' sorts last, so only the files' times can make 'newer' the latest."""
    root = tmp_path / "otel-train-runs"
    _run(root / "older", 3)
    _run(root / "newer", 5)
    an_hour_ago = time.time() - 3600
    for f in (root / "older").iterdir():
        os.utime(f, (an_hour_ago, an_hour_ago))
    (root / "prometheus-targets").mkdir(exist_ok=True)  # in every runs root; not a run
    return root


def _step_events(trace: Path) -> list[dict]:
    doc = json.loads(trace.read_text())
    return [e for e in doc["traceEvents"] if e.get("cat") == "step"]


def test_each_command_reads_the_latest_run_under_the_runs_root_and_names_it(tmp_path, capsys):
    root = _runs_root(tmp_path)
    newer, older = root / "newer", root / "older"
    for command in ("report", "export", "costs"):
        assert main([command, str(root)]) == 0, command
        out, err = capsys.readouterr()
        assert f"otel-train {command}: latest run under {root}: {newer}" in err
        if command == "costs":
            assert "run newer rank 0: 5 steps" in out
    assert len(_step_events(newer / "trace.json")) == 5
    assert (newer / "report.html").exists()
    assert not (older / "trace.json").exists() and not (older / "report.html").exists()


def test_a_run_directory_is_read_as_itself(tmp_path, capsys):
    root = _runs_root(tmp_path)
    assert main(["export", str(root / "older")]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(root / "older" / "trace.json") and "latest run" not in err
    assert len(_step_events(root / "older" / "trace.json")) == 3


@pytest.mark.parametrize("command, wanted", [
    ("report", "no span files (spans*.jsonl*)"), ("export", "no span files (spans*.jsonl*)"),
    ("costs", "no monitoring_costs*.json")])
def test_an_empty_directory_is_refused_with_a_message(tmp_path, capsys, command, wanted):
    (tmp_path / "some-dir").mkdir()  # a directory under it, without a run's files
    assert main([command, str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"otel-train {command}: {wanted} in {tmp_path} nor in a run directory under it" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["some-dir"]  # nothing written


@pytest.mark.parametrize("command", ["report", "export"])
def test_span_files_that_hold_no_span_are_refused_and_nothing_is_written(tmp_path, capsys,
                                                                         command):
    (tmp_path / "spans.jsonl").write_text('{"resourceSpans":[{"resou')  # a torn first line
    assert main([command, str(tmp_path)]) == 1
    assert f"otel-train {command}: the span files of {tmp_path} hold no span yet" in (
        capsys.readouterr().err)
    assert [p.name for p in tmp_path.iterdir()] == ["spans.jsonl"]


@pytest.mark.parametrize("command", ["report", "export", "costs"])
def test_a_path_that_does_not_exist_is_refused(tmp_path, capsys, command):
    assert main([command, str(tmp_path / "nope")]) == 1
    assert f"otel-train {command}: {tmp_path / 'nope'} does not exist" in capsys.readouterr().err
