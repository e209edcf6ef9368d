"""Span-file size per step, and the report's time and peak memory on 10k and 1M steps.

1. Bytes per step of the default span file (OTLP JSON lines) written by a real run of 2,000
   CPU steps (data, forward, backward, optimizer; an eval every 100 steps), uncompressed and
   gzip, and the export thread's CPU per step for each, next to the other way of producing
   OTLP/JSON (our protobuf bytes -> proto message -> google.protobuf.json_format).
2. ``write_report`` on synthetic runs of 10k and 1M steps (the same span shapes, generated
   from a real step's spans as templates, gzip like the default), each in a fresh child
   process so its peak RSS is its own; the 10k run also times the chrome-trace export.

Usage::

    python benchmarks/bench_report.py               # 10k and 1M (the 1M files: ~1-2 min)
    python benchmarks/bench_report.py --steps 10000 # only 10k
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STEPS_PER_LINE = 73  # ~512 spans per line, as the export stage batches them


def _train(run, steps: int) -> None:
    for step in run.steps(range(steps), loader="train"):
        with step.phase("forward"):
            pass
        with step.phase("backward"):
            pass
        with step.phase("optimizer"):
            pass
        step.set_attribute("train.loss", 1.0 / (step.index + 1))
        if step.index % 100 == 0:
            with step.monitor("inference"):
                pass
            with step.monitor("val_loss"):
                for _ in step.iter_data(range(2), loader="val"):
                    pass


def bytes_per_step(steps: int = 2000) -> None:
    """Bytes per step of the span file from a real run, plain and gzip."""
    import otel_train

    print(f"== span file: a real run of {steps} CPU steps (eval every 100) ==")
    for compression in ("none", "gzip"):
        d = Path(tempfile.mkdtemp(prefix="otel-train-bench-"))
        with otel_train.start_run(prometheus_port=None, console=False, status_dir=str(d),
                                  spans_compression=compression, report=False,
                                  shutdown_timeout_seconds=60.0,  # export every span
                                  run_id="20261121-231646-519c94") as run:
            _train(run, steps)
        assert not run.dropped_spans(), run.dropped_spans()
        size = sum(p.stat().st_size for p in d.glob("spans*"))
        print(f"  {compression:5s}: {size / steps:7.0f} bytes/step  ({size:,} bytes)")


def encoding_cost() -> None:
    """Export-thread CPU per step: direct OTLP/JSON (plain, gzip) vs proto + json_format."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    import otel_train
    from otel_train.export.otlp.encoding import _Encoder
    from otel_train.export.span_file import OtlpJsonEncoder
    from otel_train.records.span_rows import rows_from_record

    d = Path(tempfile.mkdtemp(prefix="otel-train-bench-"))
    with otel_train.start_run(prometheus_port=None, console=False, status_dir=str(d),
                              exporter="none", report=False) as run:
        run._telemetry.worker.paused = True
        _train(run, 200)
        builder = run._telemetry.builder
        spans = [row for r in list(run._recorder.queue)
                 for row in rows_from_record(builder.record(r))]
        run._telemetry.worker.paused = False
    steps = 200
    ours, fast = OtlpJsonEncoder(), _Encoder()
    f = builder.factory
    args = (f.resource, f.scope, f.run_constants)
    ours.request_rows(spans, *args)
    fast.request_rows(spans, *args)
    totals = {"direct": 0, "direct+gzip": 0, "proto+json_format": 0}
    for _ in range(3):  # interleaved
        t0 = time.thread_time_ns()
        ours.request_rows(spans, *args).encode()
        t1 = time.thread_time_ns()
        gz = zlib.compressobj(6, zlib.DEFLATED, 31)
        gz.compress(ours.request_rows(spans, *args).encode())
        gz.flush(zlib.Z_SYNC_FLUSH)
        t2 = time.thread_time_ns()
        msg = ExportTraceServiceRequest.FromString(fast.request_rows(spans, *args))
        json.dumps(json_format.MessageToDict(msg))  # (ids would still need hex conversion)
        t3 = time.thread_time_ns()
        totals["direct"] += t1 - t0
        totals["direct+gzip"] += t2 - t1
        totals["proto+json_format"] += t3 - t2
    base = totals["direct"]
    print("== OTLP/JSON encoding, export-thread CPU per step (7-9 spans) ==")
    for name, ns in totals.items():
        print(f"  {name:18s} {ns / 3 / steps / 1000:7.1f} us/step  ({ns / base:.2f}x direct)")


