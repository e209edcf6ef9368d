"""The on-CPU interference estimate: a slope only where the data show one, its charge."""

from __future__ import annotations

import math
import random

import pytest

from otel_train.common.cpu_interference import CpuInterferenceRegression


def _fed(slope_ns: float, noise_ns: float, points: int = 300, seed: int = 1,
         busy: list[float] | None = None) -> CpuInterferenceRegression:
    rng = random.Random(seed)
    reg = CpuInterferenceRegression()
    for i in range(points):
        x = busy[i % len(busy)] if busy else rng.random() * 0.6
        reg.add(x, 550_000 + slope_ns * x + rng.gauss(0, noise_ns), 90)
    return reg


def test_a_planted_slope_is_recovered_and_charged_over_the_busy_steps() -> None:
    reg = _fed(slope_ns=150_000, noise_ns=20_000)
    assert reg.slope_ns() == pytest.approx(150_000, rel=0.1)
    assert reg.charge_ns() == pytest.approx(reg.slope_ns() * reg.busy_steps)
    assert reg.charge_ns(10.0) == pytest.approx(reg.slope_ns() * 10.0)


def test_cpu_that_does_not_move_with_the_background_charges_nothing() -> None:
    charged = [_fed(slope_ns=0, noise_ns=30_000, seed=s).charge_ns() for s in range(20)]
    # a slope below its standard error is not taken: most seeds charge exactly zero
    assert sum(1 for c in charged if c == 0.0) >= 14


def test_a_background_that_never_varies_tells_nothing() -> None:
    assert _fed(slope_ns=150_000, noise_ns=0, busy=[0.3]).slope_ns() is None


def test_too_few_intervals_tell_nothing() -> None:
    assert _fed(slope_ns=150_000, noise_ns=0, points=10).slope_ns() is None


def test_cpu_that_falls_while_the_background_runs_charges_nothing() -> None:
    assert _fed(slope_ns=-150_000, noise_ns=1_000).charge_ns() == 0.0


def test_the_slope_never_exceeds_the_steps_own_cpu() -> None:
    reg = CpuInterferenceRegression(min_points=2)
    for x, y in [(0.0, 1_000.0), (0.01, 100_000.0)] * 20:
        reg.add(x, y, 1)
    assert reg.slope_ns() is not None and reg.slope_ns() <= 100_000.0


def test_intervals_without_steps_or_with_nan_are_ignored() -> None:
    reg = CpuInterferenceRegression()
    reg.add(0.5, 1.0, 0)
    reg.add(float("nan"), 1.0, 5)
    assert reg.points == 0


def test_intervals_left_out_of_the_line_are_still_charged() -> None:
    reg = _fed(slope_ns=150_000, noise_ns=20_000)
    before = reg.busy_steps
    reg.add(0.9, 5_000_000.0, 10, fit=False)  # an evaluation's interval: off the line
    assert reg.points == 300 and reg.busy_steps == pytest.approx(before + 9.0)
    assert reg.slope_ns() == pytest.approx(150_000, rel=0.1)


def test_the_machines_slow_drift_does_not_hide_the_slope() -> None:
    # The host's speed wanders (AR(1): ~100 us of a 550 us step, tenths of seconds to
    # seconds), several times the background's effect: a line through the intervals'
    # levels is off by ~20%, the one through consecutive intervals' differences is not.
    rng = random.Random(3)
    reg = CpuInterferenceRegression()
    drift = 0.0
    for _ in range(400):
        drift = 0.98 * drift + rng.gauss(0, 20_000)
        x = rng.random() * 0.6
        reg.add(x, 550_000 + drift + 150_000 * x + rng.gauss(0, 10_000), 90)
    assert reg.slope_ns() == pytest.approx(150_000, rel=0.1)
