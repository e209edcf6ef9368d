"""The bootstrap of ``otel-train compare``: a resample's median drawn from order statistics
follows the same law as the median of a plain resample, and 2000 resamples of two 10k-step
runs take well under a second."""

from __future__ import annotations

import random
import statistics
import time

import pytest

from otel_train.rundir.compare_stats import (
    median,
    median_ratio_interval,
    percentile,
    resampled_median,
)


def test_median_and_percentile_of_sorted_values():
    assert median([1.0, 2.0, 10.0]) == 2.0
    assert median([1.0, 2.0, 4.0, 10.0]) == 3.0
    assert percentile([0.0, 10.0], 0.25) == 2.5
    with pytest.raises(ValueError):
        median([])


@pytest.mark.parametrize("n", [9, 10])
def test_a_drawn_median_has_the_law_of_a_plain_resample_median(n):
    values = sorted(random.Random(1).lognormvariate(0, 1) for _ in range(n))
    draws = 20000
    rng = random.Random(2)
    drawn = sorted(resampled_median(values, rng) for _ in range(draws))
    plain = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(draws))
    for p in (0.025, 0.1, 0.25, 0.5, 0.75, 0.9, 0.975):
        # Both are discrete on the same few values: equal quantiles, give or take a neighbour.
        a, b = percentile(drawn, p), percentile(plain, p)
        assert abs(a - b) <= 0.35 * (values[-1] - values[0]) / n * 4, (p, a, b)
    # The two laws put the same mass on each value (total variation distance small).
    support = sorted(set(drawn) | set(plain))
    tv = sum(abs(drawn.count(v) - plain.count(v)) for v in support) / (2 * draws)
    assert tv < 0.03, tv


def test_the_interval_holds_the_true_ratio_and_narrows_with_more_steps():
    rng = random.Random(3)
    widths = []
    for n in (100, 2000):
        a = sorted(rng.gauss(10.0, 1.0) for _ in range(n))
        b = sorted(rng.gauss(12.0, 1.0) for _ in range(n))
        low, high = median_ratio_interval(a, b, resamples=1000, rng=rng)
        assert low < 1.2 < high
        widths.append(high - low)
    assert widths[1] < widths[0] / 3


def test_a_zero_median_has_no_interval():
    assert median_ratio_interval([0.0, 0.0, 0.0], [1.0, 1.0, 1.0], 10, random.Random(0)) is None


def test_2000_resamples_of_two_10k_step_runs_take_under_a_second():
    rng = random.Random(4)
    a = sorted(rng.lognormvariate(0, 0.2) for _ in range(10000))
    b = sorted(rng.lognormvariate(0.1, 0.2) for _ in range(10000))
    started = time.perf_counter()
    median_ratio_interval(a, b, resamples=2000, rng=rng)
    seconds = time.perf_counter() - started
    print(f"bootstrap of the median ratio, 2 x 10k steps, 2000 resamples: {seconds * 1e3:.1f} ms")
    assert seconds < 1.0
