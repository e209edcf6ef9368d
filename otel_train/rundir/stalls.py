"""What a run's ``stalls/`` folder says: where each rank's training thread was, by collective.

Each stacks file (derived/stall_stacks.py) names its rank, step, reason and training thread
in its header; the training thread's innermost ``torch/distributed`` frame is the collective
it was inside (``all_reduce``, ``barrier``...). A rank with no such frame was not in any
collective: its innermost frame says where it was instead. ``otel-train stalls RUN_DIR``
prints it; the report's "Stalls" section shows the same lines.

Usage::

    files = read_stall_files(Path("otel-train-runs/r1"))
    print("\\n".join(summary_lines(files)))
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path

from otel_train.derived.stall_stacks import (
    FLIGHT_RECORDER_SUFFIX,
    PENDING_PREFIX,
    ThreadStack,
    thread_stack,
)

_HEADER = re.compile(r"^# otel-train stalls: step (\d+), rank (\d+) of (\d+)", re.M)
_REASON = re.compile(r"^# reason: (.*)$", re.M)
_THREAD = re.compile(r"^# training thread: (0x[0-9a-fA-F]+)", re.M)
_DIST = "torch/distributed/"
_DIST_SKIP = ("wrapper", "_")  # decorators and private helpers around the public call


@dataclass
class StallFile:
    """One stacks file: whose, why, and where its training thread was."""

    path: Path
    rank: int
    step: int
    reason: str
    where: str  # the training thread's innermost frame ('?' when it is not in the dump)
    collective: str | None  # the torch.distributed call it was inside, if any
    flight_recorder: Path | None = None

    def describe(self) -> str:
        """'inside all_reduce (file:line)' or 'in no collective: at file:line function'."""
        if self.collective is not None:
            return f"inside torch.distributed {self.collective} (at {self.where})"
        return f"in no collective: at {self.where}"


def collective_of(stack: ThreadStack) -> str | None:
    """The innermost public torch.distributed function on the stack, or None."""
    for path, _line, func in stack.frames:
        if _DIST in path.replace("\\", "/") and not func.startswith(_DIST_SKIP):
            return func
    return None


def read_stall_file(path: Path) -> StallFile | None:
    """A stacks file read back; None when it has no otel-train header."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    head = _HEADER.search(text)
    tid = _THREAD.search(text)
    if head is None or tid is None:
        return None
    reason = _REASON.search(text)
    stack = thread_stack(text, int(tid.group(1), 16))
    if path.name.startswith(PENDING_PREFIX):
        if stack is None:
            return None  # armed, never fired
        why = "written by the timer; the watchdog never ran again (the process hung?)"
    else:
        why = reason.group(1) if reason else "?"
    fr = path.with_name(path.stem + FLIGHT_RECORDER_SUFFIX)
    return StallFile(path, int(head.group(2)), int(head.group(1)), why,
                     stack.innermost() if stack is not None else "?",
                     collective_of(stack) if stack is not None else None,
                     fr if fr.exists() else None)


def read_stall_files(run_dir: Path) -> list[StallFile]:
    """Every stacks file of the run, by rank then time."""
    folder = Path(run_dir) / "stalls"
    if not folder.is_dir():
        return []
    found = [read_stall_file(p) for p in sorted(folder.glob("*.txt"))]
    files = [f for f in found if f is not None]
    return sorted(files, key=lambda f: (f.rank, f.path.name))


def summary_lines(files: list[StallFile]) -> list[str]:
    """Per rank: each file and where its training thread was; then who was in which collective."""
    lines: list[str] = []
    for f in files:
        lines.append(f"rank {f.rank}, step {f.step}: {f.path.name} ({f.reason})")
        lines.append(f"    training thread {f.describe()}")
        if f.flight_recorder is not None:
            lines.append(f"    flight recorder: {f.flight_recorder.name}")
    latest: dict[int, StallFile] = {}
    for f in files:
        latest[f.rank] = f  # by name: the last file of each rank
    if len(latest) > 1:
        lines.append("last stacks of each rank:")
        inside = [f for f in latest.values() if f.collective is not None]
        outside = [f for f in latest.values() if f.collective is None]
        for f in inside:
            lines.append(f"  rank {f.rank} entered {f.collective} (step {f.step})")
        for f in outside:
            lines.append(f"  rank {f.rank} never entered a collective: at {f.where} "
                         f"(step {f.step})")
    return lines


def report_section(run_dir: Path) -> str:
    """The report's "Stalls" section body ('' when the run has no stacks files)."""
    files = read_stall_files(run_dir)
    if not files:
        return ""
    text = "\n".join(summary_lines(files))
    return (f"<p>{len(files)} stacks file(s) in <code>stalls/</code> "
            "(<code>otel-train stalls RUN_DIR</code> prints this).</p>"
            f"<pre>{html.escape(text)}</pre>")


def print_stalls(run_dir: Path) -> int:
    """``otel-train stalls``: the summary on stdout; 1 when there are no stacks files."""
    files = read_stall_files(run_dir)
    if not files:
        print(f"no stall stacks in {Path(run_dir) / 'stalls'}")
        return 1
    print(f"stall stacks in {Path(run_dir) / 'stalls'}:")
    for line in summary_lines(files):
        print(f"  {line}")
    return 0
