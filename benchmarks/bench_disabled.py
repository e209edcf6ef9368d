"""A disabled run's cost per 7-span step against the floor, interleaved in one run.

``OTEL_SDK_DISABLED=true`` / ``start_run(enabled=False)`` must cost close to six empty
timestamp context managers (the floor for the API's shape): prints the training thread's CPU
per step (``time.thread_time_ns``) for the floor, a disabled run, and an enabled run with no
exporter (its background threads running), alternating chunks so the machine's drift hits
all three alike.

Usage::

    python benchmarks/bench_disabled.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

# The same floor and the same 7-span step as bench_hot_path.py, so the figures compare.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_hot_path import CHUNK, _floor_chunk, _ours_chunk  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args(argv)
    import logging

    import otel_train

    logging.getLogger("otel_train").setLevel(logging.ERROR)  # no slow-step chatter

    with tempfile.TemporaryDirectory() as tmp:
        off = otel_train.start_run(enabled=False, console=False)
        on = otel_train.start_run(exporter="none", prometheus_port=None, console=False,
                                  status_dir=tmp, device_sync="off")
        n = args.rounds * CHUNK + 1
        gen_off, gen_on = off.steps(range(n)), on.steps(range(n))
        floor, disabled, enabled = [], [], []
        for _ in range(args.rounds):
            floor.append(_floor_chunk())
            disabled.append(_ours_chunk(gen_off))
            enabled.append(_ours_chunk(gen_on))
        gen_off.close()
        gen_on.close()
        off.shutdown()
        on.shutdown()
    f = statistics.median(floor) / CHUNK / 1000
    d = statistics.median(disabled) / CHUNK / 1000
    e = statistics.median(enabled) / CHUNK / 1000
    print(f"per 7-span step, training-thread CPU, median of {args.rounds} interleaved chunks")
    print(f"floor: 6 empty timestamp context managers   {f:7.2f} us")
    print(f"disabled run (enabled=False)                {d:7.2f} us = {d / f:.2f} x floor")
    print(f"enabled run, no exporter (threads running)  {e:7.2f} us = {e / f:.2f} x floor")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
