"""The report's governing table: the intervals in force and each change, read from the
costs file of a governed run."""

from __future__ import annotations

from pathlib import Path

import pytest
from train_helpers import clean_env, start_in_process_run  # noqa: F401

from otel_train.rundir.report import write_report
from otel_train.rundir.report_governing import governing_html

pytestmark = pytest.mark.timeout(120)


def test_the_report_of_a_governed_run_shows_the_interval_in_force_and_the_change(
        tmp_path: Path) -> None:
    run = start_in_process_run(tmp_path, budget_action="govern")
    schedule = run._recorder.schedule
    for step in run.steps(range(200)):
        if step.index == 0:  # as the governor would: in force at plan step 25
            schedule.proposed = {"val_loss": (120, 0.15)}
        if step.due("val_loss", every=50):
            with step.monitor("val_loss"):
                pass
    run.shutdown()
    page = write_report(tmp_path).read_text()
    assert "Governing (budget_action=govern): the intervals in force" in page
    assert ("<tr data-operation='val_loss'><td>val_loss</td><td class='asked'>50</td>"
            "<td class='interval'>120</td><td>50..1000</td><td>1</td></tr>") in page
    assert "step 25: val_loss every 50 -&gt; 120 steps (it cost 15.0% of training time)" in page


def test_no_governing_table_without_step_due() -> None:
    assert governing_html({"operations": {}}) == ""
    assert governing_html({"governing": {"operations": {}}}) == ""
