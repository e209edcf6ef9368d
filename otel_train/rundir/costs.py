"""``otel-train costs PATH``: a run's monitoring_costs.json read back and printed as a table.

PATH may be the file, a run directory, or the runs root (the latest run is picked and named).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from otel_train.derived.costs import format_costs_table


def find_costs_files(path: Path) -> tuple[list[Path], Path | None]:
    """The costs files at ``path``: a file, a run directory, or the runs root.

    For a runs root (no costs file of its own, run directories with one inside), the run
    whose costs were written last; the second value names that run directory (else None).
    """
    if not path.is_dir():
        return [path], None
    found = sorted(path.glob("monitoring_costs*.json"))
    if found:
        return found, None
    runs: list[tuple[float, Path, list[Path]]] = []
    for child in path.iterdir():
        if child.is_dir():
            files = sorted(child.glob("monitoring_costs*.json"))
            if files:
                newest = max(_mtime(f) for f in files)
                runs.append((newest, child, files))
    if not runs:
        return [], None
    _, run_dir, files = max(runs, key=lambda r: (r[0], r[1].name))
    return files, run_dir


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def print_costs(path: Path, as_json: bool = False) -> int:
    """``otel-train costs PATH``: print a costs file (or a run's, or the latest run's)."""
    found, picked = find_costs_files(path)
    if not found:
        print(f"otel-train costs: no monitoring_costs*.json in {path} nor in a run directory "
              "under it", file=sys.stderr)
        return 1
    if picked is not None:
        print(f"otel-train costs: latest run under {path}: {picked}", file=sys.stderr)
    status = 0
    for n, p in enumerate(found):
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            print(f"otel-train costs: cannot read {p}: {exc}", file=sys.stderr)
            status = 1
            continue
        if n:
            print()
        print(json.dumps(data, indent=2) if as_json else format_costs_table(data))
    return status
