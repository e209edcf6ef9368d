"""Medians and a bootstrap 95% interval for the ratio of two runs' medians, in pure Python.

The bootstrap resamples each run's steps with replacement and takes the ratio of the two
resamples' medians, ``resamples`` times; the interval is the 2.5th and 97.5th percentile of
those ratios (the percentile bootstrap). Drawing ``n`` values to find one median would cost
``n`` random numbers per resample (2000 resamples of 10k steps: seconds in Python), so the
median of a resample is drawn directly instead, exactly: a resample picks indices
``floor(n * U_i)`` into the sorted values with ``U_i`` uniform on [0, 1), and the ``m``-th
smallest of ``n`` uniforms follows Beta(m, n - m + 1). Its index is the index of the
resample's ``m``-th smallest value. For an even ``n`` the next order statistic is the
smallest of the ``n - m`` uniforms above the first, ``U_(m) + (1 - U_(m)) * Beta(1, n - m)``.
One sort per run and at most two beta draws per resample: 2000 resamples of two 10k-step runs
take well under a second (``tests/rundir/test_compare_stats.py`` checks the draw against plain
resampling and prints the time; docs/compare.md gives the figure).

Usage::

    a, b = sorted(a_seconds), sorted(b_seconds)
    ratio = median(b) / median(a)
    low, high = median_ratio_interval(a, b, resamples=2000, rng=random.Random(0))
"""

from __future__ import annotations

import random
from collections.abc import Sequence


def median(sorted_values: Sequence[float]) -> float:
    """The median of values already sorted (the mean of the middle two for an even count)."""
    n = len(sorted_values)
    if n == 0:
        raise ValueError("the median of no values")
    mid = n // 2
    if n % 2:
        return float(sorted_values[mid])
    return (sorted_values[mid - 1] + sorted_values[mid]) / 2.0


def resampled_median(sorted_values: Sequence[float], rng: random.Random) -> float:
    """The median of one bootstrap resample of ``sorted_values``, drawn without resampling."""
    n = len(sorted_values)
    if n == 1:
        return float(sorted_values[0])
    last = n - 1
    if n % 2:
        m = (n + 1) // 2
        return float(sorted_values[min(last, int(n * rng.betavariate(m, n - m + 1)))])
    m = n // 2
    low = rng.betavariate(m, n - m + 1)
    high = low + (1.0 - low) * rng.betavariate(1, n - m)
    return (sorted_values[min(last, int(n * low))]
            + sorted_values[min(last, int(n * high))]) / 2.0


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """The ``p`` (0..1) percentile of sorted values, linearly interpolated."""
    if not sorted_values:
        raise ValueError("the percentile of no values")
    pos = p * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def median_ratio_interval(a_sorted: Sequence[float], b_sorted: Sequence[float],
                          resamples: int, rng: random.Random,
                          confidence: float = 0.95) -> tuple[float, float] | None:
    """The bootstrap interval of median(B) / median(A); None when a resample's A median is
    not positive (a phase that took no time: no ratio)."""
    ratios = []
    for _ in range(resamples):
        a = resampled_median(a_sorted, rng)
        if a <= 0:
            return None
        ratios.append(resampled_median(b_sorted, rng) / a)
    ratios.sort()
    tail = (1.0 - confidence) / 2.0
    return percentile(ratios, tail), percentile(ratios, 1.0 - tail)
