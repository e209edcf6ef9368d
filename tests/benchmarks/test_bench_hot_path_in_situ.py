"""The in-situ hot-path benchmark runs end to end (smoke mode): for each workload, the hot
path timed inside the README's loop beside the run's warm and cold calibration."""

from __future__ import annotations

import re

import pytest
from bench_smoke import run_mlp_smoke


def test_the_smoke_run_prints_the_hot_path_in_situ_beside_the_calibrated_costs(tmp_path) -> None:
    out = run_mlp_smoke("bench_hot_path_in_situ.py", tmp_path)
    assert "== mlp: 2 blocks of 60 steps" in out, out
    m = re.search(r"in situ: (\d+\.\d\d) us per step, (\d+\.\d\d) spans -> (\d+\.\d\d) us per "
                  r"span", out)
    assert m, out
    per_step, spans = float(m.group(1)), float(m.group(2))
    # data, forward, backward, optimizer and the root; val_loss once in 50 steps.
    assert 5.0 <= spans <= 5.1, out
    assert per_step > 0, out
    c = re.search(r"warm (\d+\.\d\d) us per span, cold (\d+\.\d\d) us per span; charged per "
                  r"step: (\d+\.\d\d) us", out)
    assert c and float(c.group(2)) >= float(c.group(1)) > 0, out
    assert float(c.group(3)) == pytest.approx(spans * float(c.group(2)), rel=0.01), out
    assert not list(tmp_path.glob("bench-hot-path-in-situ-*")), "a run's temp dir is left"
