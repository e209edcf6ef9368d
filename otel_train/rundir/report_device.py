"""The report's device-time section: where the accelerator's time went, from the spans.

On an accelerator the default timing (``device_sync`` ``monitor_sync``) leaves training phases
unsynchronized: their spans are the host's time (a kernel launched in ``forward`` is paid for
where the host next waits), and one step in ``device_events_every_steps`` carries the device
time measured by events. This section puts the two side by side per phase, over the sampled
steps, and says how the run's spans were timed (``train.device.timing``). Monitoring spans are
synchronized at their start and end, so their host time is their device time. On CPU no span
carries device time and the section is left out.

Usage::

    device_section(load_run(run_dir))   # "" on a CPU run
"""

from __future__ import annotations

import html

from otel_train.rundir.report_data import RunData
from otel_train.rundir.report_tables import html_table

_TIMING_WORDS = {
    "sync": "synchronized at start and end (host time = device time)",
    "events": "host clock, with device time from events (sampled steps)",
    "host": "host clock only",
}


def device_section(data: RunData) -> str:
    """The device-time table, or "" when no span was timed on an accelerator."""
    timing = data.device_timing
    if not data.device_phases and set(timing) <= {"host"}:
        return ""
    total = sum(timing.values()) or 1
    how = "; ".join(f"{n} span(s) ({n / total:.0%}) {html.escape(_TIMING_WORDS.get(t, t))}"
                    for t, n in sorted(timing.items(), key=lambda kv: -kv[1]))
    out = [f"<p>How the phases were timed: {how}.</p>"]
    if not data.device_phases:
        out.append("<p class='note'>No span carries device time from events: choose "
                   "<code>device_sync=\"monitor_sync\"</code> or <code>\"events\"</code> for "
                   "it.</p>")
        return "".join(out)
    rows = []
    for (label, kind), (n, host, device) in sorted(
            data.device_phases.items(), key=lambda kv: -kv[1][2]):
        ratio = f"{device / host:.2f}x" if host > 0 else ""
        rows.append([html.escape(label), kind, f"{int(n)}", f"{host / n * 1e3:.3f} ms",
                     f"{device / n * 1e3:.3f} ms", ratio])
    out.append(html_table(["phase", "kind", "sampled spans", "host time per span",
                           "device time per span", "device / host"], rows, "device"))
    out.append("<p class='note'>Device time is the stream's time between a phase's start "
               "and end events on the sampled steps. A training phase whose device time "
               "exceeds its host time had kernels still running when the host moved on: the "
               "host paid for them later, where it next waited.</p>")
    return "".join(out)
