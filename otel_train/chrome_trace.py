"""``otel-train export RUN_DIR --format chrome-trace``: the run as a Trace Event Format file.

Perfetto (ui.perfetto.dev) and chrome://tracing open it, as they open the traces the PyTorch
profiler writes, so training steps can sit next to a ``torch.profiler`` trace. Each rank is
one process (``pid`` = rank, named "rank N") with one thread track ("training steps") that
holds every step as a complete event (``ph: "X"``) with its phases nested inside by time,
and monitoring between steps on the same track. Timestamps are microseconds since the Unix
epoch (the spans' own clock), so ranks line up with each other. The file is written as the
span files are read: memory stays flat on any run length.

Usage::

    path = export_chrome_trace(Path("otel-train-runs/<run id>"))   # -> <run dir>/trace.json
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from otel_train.otlp_json_file import iter_span_dicts

TRACE_NAME = "trace.json"
_TID = 1
_ARG_KEYS = {"train.step": "step", "train.phase.kind": "kind", "train.dataloader": "loader",
             "train.slow": "slow", "train.loss": "loss", "train.device.synced": "synced"}


def _arg(value: dict[str, Any]) -> Any:
    for t in ("stringValue", "boolValue", "doubleValue"):
        if t in value:
            return value[t]
    if "intValue" in value:
        return int(value["intValue"])
    return None


def _event(span: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    args: dict[str, Any] = {}
    rank = 0
    for kv in span.get("attributes", ()):
        key = kv["key"]
        if key == "train.rank":
            rank = int(_arg(kv["value"]) or 0)
        elif key in _ARG_KEYS:
            args[_ARG_KEYS[key]] = _arg(kv["value"])
    start = int(span["startTimeUnixNano"])
    end = int(span["endTimeUnixNano"])
    name = span.get("name", "")
    if name == "data" and args.get("loader"):
        name = f"data[{args['loader']}]"
    kind = args.get("kind")
    cat = "step" if span.get("name") == "train.step" else (
        "monitoring" if kind == "monitor" else "phase")
    return rank, {"name": name, "cat": cat, "ph": "X", "pid": rank, "tid": _TID,
                  "ts": start / 1000.0, "dur": max(0, end - start) / 1000.0, "args": args}


def write_chrome_trace(run_dir: str | os.PathLike[str], fh: IO[str]) -> dict[str, int]:
    """Write the Trace Event Format JSON of ``run_dir`` to ``fh``; return counts."""
    ranks: set[int] = set()
    events = 0
    fh.write('{"displayTimeUnit":"ms","otherData":{"source":"otel-train"},"traceEvents":[\n')
    first = True
    for span in iter_span_dicts(run_dir):
        rank, event = _event(span)
        status = span.get("status", {}).get("code")
        if status == 2:
            event["args"]["error"] = span.get("status", {}).get("message", True)
        if rank not in ranks:
            ranks.add(rank)
            for meta in ({"name": "process_name", "ph": "M", "pid": rank,
                          "args": {"name": f"rank {rank}"}},
                         {"name": "process_sort_index", "ph": "M", "pid": rank,
                          "args": {"sort_index": rank}},
                         {"name": "thread_name", "ph": "M", "pid": rank, "tid": _TID,
                          "args": {"name": "training steps"}}):
                fh.write(("" if first else ",\n") + json.dumps(meta))
                first = False
        fh.write(("" if first else ",\n") + json.dumps(event, separators=(",", ":")))
        first = False
        events += 1
    fh.write("\n]}\n")
    return {"events": events, "ranks": len(ranks)}


def export_chrome_trace(run_dir: str | os.PathLike[str],
                        out: str | os.PathLike[str] | None = None) -> Path:
    """Write ``<run dir>/trace.json`` (or ``out``); return its path."""
    target = Path(out) if out is not None else Path(run_dir) / TRACE_NAME
    tmp = target.with_name(f".{target.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        write_chrome_trace(run_dir, fh)
    os.replace(tmp, target)
    return target
