"""``otel-train compare RUN_A RUN_B``: the arguments, and the exit status a CI job reads.

Exit status: 0 compared; 1 ``--fail-if-slower`` found B slower by more than PCT (what, on
stderr); 2 nothing to compare (a missing directory, no span files, no steps, no steady step),
or ``--fail-if-slower`` asked of a run in summary mode (means only: ``compare_summary.py``),
the reason on stderr.

Usage::

    otel-train compare otel-train-runs/a otel-train-runs/b
    otel-train compare A B --fail-if-slower 10 --per-phase --format markdown
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def _rank(raw: str) -> int | None:
    if raw == "all":
        return None
    try:
        rank = int(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a rank number or 'all', not {raw!r}") from None
    if rank < 0:
        raise argparse.ArgumentTypeError(f"a rank is >= 0, not {rank}")
    return rank


def _non_negative(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number, not {raw!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {raw}")
    return value


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The compare subcommand's arguments."""
    from otel_train.rundir.compare_format import FORMATS

    run_help = "a run directory (otel-train-runs/<run id>), or a runs root (its latest run)"
    ap.add_argument("run_a", help="the baseline run: " + run_help)
    ap.add_argument("run_b", help="the run compared with it: " + run_help)
    ap.add_argument("--fail-if-slower", type=_non_negative, default=None, metavar="PCT",
                    help="exit 1 when B's step is slower than A's by more than PCT percent, "
                         "the 95%% interval's lower bound above it too")
    ap.add_argument("--per-phase", action="store_true",
                    help="with --fail-if-slower: any phase slower by more than PCT fails too")
    ap.add_argument("--format", default="text", choices=FORMATS,
                    help="text (default), json, or markdown (for a CI comment)")
    ap.add_argument("--rank", type=_rank, default=None, metavar="N|all",
                    help="compare one rank's steps; all (default): every rank pooled, plus a "
                         "line per rank when there are several")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the bootstrap (default 0: the same runs give the same output)")
    ap.add_argument("--resamples", type=int, default=2000,
                    help="bootstrap resamples (default 2000)")
    ap.add_argument("--min-change", type=_non_negative, default=2.0, metavar="PCT",
                    help="a change under PCT percent is within noise however sure it is "
                         "(default 2)")
    ap.add_argument("--warmup-steps", type=int, default=None, metavar="N",
                    help="leave out each rank's first N steps (default: the warm-up count in "
                         "each rank's monitoring_costs.json, else 5, the option's default)")


def run_compare(args: argparse.Namespace) -> int:
    """Read both runs, print the comparison; the exit status the module docstring gives."""
    from otel_train.rundir.compare import CompareError, CompareSettings, compare_runs, failures
    from otel_train.rundir.compare_format import format_comparison
    from otel_train.rundir.compare_read import read_run_steps
    from otel_train.rundir.compare_summary import has_summaries
    from otel_train.rundir.run_dirs import SPAN_FILES, resolve_run_input
    from otel_train.rundir.span_files import span_files

    if args.resamples < 1 or (args.warmup_steps is not None and args.warmup_steps < 0):
        print("otel-train compare: --resamples must be >= 1 and --warmup-steps >= 0",
              file=sys.stderr)
        return 2
    runs = []
    for raw in (args.run_a, args.run_b):
        found = resolve_run_input("compare", Path(raw), span_files, SPAN_FILES)
        if found is None:
            return 2
        runs.append(read_run_steps(found.run_dir))
    if any(has_summaries(run) for run in runs):
        return _compare_summaries(runs, args)
    settings = CompareSettings(rank=args.rank, resamples=args.resamples, seed=args.seed,
                               min_change=args.min_change / 100.0,
                               warmup_steps=args.warmup_steps)
    try:
        result = compare_runs(runs[0], runs[1], settings)
    except CompareError as exc:
        print(f"otel-train compare: {exc}", file=sys.stderr)
        return 2
    print(format_comparison(result, args.format))
    if result.same_run is not None and args.format != "text":  # text says it in its lines
        print(f"otel-train compare: A and B are one run ({result.same_run})", file=sys.stderr)
    if args.fail_if_slower is None:
        return 0
    failed = failures(result, args.fail_if_slower, args.per_phase)
    for line in failed:
        print(f"otel-train compare: slower than allowed: {line}", file=sys.stderr)
    return 1 if failed else 0


def _compare_summaries(runs: list[Any], args: argparse.Namespace) -> int:
    """A run in summary mode: means without an interval; --fail-if-slower cannot judge."""
    from otel_train.rundir.compare_summary import compare_means, format_means

    rows = compare_means(runs[0], runs[1], args.rank)
    if not rows:
        print("otel-train compare: the runs have no step or phase in common to compare "
              "(summary mode)", file=sys.stderr)
        return 2
    print(format_means(rows, runs[0], runs[1], args.format))
    if args.fail_if_slower is not None:
        print("otel-train compare: --fail-if-slower needs per-step spans in both runs: a "
              "summary-mode run gives means without an interval to judge by", file=sys.stderr)
        return 2
    return 0
