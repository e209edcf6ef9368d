"""``otel-train compare`` as a command: a run compared with itself is flagged in every
format (text in its lines, JSON and Markdown on stderr too), and still exits 0; --fail-if-
slower and the exit statuses are tested with the rows in tests/rundir/test_compare.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sleep_runs import sleep_steps
from train_helpers import clean_env, start_in_process_run  # noqa: F401

from otel_train.cli.main import main


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli-compare") / "a"
    with start_in_process_run(path, spans_path=None) as run:
        sleep_steps(run, 4, 30)
    return path


@pytest.mark.parametrize("fmt", ["json", "markdown"])
def test_a_run_compared_with_itself_is_said_on_stderr_in_json_and_markdown(run_dir, capsys,
                                                                           fmt):
    code = main(["compare", str(run_dir), str(run_dir), "--format", fmt])
    out, err = capsys.readouterr()
    assert code == 0
    assert err.strip().endswith("otel-train compare: A and B are one run (the same directory)")
    if fmt == "json":
        assert json.loads(out)["same_run"] == "the same directory"
    else:
        assert out.startswith("**otel-train compare**: A and B are one run (the same "
                              "directory): a run compared with itself shows no change; ")
        assert "- warning: A and B are one run (the same directory): compare two runs" in out


def test_in_text_the_warning_is_in_the_output_and_not_repeated_on_stderr(run_dir, capsys):
    code = main(["compare", str(run_dir), str(run_dir)])
    out, err = capsys.readouterr()
    assert code == 0 and "one run" not in err
    assert "warning: A and B are one run (the same directory): compare two runs" in out
