"""The ``otel-train`` command.

Usage::

    otel-train demo [--steps 300] [--eval-every 50]   # train a tiny GPT on CPU, instrumented
    otel-train costs otel-train-runs/<run>/       # monitoring_costs.json as a readable table
    otel-train costs                              # the latest run under otel-train-runs/
    otel-train report otel-train-runs/<run>/      # one self-contained HTML page, opens offline
    otel-train export otel-train-runs/<run>/ --format chrome-trace   # for Perfetto
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
        costs = run_demo(steps=args.steps, eval_every=args.eval_every, seed=args.seed,
                         **options)
    except ValueError as exc:  # a bad option or a taken port: say it plainly
        print(f"otel-train demo: {exc}", file=sys.stderr)
        return 2
    print(costs)  # the costs report prints as its table
    return 0


def _costs(args: argparse.Namespace) -> int:
    from pathlib import Path

    from otel_train.rundir.costs import print_costs

    return print_costs(Path(args.path), as_json=args.json)


def _report(args: argparse.Namespace) -> int:
    from pathlib import Path

    from otel_train.rundir.report import write_report

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        print(f"otel-train report: {run_dir} is not a directory (pass a run's status "
              "directory, e.g. otel-train-runs/<run id>)", file=sys.stderr)
        return 2
    try:
        path = write_report(run_dir, out=args.output)
    except ImportError as exc:  # plotly is the optional 'report' extra
        print(f"otel-train report: {exc}", file=sys.stderr)
        return 2
    print(path)
    return 0


def _export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from otel_train.rundir.chrome_trace import export_chrome_trace

    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        print(f"otel-train export: {run_dir} is not a directory", file=sys.stderr)
        return 2
    print(export_chrome_trace(run_dir, out=args.output))
    return 0


def _version(args: argparse.Namespace) -> int:
    from otel_train.recording.recorder import HOT_PATH

    print(__version__)
    print(f"hot path: {HOT_PATH}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``otel-train`` console script."""
    from otel_train.cli.demo import add_arguments
    from otel_train.cli.plan import add_arguments as add_plan_arguments
    from otel_train.cli.plan import print_plan

    ap = argparse.ArgumentParser(prog="otel-train", description=(
        "Every PyTorch training step as an OpenTelemetry trace; monitoring overhead as "
        "Prometheus metrics."))
    sub = ap.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a tiny GPT on CPU with otel-train")
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
                            "offline (needs the 'report' extra: plotly)")
    report.add_argument("run_dir", help="the run's status directory (otel-train-runs/<run id>)")
    report.add_argument("-o", "--output", default=None,
                        help="where to write it (default RUN_DIR/report.html)")
    report.set_defaults(func=_report)
    export = sub.add_parser("export", help="convert a run's span files for other tools")
    export.add_argument("run_dir", help="the run's status directory (otel-train-runs/<run id>)")
    export.add_argument("--format", required=True, choices=["chrome-trace"],
                        help="chrome-trace: Trace Event Format JSON for Perfetto and "
                             "chrome://tracing")
    export.add_argument("-o", "--output", default=None,
                        help="where to write it (default RUN_DIR/trace.json)")
    export.set_defaults(func=_export)
    plan = sub.add_parser("plan", help="print what a run started here would do (the route "
                          "its spans take, where the metrics run, sampling) and why; options "
                          "from these flags, then OTEL_TRAIN_*")
    add_plan_arguments(plan)
    plan.set_defaults(func=print_plan)
    version = sub.add_parser("version", help="print the version")
    version.set_defaults(func=_version)
    args = ap.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