def generate(run_dir: Path, steps: int) -> float:
    """Write ``steps`` synthetic steps (real span shapes) as gzip OTLP JSON lines."""
    import otel_train

    t0 = time.monotonic()
    with otel_train.start_run(prometheus_port=None, console=False, exporter="none",
                              status_dir=str(run_dir / "_tmpl"), report=False,
                              run_id="synthetic") as run:
        run._telemetry.worker.paused = True
        _train(run, 2)  # step 0 has an eval, step 1 does not
        records = list(run._recorder.queue)
        from otel_train.export.span_file import OtlpJsonEncoder
        from otel_train.records.span_rows import rows_from_record
        enc, f = OtlpJsonEncoder(), run._telemetry.builder.factory
        lines = [json.loads(enc.request_rows(rows_from_record(run._telemetry.builder.record(r)),
                                             f.resource, f.scope, f.run_constants))
                 for r in records]
        run._telemetry.worker.paused = False
    templates = []
    head = None
    for line in lines:
        rs = line["resourceSpans"][0]
        ss = rs["scopeSpans"][0]
        spans = ss["spans"]
        if head is None:
            shell = dict(line)
            ss_copy = dict(ss, spans=["@SPANS@"])
            shell["resourceSpans"] = [dict(rs, scopeSpans=[ss_copy])]
            head, tail = json.dumps(shell, separators=(",", ":")).split('"@SPANS@"')
        root_start = min(int(s["startTimeUnixNano"]) for s in spans)
        parts = []
        for n, s in enumerate(spans):
            s = dict(s)
            s["traceId"] = "@T@"
            s["spanId"] = f"@S{n}@"
            if s.get("parentSpanId"):
                s["parentSpanId"] = "@R@"
            s["startTimeUnixNano"] = f"@A{n}@"
            s["endTimeUnixNano"] = f"@B{n}@"
            for kv in s.get("attributes", ()):
                if kv["key"] == "train.step":
                    kv["value"] = {"intValue": "@N@"}
            text = json.dumps(s, separators=(",", ":")).replace("%", "%%")
            text = text.replace('"@T@"', '"%(T)s"').replace('"@R@"', '"%(R)s"')
            text = text.replace('"@N@"', '"%(N)d"').replace(f'"@S{n}@"', '"%(S' + str(n) + ')s"')
            text = text.replace(f'"@A{n}@"', '"%(A' + str(n) + ')d"')
            text = text.replace(f'"@B{n}@"', '"%(B' + str(n) + ')d"')
            parts.append(text)
            s_rel = int(spans[n]["startTimeUnixNano"]) - root_start
            e_rel = int(spans[n]["endTimeUnixNano"]) - root_start
            parts[-1] = (parts[-1], s_rel, e_rel, spans[n].get("parentSpanId") is None)
        templates.append(parts)
    base_ns = 1_795_000_000_000_000_000
    period_ns = 100_000_000  # 0.1 s per step, an eval every 500 steps, a slow step every 997
    out = run_dir / "spans.jsonl.gz"
    gz = zlib.compressobj(1, zlib.DEFLATED, 31)
    buf: list[str] = []
    with open(out, "wb") as fh:
        for i in range(steps):
            tmpl = templates[0] if i % 500 == 0 else templates[1]
            scale = 3 if i % 997 == 13 else 1
            start = base_ns + i * period_ns
            m = {"T": f"{i + 1:032x}", "R": f"{(i << 8) | 0xff:016x}", "N": i}
            for n, (_text, s_rel, e_rel, is_root) in enumerate(tmpl):
                # Stretch the recorded microseconds into a ~60 ms step (x scale when slow).
                m[f"S{n}"] = f"{(i << 8) | (0xff if is_root else n):016x}"
                m[f"A{n}"] = start + s_rel * 2000 * scale
                m[f"B{n}"] = start + e_rel * 2000 * scale
            buf.append(",".join(t % m for t, _s, _e, _r in tmpl))
            if len(buf) >= STEPS_PER_LINE or i == steps - 1:
                fh.write(gz.compress((head + ",".join(buf) + tail + "\n").encode()))
                buf.clear()
        fh.write(gz.flush())
    costs = {"schema": "otel-train/monitoring-costs/v1", "run_id": "synthetic", "rank": 0,
             "steps": steps, "total_share": 0.01, "recent_share": 0.01, "budget": 0.05,
             "critical": 0.1, "budget_status": "ok", "operations": {}, "advisor": []}
    (run_dir / "monitoring_costs.json").write_text(json.dumps(costs))
    return time.monotonic() - t0


