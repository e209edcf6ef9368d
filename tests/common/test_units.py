"""common/units.py: every duration, percent and SI string the console, costs table, report
and compare print, formatted in one place. The reference functions below are the formatters
each module had of its own; the styles must print exactly what they printed."""

from __future__ import annotations

import math

import pytest

from otel_train.common import units
from otel_train.common.units import (
    CHART,
    COMPARE,
    COMPARE_DELTA,
    COSTS_TABLE,
    REPORT_TABLE,
    SLOW_STEP,
    duration,
    percent,
    percent_of,
    si,
)

SECONDS = [0.0, -0.0, 1e-10, 3.1e-7, 1e-6, 9.99e-7, 4.2e-5, 0.000999, 0.001, 0.0012345, 0.0125,
           0.5, 0.9996, 0.99996, 1.0, 1.23456, 12.5, 99.99, 100.0, 1234.5, -0.002, -3.0,
           math.inf, math.nan]


def _costs_secs(v):
    if v is None:
        return "-"
    v = float(v)
    if v >= 100:
        return f"{v:.0f}s"
    if v >= 1:
        return f"{v:.2f}s"
    if v >= 0.001 or v == 0:
        return f"{v * 1000:.1f}ms"
    return f"{v * 1e6:.0f}µs"


def _report_secs(v):
    if v is None:
        return "-"
    v = float(v)
    if v >= 1.0:
        return f"{v:.3f} s"
    return f"{v * 1000:.1f} ms"


def _slow_seconds(value):
    if value >= 0.001 or value == 0:
        return f"{value:.3f} s"
    return f"{value * 1e6:.0f} us" if value >= 1e-6 else f"{value * 1e9:.0f} ns"


def _compare_seconds(seconds):
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} us"


def _chart_duration(seconds):
    if seconds >= 1.0:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def _delta(seconds):
    sign = "+" if seconds >= 0 else "-"
    seconds = abs(seconds)
    if seconds >= 1e-3:
        return f"{sign}{seconds * 1e3:.2f} ms"
    if seconds >= 1e-6:
        return f"{sign}{seconds * 1e6:.0f} us"
    return f"{sign}{seconds * 1e9:.0f} ns"


def _si(value):
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            return f"{value / scale:.1f}{suffix}"
    return f"{value:.1f}"


@pytest.mark.parametrize("style, reference", [
    (COSTS_TABLE, _costs_secs), (REPORT_TABLE, _report_secs), (SLOW_STEP, _slow_seconds),
    (COMPARE, _compare_seconds), (CHART, _chart_duration)])
def test_each_duration_style_prints_what_its_module_printed(style, reference):
    for seconds in SECONDS:
        assert duration(seconds, style) == reference(seconds), seconds


def test_a_missing_duration_reads_as_a_dash():
    assert duration(None, COSTS_TABLE) == duration(None, REPORT_TABLE) == "-"


def test_a_change_in_time_reads_with_its_sign():
    for seconds in SECONDS:
        sign = "+" if seconds >= 0 else "-"
        assert sign + duration(abs(seconds), COMPARE_DELTA) == _delta(seconds), seconds


def test_percents_print_what_each_module_printed():
    for ratio in (0.0, 0.0512345, 0.05, 0.025, 0.1, 1.0, 0.999999, 1.5, math.nan):
        assert percent(ratio, ".2f") == f"{float(ratio) * 100:.2f}%"       # costs, report
        assert percent(ratio) == f"{ratio * 100:.1f}%"                      # compare
        assert percent(ratio, ".3g") == f"{ratio * 100:.3g}%"               # budget
    assert percent(None) == "-"
    for part, total in ((3, 40), (0, 7), (7, 7), (1, 3), (5, 0)):
        console = f"{100.0 * part / total:.1f}%" if total else "-"
        slow = f"{100.0 * part / total:5.1f}%" if total else "    -"
        assert percent_of(part, total) == console
        assert percent_of(part, total, "5.1f", "    -") == slow


def test_si_prefixes_print_what_the_console_and_the_report_printed():
    for value in (0.0, 12.34, 999.95, 1000.0, 41234.5, 2.5e6, 7.1e9, 3e12, 4.2e15):
        assert si(value) == _si(value)
    assert si(41234.5, " tok/s") == "41.2k tok/s"


def test_compare_names_a_rate_with_the_prefix_the_console_uses():
    """compare's rates stopped at G ('2000.0G/s') where the console and the report say
    '2.0T': one ladder now."""
    from otel_train.derived.throughput import si as console_si
    from otel_train.rundir.compare_format import _rate_text

    assert _rate_text(2e12) == console_si(2e12) + "/s" == "2.0T/s"
    assert _rate_text(41234.5) == "41.2k/s"


def test_bytes_convert_in_binary_units():
    assert units.bytes_to_gib(3 * 1024 ** 3) == 3.0
    assert units.bytes_to_mib(512 * 1024) == 0.5


def test_no_module_keeps_a_formatter_of_its_own():
    """The formatters these modules had are the units module's now."""
    from pathlib import Path

    package = Path(units.__file__).resolve().parents[1]
    patterns = ('for scale, suffix in ((1e12, "T")', "* 1e6:.0f}µs", "* 1e3:.3g} ms",
                "* 1e6:.0f} us", "* 1000:.1f} ms", "* 100:.2f}%")
    found = [f"{p.relative_to(package.parent)}: {pat}" for p in sorted(package.rglob("*.py"))
             if p.name != "units.py" for pat in patterns if pat in p.read_text()]
    assert found == []
