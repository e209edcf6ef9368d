"""Numbers as people read them: durations, percents, SI prefixes, bytes. The one place
otel-train's console, costs table, report, compare and CLI turn a number into text.

Each reader has its own established look (the costs table writes ``12.3ms``, the report
``12.3 ms``, the slow-step lines ``0.012 s``), and those strings are what users and tests
read, so a duration is formatted by a *style*: the ladder of units it steps down, each with
its number format. The styles are data, below; the formatting is :func:`duration`.

Usage::

    duration(0.0123, COSTS_TABLE)        # '12.3ms'
    duration(0.0123, REPORT_TABLE)       # '12.3 ms'
    percent(0.0512, ".2f")               # '5.12%'
    percent_of(3, 40)                    # '7.5%'
    si(41234.5)                          # '41.2k'
    f"{bytes_to_gib(peak):.1f} GiB"
"""

from __future__ import annotations

from typing import Any, NamedTuple

BYTES_PER_MIB = 1024 ** 2
BYTES_PER_GIB = 1024 ** 3
_SI_PREFIXES = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_FLOOR = float("-inf")


class DurationStyle(NamedTuple):
    """How a duration in seconds reads: ``ladder`` rows ``(at_least_seconds, factor,
    format)``, largest first, the first row whose bound the value reaches formats it (the
    last row's bound is -inf); ``zero``, when set, is the format 0 gets (times the factor of
    the row it names), so 0 reads in a chosen unit rather than the smallest."""

    ladder: tuple[tuple[float, float, str], ...]
    zero: tuple[float, str] | None = None


# The costs table (``run.costs()``, ``otel-train costs``): compact, no space.
COSTS_TABLE = DurationStyle(((100.0, 1.0, "{:.0f}s"), (1.0, 1.0, "{:.2f}s"),
                             (0.001, 1e3, "{:.1f}ms"), (_FLOOR, 1e6, "{:.0f}µs")),
                            zero=(1e3, "{:.1f}ms"))
# The HTML report's tables: seconds to 1 ms, else milliseconds to 0.1 ms.
REPORT_TABLE = DurationStyle(((1.0, 1.0, "{:.3f} s"), (_FLOOR, 1e3, "{:.1f} ms")))
# The slow-step explanations: seconds to 1 ms; a tiny median in us or ns, never 0.000 s.
SLOW_STEP = DurationStyle(((0.001, 1.0, "{:.3f} s"), (1e-6, 1e6, "{:.0f} us"),
                           (_FLOOR, 1e9, "{:.0f} ns")), zero=(1.0, "{:.3f} s"))
# ``otel-train compare``: three significant-looking figures, ASCII units.
COMPARE = DurationStyle(((1.0, 1.0, "{:.2f} s"), (1e-3, 1e3, "{:.2f} ms"),
                         (_FLOOR, 1e6, "{:.0f} us")))
# ``otel-train compare``'s change of a phase's time (its sign written apart).
COMPARE_DELTA = DurationStyle(((1e-3, 1e3, "{:.2f} ms"), (1e-6, 1e6, "{:.0f} us"),
                               (_FLOOR, 1e9, "{:.0f} ns")))
# The report's chart labels: three significant figures, as people write them.
CHART = DurationStyle(((1.0, 1.0, "{:.3g} s"), (1e-3, 1e3, "{:.3g} ms"),
                       (_FLOOR, 1e6, "{:.3g} µs")))


def duration(seconds: Any, style: DurationStyle, missing: str = "-") -> str:
    """``seconds`` in ``style``; ``missing`` for None."""
    if seconds is None:
        return missing
    value = float(seconds)
    if value == 0 and style.zero is not None:
        factor, fmt = style.zero
        return fmt.format(value * factor)
    for at_least, factor, fmt in style.ladder:
        if value >= at_least or at_least == _FLOOR:  # the last row takes the rest (NaN too)
            return fmt.format(value * factor if factor != 1.0 else value)
    raise ValueError("a duration style's last row must start at -inf")


def percent(ratio: Any, spec: str = ".1f", missing: str = "-") -> str:
    """A ratio (0..1) as a percent, ``spec`` its number format (``.2f``, ``.3g``, ``+.1f``);
    ``missing`` for None."""
    if ratio is None:
        return missing
    return f"{float(ratio) * 100:{spec}}%"


def percent_of(part: float, total: float, spec: str = ".1f", missing: str = "-") -> str:
    """``part`` as a percent of ``total``; ``missing`` when the total is 0."""
    return f"{100.0 * part / total:{spec}}%" if total else missing


def si(value: float, suffix: str = "") -> str:
    """41234.5 -> '41.2k' (k, M, G, T), one decimal; ``suffix`` after the prefix."""
    for scale, prefix in _SI_PREFIXES:
        if value >= scale:
            return f"{value / scale:.1f}{prefix}{suffix}"
    return f"{value:.1f}{suffix}"


def bytes_to_gib(n_bytes: float) -> float:
    return n_bytes / BYTES_PER_GIB


def bytes_to_mib(n_bytes: float) -> float:
    return n_bytes / BYTES_PER_MIB