def child(run_dir: str, chrome: bool) -> None:
    """Measure in this fresh process: report time and peak RSS (and the chrome trace)."""
    from otel_train.rundir.report import write_report

    t0, c0 = time.monotonic(), time.process_time()
    path = write_report(run_dir)
    report_s, cpu_s = time.monotonic() - t0, time.process_time() - c0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out = {"report_seconds": report_s, "report_cpu_seconds": cpu_s, "peak_rss_mb": rss_mb,
           "report_mb": path.stat().st_size / 1e6}
    if chrome:
        from otel_train.rundir.chrome_trace import export_chrome_trace
        t0 = time.monotonic()
        trace = export_chrome_trace(run_dir)
        out["chrome_trace_seconds"] = time.monotonic() - t0
        out["chrome_trace_mb"] = trace.stat().st_size / 1e6
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, nargs="*", default=[10_000, 1_000_000])
    ap.add_argument("--child", default=None)
    ap.add_argument("--chrome", action="store_true")
    ap.add_argument("--skip-real", action="store_true", help="skip the real-run measurements")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.chrome)
        return
    import logging
    logging.getLogger("otel_train").setLevel(logging.ERROR)  # no slow-step logs in the figures
    if not args.skip_real:
        bytes_per_step()
        encoding_cost()
    base_rss = json.loads(subprocess.run(
        [sys.executable, "-c", "import json, resource, otel_train.rundir.report; "
         "print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))"],
        capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}).stdout)
    print(f"== report on synthetic runs (baseline RSS after imports: {base_rss:.0f} MB) ==")
    for steps in args.steps:
        with tempfile.TemporaryDirectory(prefix="otel-train-bench-") as tmp:
            run_dir = Path(tmp)
            gen_s = generate(run_dir, steps)
            size = sum(p.stat().st_size for p in run_dir.glob("spans*"))
            res = subprocess.run(
                [sys.executable, __file__, "--child", str(run_dir),
                 *(["--chrome"] if steps <= 100_000 else [])],
                capture_output=True, text=True, check=True,
                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
            m = json.loads(res.stdout.strip().splitlines()[-1])
            line = (f"  {steps:>9,} steps: files {size / 1e6:7.1f} MB gzip (generated in "
                    f"{gen_s:.0f} s); report {m['report_seconds']:6.1f} s wall, "
                    f"{m['report_cpu_seconds']:6.1f} s CPU "
                    f"({m['report_cpu_seconds'] / steps * 1e6:5.1f} us/step), peak RSS "
                    f"{m['peak_rss_mb']:.0f} MB (baseline {base_rss:.0f}), page "
                    f"{m['report_mb']:.1f} MB")
            if "chrome_trace_seconds" in m:
                line += (f"; chrome-trace {m['chrome_trace_seconds']:.1f} s, "
                         f"{m['chrome_trace_mb']:.0f} MB")
            print(line, flush=True)


if __name__ == "__main__":
    main()
