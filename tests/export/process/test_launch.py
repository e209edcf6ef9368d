"""The exporter process starts niced (``export_process_nice``): when it and the training
threads want the same core, training goes first."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from train_helpers import clean_env, start_test_run  # noqa: F401  (clean_env: autouse)

pytestmark = pytest.mark.timeout(60)


def _nice(pid: int) -> int:
    """The niceness of process ``pid`` (field 19 of /proc/<pid>/stat)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("nice", [None, 0, 5])
def test_the_exporter_process_runs_at_the_niceness_asked_for(tmp_path: Path,
                                                             nice: int | None) -> None:
    options = {} if nice is None else {"export_process_nice": nice}
    run = start_test_run(tmp_path, **options)
    try:
        pid = run._telemetry.export.pid
        assert run.flush(timeout_seconds=20)  # the child is up (past its boot line)
        own = os.getpriority(os.PRIO_PROCESS, 0)
        assert _nice(pid) == min(19, own + (10 if nice is None else nice))
        assert os.getpriority(os.PRIO_PROCESS, 0) == own  # the training process is untouched
    finally:
        run.shutdown(timeout=10)


@pytest.mark.parametrize("bad", [-1, 20, 2.5, "high"])
def test_a_niceness_outside_0_to_19_is_refused_naming_the_option(tmp_path: Path, bad) -> None:
    with pytest.raises(ValueError, match="export_process_nice"):
        start_test_run(tmp_path, export_process_nice=bad)
