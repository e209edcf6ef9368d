"""The ``otel-train`` command.

Usage::

    otel-train demo [--steps 300] [--eval-every 50]   # train a tiny GPT, instrumented
    otel-train demo --device cpu                  # auto (default): the GPU when present
    otel-train demo --serve                       # ... and keep /metrics up until Ctrl-C
    otel-train costs otel-train-runs/<run>/       # monitoring_costs.json as a readable table
    otel-train report otel-train-runs/<run>/      # one self-contained HTML page, opens offline
    otel-train export otel-train-runs/<run>/      # trace.json (Chrome trace) for Perfetto
    otel-train report                             # costs, report, export without a run
                                                  # directory: the latest run under
                                                  # otel-train-runs/ (named on stderr)
    otel-train stalls otel-train-runs/<run>/      # each rank's stall stacks: which collective
    otel-train compare RUN_A RUN_B                # is B slower than A, where, how sure
    otel-train plan [--exporter otlp ...]         # what a run started here would do, and why
    otel-train version                            # and whether the hot path runs in C
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from otel_train import __version__


def _port(raw: str | None) -> Any:
    if raw is None:
        return None
    if raw.strip().lower() in ("none", "off"):
        return "off"
    try:
        return int(raw)
    except ValueError:
        raise SystemExit(f"otel-train: --prometheus-port {raw!r}: a number, 0, or 'none'") from None


def _demo(args: argparse.Namespace) -> int:
    from otel_train.cli.demo import run_demo

    options: dict[str, Any] = {}
    port = _port(args.prometheus_port)
    if port == "off":
        options["prometheus_port"] = None
    elif port is not None:
        options["prometheus_port"] = port
    if args.status_dir:
        options["status_dir"] = args.status_dir
    if args.quiet:
        options["console"] = False
    if args.no_report:
        options["report"] = False
    try:
        run_demo(steps=args.steps, eval_every=args.eval_every, seed=args.seed,
                 serve=args.serve, plant_slowdown=args.plant_slowdown, device=args.device,
                 **options)
    except ValueError as exc:  # a bad option or a taken port: say it plainly
        print(f"otel-train demo: {exc}", file=sys.stderr)
        return 2
    return 0


def _costs(args: argparse.Namespace) -> int:
    from pathlib import Path

    from otel_train.rundir.costs import print_costs

    return print_costs(Path(args.path), as_json=args.json)


def _report(args: argparse.Namespace) -> int:
    from otel_train.rundir.report import write_report

    return _write_from_span_files("report", write_report, args)


def _export(args: argparse.Namespace) -> int:
    from otel_train.rundir.chrome_trace import export_chrome_trace

    return _write_from_span_files("export", export_chrome_trace, args)


def _write_from_span_files(command: str, write: Any, args: argparse.Namespace) -> int:
    """Resolve the run (a run directory or the runs root), write, print the path; 1 when
    there is nothing to read."""
    from pathlib import Path

    from otel_train.rundir.run_dirs import SPAN_FILES, NothingToRead, resolve_run_input
    from otel_train.rundir.span_files import span_files

    run = resolve_run_input(command, Path(args.run_dir), span_files, SPAN_FILES)
    if run is None:
        return 1
    try:
        path = write(run.run_dir, out=args.output, allow_empty=False)
    except NothingToRead as exc:
        print(f"otel-train {command}: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


def _stalls(args: argparse.Namespace) -> int:
    from pathlib import Path

    from otel_train.rundir.run_dirs import resolve_run_input
    from otel_train.rundir.stalls import print_stalls

    def stall_files(run_dir: Path) -> list[Path]:
        return sorted((run_dir / "stalls").glob("*.txt"))

    run = resolve_run_input("stalls", Path(args.run_dir), stall_files, "stalls/ files")
    if run is None:
        return 1
    return print_stalls(run.run_dir)


def _version(args: argparse.Namespace) -> int:
    from otel_train.recording.recorder import HOT_PATH

    print(__version__)
    print(f"hot path: {HOT_PATH}")
    return 0


_RUN_DIR_HELP = ("a run directory (otel-train-runs/<run id>), or the runs root (the latest "
                 "run there, named on stderr; default: otel-train-runs)")


def build_parser() -> argparse.ArgumentParser:
    """The ``otel-train`` argument parser, every subcommand and flag with its help."""
    from otel_train.cli.compare import add_arguments as add_compare_arguments
    from otel_train.cli.compare import run_compare
    from otel_train.cli.demo import add_arguments
    from otel_train.cli.plan import add_arguments as add_plan_arguments
    from otel_train.cli.plan import print_plan

    ap = argparse.ArgumentParser(prog="otel-train", description=(
        "Every PyTorch training step as an OpenTelemetry trace; monitoring overhead as "
        "Prometheus metrics."))
    # Not required: ``otel-train`` alone prints the commands (main), not a usage error.
    sub = ap.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    demo = sub.add_parser("demo", help="train a tiny GPT with otel-train (on the "
                          "accelerator when present; --device cpu for the CPU)")
    add_arguments(demo)
    demo.set_defaults(func=_demo)
    costs = sub.add_parser("costs", help="print a monitoring_costs.json (or a run "
                           "directory's, or the latest run's) as a readable table")
    costs.add_argument("path", nargs="?", default="otel-train-runs",
                       help="monitoring_costs.json, its run directory, or the runs root (the "
                            "latest run there; default: otel-train-runs)")
    costs.add_argument("--json", action="store_true", help="print the JSON instead")
    costs.set_defaults(func=_costs)
    report = sub.add_parser("report", help="write a run's report: one HTML file that opens "
                            "offline")
    report.add_argument("run_dir", nargs="?", default="otel-train-runs", help=_RUN_DIR_HELP)
    report.add_argument("-o", "--output", default=None,
                        help="where to write it (default RUN_DIR/report.html)")
    report.set_defaults(func=_report)
    export = sub.add_parser("export", help="convert a run's span files for other tools "
                            "(a Chrome trace for Perfetto by default)")
    export.add_argument("run_dir", nargs="?", default="otel-train-runs", help=_RUN_DIR_HELP)
    export.add_argument("--format", default="chrome-trace", choices=["chrome-trace"],
                        help="chrome-trace (the default): Trace Event Format JSON for "
                             "Perfetto (ui.perfetto.dev) and chrome://tracing")
    export.add_argument("-o", "--output", default=None,
                        help="where to write it (default RUN_DIR/trace.json)")
    export.set_defaults(func=_export)
    stalls = sub.add_parser("stalls", help="list a run's stall stacks per rank, and which "
                            "rank was inside which collective and which in none")
    stalls.add_argument("run_dir", nargs="?", default="otel-train-runs", help=_RUN_DIR_HELP)
    stalls.set_defaults(func=_stalls)
    compare = sub.add_parser("compare", help="compare two runs' steady-state steps: per "
                             "phase and per step, medians, B/A with a bootstrap 95%% "
                             "interval, and a verdict; --fail-if-slower for CI")
    add_compare_arguments(compare)
    compare.set_defaults(func=run_compare)
    plan = sub.add_parser("plan", help="print what a run started here would do (the route "
                          "its spans take, where the metrics run, sampling) and why; options "
                          "from these flags, then OTEL_TRAIN_*")
    add_plan_arguments(plan)
    plan.set_defaults(func=print_plan)
    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=_version)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``otel-train`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # `otel-train` alone: what it can do
        parser.print_help()
        return 0
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
