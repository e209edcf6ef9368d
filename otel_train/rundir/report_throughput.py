"""The report's throughput: tokens (or samples) per second over the run, and MFU.

Read from the steps' root attributes ``train.tokens``, ``train.samples`` and ``train.mfu``
(docs/telemetry.md). Per bucket of steps: the counted steps' tokens over those steps' time
(summed over ranks, so the figure is per rank); the run's figure is the same over all
buckets, and the per-run rate is that times the ranks.

Usage::

    add_throughput(bucket, step_seconds, root_attributes)   # while reading (report_data.py)
    html = throughput_section(page, buckets, ranks=2)        # report.py
"""

from __future__ import annotations

from typing import Any

from otel_train.common.units import si


def add_throughput(bucket: Any, seconds: float, attrs: dict[str, Any]) -> None:
    """Fold one step's counts into its bucket."""
    tokens, samples = attrs.get("train.tokens"), attrs.get("train.samples")
    if tokens is None and samples is None:
        return
    bucket.tokens += float(tokens or 0)
    bucket.samples += float(samples or 0)
    bucket.counted_seconds += seconds
    mfu = attrs.get("train.mfu")
    if mfu is not None:
        bucket.mfu_sum += float(mfu)
        bucket.mfu_n += 1


def throughput_figure(buckets: list[Any], unit: str) -> dict[str, Any]:
    """Tokens (or samples) per second per rank over the steps; MFU on the right axis."""
    x = [b.first for b in buckets]
    field = "tokens" if unit == "tokens" else "samples"
    traces: list[dict[str, Any]] = [
        {"type": "scatter", "mode": "lines", "x": x, "name": f"{unit}/s per rank",
         "y": [getattr(b, field) / b.counted_seconds if b.counted_seconds else None
               for b in buckets]}]
    if any(b.mfu_n for b in buckets):
        traces.append({"type": "scatter", "mode": "lines", "x": x, "name": "MFU",
                       "yaxis": "y2", "line": {"dash": "dot"},
                       "y": [b.mfu_sum / b.mfu_n if b.mfu_n else None for b in buckets]})
    return {"data": traces, "layout": {
        "height": 300, "xaxis": {"title": {"text": "step"}},
        "yaxis": {"title": {"text": f"{unit}/s"}, "rangemode": "tozero"},
        "yaxis2": {"title": {"text": "MFU"}, "overlaying": "y", "side": "right",
                   "tickformat": ".0%", "rangemode": "tozero"}}}


def throughput_section(page: Any, buckets: list[Any], ranks: int) -> str:
    """The section's body: the run's figure and the chart (or why there is none)."""
    counted = [b for b in buckets if b.counted_seconds]
    if not counted:
        return ("<p class='empty'>No step was counted: give <code>tokens_per_step=</code> "
                "or <code>samples_per_step=</code>, or call <code>step.count(...)</code> "
                "(docs/telemetry.md, Throughput).</p>")
    seconds = sum(b.counted_seconds for b in counted)
    tokens = sum(b.tokens for b in counted)
    unit = "tokens" if tokens else "samples"
    total = tokens if tokens else sum(b.samples for b in counted)
    rate = total / seconds
    mfu_n = sum(b.mfu_n for b in counted)
    mfu = f", MFU {sum(b.mfu_sum for b in counted) / mfu_n:.1%}" if mfu_n else ""
    per_run = f" ({si(rate * ranks)} {unit}/s for the run's {ranks} ranks)" if ranks > 1 \
        else ""
    # Whole steps, as the console's rate counts them: the monitoring inside a step is in its
    # time. The job's time by part (goodput) counts that monitoring apart, as evaluation.
    figure = (f"<p class='figure' id='throughput-figure'><b>{si(rate)} {unit}/s</b> per rank"
              f"{per_run}{mfu}: {si(total)} {unit} in {seconds:.1f} s of steps (whole "
              "steps, the monitoring inside them included; the job's time by part counts "
              "that monitoring apart, as evaluation).</p>")
    return figure + page.chart("fig-throughput", throughput_figure(buckets, unit)) + (
        "<p class='note'>Each point: the counted steps' "
        f"{unit} over their time, per rank; MFU (dotted) is the steps' own "
        "<code>train.mfu</code>, achieved FLOP/s over the device's peak.</p>")
