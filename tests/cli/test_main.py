"""The ``otel-train`` command as a user meets it: every flag says what it does, and
``export`` writes a Chrome trace without being told the format."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from train_helpers import clean_env, start_in_process_run  # noqa: F401

from otel_train.cli.main import build_parser, main

REPO = Path(__file__).resolve().parents[2]


def _parsers(parser: argparse.ArgumentParser, name: str,
             ) -> list[tuple[str, argparse.ArgumentParser]]:
    """The parser and every subcommand's parser under it, with their command lines."""
    found = [(name, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                found += _parsers(sub, f"{name} {sub_name}")
    return found


def _otel_train(*args: str) -> subprocess.CompletedProcess:
    """The real command: ``python -m otel_train.cli ARGS``, without the caller's OTEL_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "otel_train.cli", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_every_flag_and_subcommand_of_every_subcommand_has_help():
    missing = []
    for name, parser in _parsers(build_parser(), "otel-train"):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"{name} {a.dest}" for a in action._choices_actions if not a.help]
            elif not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def test_export_without_a_format_writes_a_chrome_trace(tmp_path):
    with start_in_process_run(tmp_path, spans_path=None) as run:
        for step in run.steps(range(3), loader="train"):
            with step.phase("forward"):
                pass
    done = _otel_train("export", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "trace.json")
    doc = json.loads((tmp_path / "trace.json").read_text())
    steps = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "step"]
    assert sorted(e["args"]["step"] for e in steps) == [0, 1, 2]


def test_the_command_exits_non_zero_on_a_directory_with_nothing_to_read(tmp_path):
    done = _otel_train("report", str(tmp_path))
    assert done.returncode == 1
    assert f"no span files (spans*.jsonl*) in {tmp_path}" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_command_alone_prints_the_list_of_commands(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "usage: otel-train" in out and "commands:" in out
    for command in ("demo", "plan", "costs", "report", "export", "stalls", "compare",
                    "version"):
        assert re.search(rf"^\s+{command}\s+\S", out, re.M), command
    assert "required" not in out
