"""``otel-train costs PATH``: a run's monitoring_costs.json read back and printed as a table.

PATH may be the file, a run directory, or the runs root (the latest run is picked and named:
``run_dirs.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from otel_train.derived.costs import format_costs_table
from otel_train.rundir.run_dirs import COSTS_FILES, costs_files, resolve_run_input


def print_costs(path: Path, as_json: bool = False) -> int:
    """``otel-train costs PATH``: print a costs file (or a run's, or the latest run's)."""
    if path.is_file():
        found = [path]
    else:
        run = resolve_run_input("costs", path, costs_files, COSTS_FILES)
        if run is None:
            return 1
        found = run.files
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
