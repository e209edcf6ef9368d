"""The end-of-run line about spans that were not delivered, in words.

``DropCounter`` counts by reason (``otel_train_spans_dropped_total{reason=...}``); a user
reading the console wants how many did not arrive, why, and where they were going:
"256 spans were not delivered to http://127.0.0.1:4318: 256 still queued at shutdown (the
collector there confirmed none of this run's spans...)". A malformed endpoint says so
instead.

Usage::

    line = dropped_summary({"shutdown_timeout": 256}, "http://127.0.0.1:4318", delivered=0)
    line = run_dropped_summary(drops.counts(), export_plan, export)   # at a run's end
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_train.common.otlp_endpoint import endpoint_problem
from otel_train.common.sdk_config import redact_url

# What each reason of otel_train_spans_dropped_total means for the spans it counts.
REASON_WORDS = {
    "shutdown_timeout": "still queued at shutdown",
    "export_failed": "refused by the collector or not delivered after retries",
    "export_queue_full": "dropped from a full export queue (the oldest first)",
    "record_queue_full": "dropped from a full step-record queue (the oldest first)",
    "build_error": "could not be made into spans",
    "step_ring_full": "dropped from a full step ring (the newest first)",
}


def dropped_summary(counts: Mapping[str, int], where: str | None = None,
                    delivered: int | None = None,
                    endpoint_problem: str | None = None) -> str | None:
    """One line: how many spans were not delivered, by reason in words (most first), and
    why when the run can tell (a malformed endpoint, a collector that took nothing); None
    when every span was delivered."""
    total = sum(n for n in counts.values() if n > 0)
    if total <= 0:
        return None
    parts = ", ".join(f"{n} {REASON_WORDS.get(reason, reason.replace('_', ' '))}"
                      for reason, n in sorted(counts.items(), key=lambda kv: -kv[1]) if n > 0)
    to = f" to {where}" if where else ""
    why = ""
    if endpoint_problem is not None:
        why = f" (the endpoint is not usable: {endpoint_problem})"
    elif delivered == 0 and where:
        why = (" (the collector there confirmed none of this run's spans: is it running, on "
               "that port?)")
    noun = "span was" if total == 1 else "spans were"
    return f"otel-train: {total} {noun} not delivered{to}: {parts}{why}"


def run_dropped_summary(counts: Mapping[str, int], plan: Any, export: Any) -> str | None:
    """:func:`dropped_summary` for a run: where its export plan sends (``ExportPlan``), what
    its export stage or exporter process client (``delivered``, else ``exported``) says
    arrived, and what is wrong with its endpoint, if anything."""
    where = problem = None
    kind = getattr(plan, "kind", None)
    endpoint = getattr(plan, "endpoint", None)
    if kind == "otlp" and endpoint:
        where = redact_url(endpoint)
        problem = endpoint_problem(endpoint, getattr(plan, "protocol", None) or "http/protobuf")
    elif kind == "jsonl" and getattr(plan, "path", None) is not None:
        where = str(plan.path)
    delivered = getattr(export, "delivered", None)
    if delivered is None:
        delivered = getattr(export, "exported", None)
    return dropped_summary(counts, where, delivered if isinstance(delivered, int) else None,
                           problem)
