"""Which run a command reads: a run directory, or the latest run under the runs root.

``otel-train report``, ``export`` and ``costs`` take a run directory
(``otel-train-runs/<run id>``) or the runs root (``otel-train-runs``): a directory with none
of the files the command reads, but run directories that hold them, stands for its latest
run (the one whose files were written last), named on stderr so the user knows which run
they are looking at. An input with nothing to read is refused here, before anything is
written: an empty report or trace would look like a run that did nothing.

Usage::

    found = resolve_run_input("report", Path("otel-train-runs"), span_files, SPAN_FILES)
    if found is None: return 1          # the reason is on stderr
    found.run_dir, found.files          # the run picked and the files it holds
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

SPAN_FILES = "span files (spans*.jsonl*)"
COSTS_FILES = "monitoring_costs*.json"


class NothingToRead(ValueError):
    """A run's files hold nothing the command could show (no span yet, say)."""


@dataclass(frozen=True)
class RunInput:
    """The files a command reads, the directory holding them, and whether it was picked."""

    files: list[Path]
    run_dir: Path
    latest_under: Path | None = None  # the runs root, when its latest run was picked


def costs_files(run_dir: Path) -> list[Path]:
    """A run directory's monitoring_costs*.json (one per rank)."""
    return sorted(run_dir.glob("monitoring_costs*.json"))


def find_run_input(path: Path, files_in: Callable[[Path], list[Path]]) -> RunInput | None:
    """The files ``files_in`` finds at ``path`` (a run directory), or in the run directory
    under ``path`` whose files were written last (``path`` is the runs root); None if none."""
    found = files_in(path)
    if found:
        return RunInput(found, path)
    runs: list[tuple[float, str, Path, list[Path]]] = []
    for child in path.iterdir():
        if child.is_dir():
            files = files_in(child)
            if files:
                runs.append((max(_mtime(f) for f in files), child.name, child, files))
    if not runs:
        return None
    _, _, run_dir, files = max(runs, key=lambda r: (r[0], r[1]))
    return RunInput(files, run_dir, latest_under=path)


def resolve_run_input(command: str, path: Path, files_in: Callable[[Path], list[Path]],
                      wanted: str) -> RunInput | None:
    """:func:`find_run_input`, saying on stderr which run was picked, or why none was."""
    if not path.is_dir():
        problem = "is not a directory" if path.exists() else "does not exist"
        print(f"otel-train {command}: {path} {problem} (pass a run directory, "
              "otel-train-runs/<run id>, or the runs root, otel-train-runs)", file=sys.stderr)
        return None
    found = find_run_input(path, files_in)
    if found is None:
        hint = (" (a run that sent its spans to a collector keeps none: they are in the "
                "collector)" if wanted == SPAN_FILES else "")
        print(f"otel-train {command}: no {wanted} in {path} nor in a run directory under it"
              + hint, file=sys.stderr)
        return None
    if found.latest_under is not None:
        print(f"otel-train {command}: latest run under {path}: {found.run_dir}",
              file=sys.stderr)
    return found


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0  # removed while we looked (the span file cap): oldest
