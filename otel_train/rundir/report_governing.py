"""The report's governing table: each ``step.due`` operation's interval in force and its
changes, from a costs file's ``governing`` block (derived/governor.py, recording/schedule.py).

Usage::

    governing_html(costs)   # "" when no operation was scheduled with step.due
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any


def governing_html(costs: Mapping[str, Any]) -> str:
    """A heading line and a table of the intervals; a list of the changes."""
    block = costs.get("governing") or {}
    ops = block.get("operations") or {}
    if not ops:
        return ""
    if block.get("governing"):
        head = "Governing (budget_action=govern): the intervals in force"
    elif block.get("fallback"):
        head = ("Governing fell back to the asked intervals: "
                f"{html.escape(str(block['fallback']))}")
    else:
        head = "step.due intervals (budget_action=report: as asked)"
    rows = "".join(
        f"<tr data-operation='{html.escape(str(name))}'><td>{html.escape(str(name))}</td>"
        f"<td class='asked'>{int(op['asked_every'])}</td>"
        f"<td class='interval'>{int(op['interval_steps'])}</td>"
        f"<td>{int(op['min_every'])}..{int(op['max_every'])}</td>"
        f"<td>{int(op['changes'])}</td></tr>" for name, op in ops.items())
    out = [f"<p>{head}:</p><table class='governing'><tr><th>operation</th><th>asked every</th>"
           f"<th>interval in force</th><th>bounds</th><th>changes</th></tr>{rows}</table>"]
    changes = block.get("changes") or []
    if changes:
        items = "".join(
            f"<li>step {int(c['step'])}: {html.escape(str(c['operation']))} every "
            f"{int(c['from'])} -&gt; {int(c['to'])} steps (it cost "
            f"{float(c['share_at_previous_interval']):.1%} of training time)</li>"
            for c in changes)
        out.append(f"<ul class='governing-changes'>{items}</ul>")
    return "".join(out)
