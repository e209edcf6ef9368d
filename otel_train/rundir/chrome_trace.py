"""``otel-train export RUN_DIR`` (``--format chrome-trace``, the default): the run as a
Trace Event Format file.

Perfetto (ui.perfetto.dev) and chrome://tracing open it, as they open the traces the PyTorch
profiler writes, so training steps can sit next to a ``torch.profiler`` trace. Each rank is
one process (``pid`` = rank, named "rank N") with one thread track ("training steps") that
holds every step as a complete event (``ph: "X"``) with its phases nested inside by time,
and monitoring between steps on the same track. Timestamps are microseconds since the Unix
epoch (the spans' own clock), so ranks line up with each other, rounded to the 0.25 us a
reader's double keeps at that size (every boundary alike, so phases stay nested). The file
is written as the span files are read: memory stays flat on any run length. Summary spans
(``span_mode="summary"``) go on a second track ("summaries"), each a slice over its steps
with its figures in ``args``, and as counters: the step's p50/p99 and each phase's mean
(rundir/summaries.py). A run whose
span files hold no span is refused by the command rather than written as an empty trace.

Usage::

    path = export_chrome_trace(Path("otel-train-runs/<run id>"))   # -> <run dir>/trace.json
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import IO, Any

from otel_train.rundir.run_dirs import NothingToRead
from otel_train.common.attributes import SUMMARY_SPAN_NAME
from otel_train.rundir.span_files import _iter_lines, iter_line_span_fields, span_files
from otel_train.rundir.summaries import read_summaries, summary_events

TRACE_NAME = "trace.json"
_TID = 1
_ARG_KEYS = {"train.step": "step", "train.phase.kind": "kind", "train.dataloader": "loader",
             "train.slow": "slow", "train.loss": "loss", "train.device.synced": "synced",
             "train.truncated": "truncated", "train.truncated.reason": "truncated_reason",
             "error": "error"}
_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _grid_ns(epoch_ns: int) -> int:
    """The finest step a reader's double keeps of epoch microseconds near ``epoch_ns``.

    ~1.8e15 us holds to 0.25 us (250 ns) in a double: finer digits are lost as the file is
    read, and lost unevenly (a phase could end after its step). Rounding every boundary to
    this grid instead keeps every order as it was, so phases stay nested in every viewer.
    """
    return max(1, round(math.ulp(epoch_ns / 1000.0) * 1000.0))


def _us(ns: int) -> str:
    return "%d.%03d" % divmod(ns, 1000)  # exact: no float in between


def _event(name: str, start: int, end: int, attrs: dict[str, Any], grid: int = 1
           ) -> tuple[int, str]:
    rank = int(attrs.get("train.rank", 0) or 0)
    args = {short: attrs[key] for key, short in _ARG_KEYS.items() if key in attrs}
    loader = args.get("loader")
    is_step = name == "train.step"
    if name == "data" and loader:
        name = f"data[{loader}]"
    cat = "step" if is_step else ("monitoring" if args.get("kind") == "monitor" else "phase")
    # Both ends rounded to the nearest grid point: rounding keeps a <= b, so nesting and
    # order survive, and ts + dur is exact in the reader's double.
    half = grid // 2
    start = (start + half) // grid * grid
    end = max(start, (end + half) // grid * grid)
    return rank, ('{"name":%s,"cat":"%s","ph":"X","pid":%d,"tid":%d,"ts":%s,"dur":%s,'
                  '"args":%s}' % (_dumps(name), cat, rank, _TID, _us(start), _us(end - start),
                                  _dumps(args)))


def _metadata(rank: int) -> list[dict[str, Any]]:
    return [{"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}},
            {"name": "process_sort_index", "ph": "M", "pid": rank,
             "args": {"sort_index": rank}},
            {"name": "thread_name", "ph": "M", "pid": rank, "tid": _TID,
             "args": {"name": "training steps"}}]


def write_chrome_trace(run_dir: str | os.PathLike[str], fh: IO[str]) -> dict[str, int]:
    """Write the Trace Event Format JSON of ``run_dir`` to ``fh``; return counts."""
    ranks: set[int] = set()
    events = summaries = 0
    fh.write('{"displayTimeUnit":"ms","otherData":{"source":"otel-train"},"traceEvents":[\n')
    sep = ""
    grid = 0
    for path in span_files(run_dir):
        for line in _iter_lines(path):
            if not line.strip():
                continue
            try:
                fields = list(iter_line_span_fields(line))
            except ValueError:
                continue  # a torn line (a run in progress, or a writer killed mid-line)
            for _sid, parent, name, start, end, attrs in fields:
                if name == SUMMARY_SPAN_NAME and not parent:
                    summaries += 1  # written after the steps, with all their attributes
                    continue
                if grid == 0:
                    grid = _grid_ns(start)  # one grid for the whole file: one rounding rule
                rank, event = _event(name, start, end, attrs, grid)
                if rank not in ranks:
                    ranks.add(rank)
                    for meta in _metadata(rank):
                        fh.write(sep + _dumps(meta))
                        sep = ",\n"
                fh.write(sep + event)
                sep = ",\n"
                events += 1
    if summaries:
        for event in summary_events(read_summaries(run_dir), grid or 1):
            if event["pid"] not in ranks:
                ranks.add(event["pid"])
                for meta in _metadata(event["pid"]):
                    fh.write(sep + _dumps(meta))
                    sep = ",\n"
            fh.write(sep + _dumps(event))
            sep = ",\n"
            events += 1
    fh.write("\n]}\n")
    return {"events": events, "ranks": len(ranks)}


def export_chrome_trace(run_dir: str | os.PathLike[str],
                        out: str | os.PathLike[str] | None = None,
                        allow_empty: bool = True) -> Path:
    """Write ``<run dir>/trace.json`` (or ``out``); return its path.

    With ``allow_empty=False``, span files that hold no span raise :class:`NothingToRead`
    and nothing is written.
    """
    target = Path(out) if out is not None else Path(run_dir) / TRACE_NAME
    tmp = target.with_name(f".{target.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        counts = write_chrome_trace(run_dir, fh)
    if not counts["events"] and not allow_empty:
        tmp.unlink()
        raise NothingToRead(f"the span files of {run_dir} hold no span yet")
    os.replace(tmp, target)
    return target
