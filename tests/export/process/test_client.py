"""The exporter process: span records down a pipe, spans out of a child process, counts back.

Real child processes, a real OTLP gRPC receiver and real span files; faults are real too:
the child is killed, stopped (SIGSTOP) or orphaned.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from otlp_receivers import GrpcOtlpReceiver
from train_helpers import clean_env, read_file_spans, run_spans, start_test_run  # noqa: F401

import otel_train
from otel_train.common.drop_counter import DropCounter
from otel_train.common.sdk_config import ExportPlan
from otel_train.export.process.client import ClientState, ExportProcessClient
from otel_train.export.span_file import OtlpJsonFileSpanExporter
from otel_train.records.span_rows import record_span_count, rows_from_record

pytestmark = pytest.mark.timeout(60)


def _train(run: otel_train.Run, steps: int, start: int = 0) -> None:
    for step in run.steps(range(start, start + steps)):
        with step.phase("forward"):
            pass
        with step.phase("backward"):
            pass
        if step.index % 5 == 0:
            with step.monitor("val_loss"):
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _wait_ready(client: Any, seconds: float = 30.0) -> None:
    from otel_train.export.process.client import ClientState

    end = time.monotonic() + seconds
    while client.state is ClientState.STARTING and time.monotonic() < end:
        client.tick()
        time.sleep(0.02)
    assert client.state is ClientState.READY


def _wait_gone(pid: int, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("step_ring", ["off", "auto"])
def test_a_run_exports_through_a_child_process_by_default(tmp_path: Path,
                                                          step_ring: str) -> None:
    run = start_test_run(tmp_path, step_ring=step_ring)
    client = run._telemetry.export
    assert isinstance(client, ExportProcessClient)
    assert client.pid != os.getpid() and _alive(client.pid)
    assert f"exporter process pid {client.pid}" in run.export_plan.describe()
    _train(run, 20)
    run.shutdown(timeout=10)
    spans = read_file_spans(tmp_path / "spans.jsonl")
    assert len(spans) == 20 * 4 + 4  # root, data, 2 phases per step; val_loss on 4 steps
    assert {s.name for s in spans} == {"train.step", "data", "forward", "backward", "val_loss"}
    assert _wait_gone(client.pid, 5)
    # Built here, or (auto: the exporter process reads the step ring) the flat steps there.
    ring = client._reports.ring_counts if client.reads_ring else {}
    assert client.reads_ring == (step_ring == "auto")
    built_there = ring.get("warm_spans", 0) + ring.get("cold_spans", 0)
    assert run._telemetry.worker.spans_built + built_there == len(spans)
    assert (built_there > 0) == (step_ring == "auto")
    assert run.costs()["steps"] == 20


def test_the_exporter_process_cpu_is_served_as_a_prometheus_counter(tmp_path: Path) -> None:
    import urllib.request

    run = start_test_run(tmp_path, prometheus_port=0)
    _train(run, 50)
    assert run.flush(timeout_seconds=10)
    text = urllib.request.urlopen(run.prometheus_url + "/metrics", timeout=5).read().decode()
    run.shutdown(timeout=10)
    line = next(ln for ln in text.splitlines()
                if ln.startswith("otel_train_exporter_process_cpu_seconds_total{"))
    assert 'rank="0"' in line
    assert float(line.split()[-1]) > 0.0  # its start-up alone (imports) costs CPU


def test_the_costs_report_the_exporter_process_cpu_beside_this_process(tmp_path: Path) -> None:
    run = start_test_run(tmp_path)
    _train(run, 20)
    assert run.flush(timeout_seconds=10)
    costs = run.costs()
    run.shutdown(timeout=10)
    assert costs["exporter_process_cpu_seconds"] > 0.0
    # Start-up (imports: most of a short run's) is told apart from the per-step work.
    startup = costs["exporter_process_startup_cpu_seconds"]
    assert 0.0 < startup <= costs["exporter_process_cpu_seconds"]
    assert costs["exporter_process_cpu_seconds_per_step"] == pytest.approx(
        (costs["exporter_process_cpu_seconds"] - startup) / costs["steps"])
    assert "exporter process" in str(costs).splitlines()[-1]
    written = json.loads((tmp_path / "monitoring_costs.json").read_text())
    assert written["exporter_process_cpu_seconds"] > 0.0
    in_process = start_test_run(tmp_path / "thread", export_process=False)
    _train(in_process, 2)
    assert "exporter_process_cpu_seconds" not in in_process.costs()
    in_process.shutdown(timeout=10)


def test_export_process_false_keeps_the_export_thread_in_the_training_process(
        tmp_path: Path) -> None:
    run = start_test_run(tmp_path, export_process=False)
    assert not isinstance(run._telemetry.export, ExportProcessClient)
    assert "exporter process" not in run.export_plan.describe()
    _train(run, 5)
    run.shutdown(timeout=10)
    assert len(read_file_spans(tmp_path / "spans.jsonl")) == 5 * 4 + 1


def _records_of_every_shape(tmp_path: Path) -> tuple[list[tuple], object]:
    """Span records (steps with attributes, monitoring, a failed step) and their builder."""
    run = start_test_run(tmp_path, exporter="none")
    run._telemetry.worker.paused = True
    for step in run.steps(range(12)):
        with step.phase("forward") as ph:
            ph.set_attribute("tokens", step.index * 7)
        with step.monitor("inference"):
            pass
        step.set_attribute("train.loss", 1.0 / (1 + step.index))
    try:
        with run.step() as step:
            with step.phase("forward"):
                raise RuntimeError("nan loss")
    except RuntimeError:
        pass
    builder = run._telemetry.builder
    recs = [builder.record(r) for r in list(run._recorder.queue)]
    run.shutdown(timeout=5)
    return recs, builder


def _comparable(requests: list[dict]) -> list[str]:
    """Spans of OTLP JSON requests as sorted-key JSON, span ids named by trace and name
    (phase span ids are drawn where the rows are made, so they differ run to run)."""
    spans = []
    for request in requests:
        for rs in request["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                spans += [(rs["resource"], ss["scope"], sp) for sp in ss["spans"]]
    names = {sp["spanId"]: f"{sp['traceId']}/{sp['name']}" for _, _, sp in spans}
    out = []
    for resource, scope, sp in spans:
        sp = dict(sp, spanId=names[sp["spanId"]],
                  parentSpanId=names.get(sp.get("parentSpanId", ""), ""))
        out.append(json.dumps([resource, scope, sp], sort_keys=True))
    return out


@pytest.mark.parametrize("kind", ["jsonl", "http", "grpc"])
def test_the_child_writes_the_same_otlp_as_the_training_process_would(
        tmp_path: Path, kind: str) -> None:
    """The same spans, span ids of phases aside: records exported by the child (OTLP
    encoded straight from rows, or the span file from spans) and in-process."""
    from google.protobuf.json_format import MessageToDict
    from otlp_receivers import HttpOtlpReceiver

    from otel_train.export.otlp.encoding import _Encoder

    recs, builder = _records_of_every_shape(tmp_path)
    total = sum(record_span_count(r) for r in recs)
    here_rows = [row for rec in recs for row in rows_from_record(rec)]
    receiver = {"http": HttpOtlpReceiver, "grpc": GrpcOtlpReceiver}.get(kind)
    with (receiver() if receiver else _nothing()) as server:
        if kind == "jsonl":
            plan = ExportPlan("jsonl", path=tmp_path / "child.jsonl")
        else:
            plan = ExportPlan("otlp", endpoint=server.endpoint,
                              protocol="grpc" if kind == "grpc" else "http/protobuf")
        drops = DropCounter()
        client = ExportProcessClient(plan, builder.factory.resource, builder.factory.scope,
                                     builder.run_constants, drops, 10_000, 512, 0.05)
        for i, rec in enumerate(recs):
            client.send_record(rec, record_span_count(rec))
            if i % 3 == 2:
                client.end_drain()
        assert client.force_flush(10_000)
        client.shutdown(5)
        assert drops.counts() == {}
        assert client.exported == total
        if kind == "jsonl":
            child = [json.loads(line) for line in
                     (tmp_path / "child.jsonl").read_text().splitlines()]
            here = OtlpJsonFileSpanExporter(tmp_path / "here.jsonl")
            items = here.span_items(builder.factory)
            here.export([items.from_row(row) for row in here_rows])
            here.shutdown()
            mine = [json.loads(line) for line in
                    (tmp_path / "here.jsonl").read_text().splitlines()]
        else:
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                ExportTraceServiceRequest,
            )
            child = [MessageToDict(r) for r in server.requests()]
            mine = [MessageToDict(ExportTraceServiceRequest.FromString(
                _Encoder().request_rows(here_rows, builder.factory.resource,
                                        builder.factory.scope, builder.run_constants)))]
    got, want = _comparable(child), _comparable(mine)
    assert len(got) == total == len(want)
    assert sorted(got) == sorted(want)  # OTLP batches may split where the file's did not
    assert any('"nan loss"' in s for s in got)  # the failed step's exception event


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def test_user_spans_nest_under_their_phase_through_the_child(tmp_path: Path) -> None:
    with GrpcOtlpReceiver() as receiver:
        run = otel_train.start_run(exporter="otlp", otlp_endpoint=receiver.endpoint,
                                   otlp_protocol="grpc", prometheus_port=None, console=False,
                                   status_dir=str(tmp_path), export_interval_seconds=0.05)
        tracer = trace.get_tracer("user.code")
        for step in run.steps(range(3)):
            with step.phase("forward"):
                with tracer.start_as_current_span("attention", attributes={"layer": 3}):
                    pass
        run.shutdown(timeout=10)
        spans = receiver.wait_for_spans(3 * 4, timeout_seconds=10)
    user = [s for s in spans if s.name == "attention"]
    forward = {s.span_id: s for s in spans if s.name == "forward"}
    assert len(user) == 3
    assert all(u.parent_span_id in forward for u in user)
    assert all(u.attributes["layer"] == 3 for u in user)


def test_a_killed_child_is_counted_and_export_falls_back_to_the_training_process(
        tmp_path: Path) -> None:
    run = start_test_run(tmp_path, export_interval_seconds=0.05)
    client = run._telemetry.export
    _train(run, 10)
    run.flush(timeout_seconds=10)
    os.kill(client.pid, signal.SIGKILL)
    end = time.monotonic() + 5
    while client._proc.poll() is None and time.monotonic() < end:  # all its threads gone
        time.sleep(0.02)
    _train(run, 10, start=10)
    run.shutdown(timeout=10)
    spans = read_file_spans(tmp_path / "spans.jsonl")
    steps = sorted(s.attributes["train.step"] for s in spans if s.name == "train.step")
    assert steps == list(range(20))  # flushed before the kill, and after it from here
    assert run.drops.counts().get("export_failed", 0) == 0  # nothing was held at the kill


_NEVER_READY_AT_EXIT = textwrap.dedent("""
    import sys
    from otel_train.export.process.lifecycle import ClientLifecycle
    # A machine too slow to start the exporter process before this short run ends: the
    # client never leaves STARTING, so the shutdown at interpreter exit takes over.
    ClientLifecycle.child_ready = lambda self: False
    import otel_train
    run = otel_train.start_run(exporter="otlp", otlp_endpoint=sys.argv[1],
                               otlp_protocol=sys.argv[2], prometheus_port=None, console=False,
                               status_dir=sys.argv[3], shutdown_timeout_seconds=5.0)
    for step in run.steps(range(4)):
        with step.phase("forward"):
            pass
    assert "opentelemetry.exporter.otlp.proto.grpc.trace_exporter" not in sys.modules
    # No shutdown: the run ends with the interpreter (atexit). It waits 60% of its 5 s for
    # the child, then has 2 s to import an exporter here and send (room for a slow CI box).
""")


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_a_short_run_whose_child_never_started_exports_from_here_at_interpreter_exit(
        tmp_path: Path, protocol: str) -> None:
    from otlp_receivers import HttpOtlpReceiver
    receiver = GrpcOtlpReceiver() if protocol == "grpc" else HttpOtlpReceiver()
    with receiver as recv:
        proc = subprocess.run(
            [sys.executable, "-c", _NEVER_READY_AT_EXIT, recv.endpoint, protocol,
             str(tmp_path)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        # It took no step, so no warning that the metrics lost the child's steps.
        assert "last state" not in proc.stderr, proc.stderr[-3000:]
        spans = recv.wait_for_spans(8, 10)
    assert sorted(s.attributes["train.step"] for s in spans if s.name == "train.step") == [
        0, 1, 2, 3]


def test_shutdown_keeps_its_bound_when_the_child_is_stuck_and_counts_every_span(
        tmp_path: Path) -> None:
    run = start_test_run(tmp_path)
    client = run._telemetry.export
    run.flush(timeout_seconds=10)  # the child is up
    os.kill(client.pid, signal.SIGSTOP)
    try:
        _train(run, 50)
        t0 = time.monotonic()
        run.shutdown(timeout=1.0)
        took = time.monotonic() - t0
    finally:
        try:
            os.kill(client.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert took < 1.0 + 0.5, took
    assert run.drops.counts().get("shutdown_timeout") == 50 * 4 + 10
    assert _wait_gone(client.pid, 5)  # killed at the deadline


def test_a_stuck_child_fills_the_bounded_queue_and_the_oldest_spans_are_dropped(
        tmp_path: Path) -> None:
    # The queue path (step_ring off): a full step ring drops the newest steps instead
    # (tests/pipeline/test_ring_source.py).
    run = start_test_run(tmp_path, max_queued_spans=300, step_ring="off")
    client = run._telemetry.export
    run.flush(timeout_seconds=10)
    os.kill(client.pid, signal.SIGSTOP)
    try:
        for _ in range(40):  # ~6k spans: more than the pipe and the 300-span bound hold
            _train(run, 50, start=run._recorder.next_index)
            run._telemetry.worker.drain()
        dropped = run.drops.counts().get("export_queue_full", 0)
        assert dropped > 0
        assert client._outbox.spans <= 300 + 50 * 4 + 10  # bound + the newest frame
    finally:
        os.kill(client.pid, signal.SIGCONT)
    run.shutdown(timeout=10)
    spans = read_file_spans(tmp_path / "spans.jsonl")
    counts = run.drops.counts()
    recorded = 40 * (50 * 4 + 10)
    assert len(spans) + sum(counts.values()) == recorded, counts  # every span accounted for
    last = max(s.attributes["train.step"] for s in spans if s.name == "train.step")
    assert last == 40 * 50 - 1  # the newest steps survived


_ORPHAN = textwrap.dedent("""
    import os, sys, time, signal
    import otel_train
    run = otel_train.start_run(exporter="jsonl", spans_path=sys.argv[1] + "/spans.jsonl",
                               prometheus_port=None, console=False, status_dir=sys.argv[1],
                               step_ring=sys.argv[2])
    client = run._telemetry.export
    if client.reads_ring:  # the child up first: the steps then wait in the ring, unread
        run.flush(timeout_seconds=20)
    for step in run.steps(range(30)):
        with step.phase("forward"):
            pass
    run._telemetry.worker.drain()
    while not client.reads_ring and client.sent_spans < 90:  # handed over once it is up
        time.sleep(0.01)
    print("CHILD", client.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # no shutdown, no atexit
""")


@pytest.mark.parametrize("step_ring", ["off", "on"])  # on: the child reads the ring after it
def test_the_child_flushes_and_exits_when_the_training_process_is_killed(tmp_path: Path,
                                                                         step_ring: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _ORPHAN, str(tmp_path), step_ring],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    pid = int(next(ln for ln in proc.stdout.splitlines() if ln.startswith("CHILD")).split()[1])
    assert _wait_gone(pid, 8), "the exporter process outlived its training process"
    spans = read_file_spans(tmp_path / "spans.jsonl")
    assert len(spans) == 30 * 3  # what was handed over (or in the ring) before the kill


def test_the_child_ignores_the_launchers_sigterm_and_flushes_through_the_run(
        tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import os, sys, time
        import otel_train
        run = otel_train.start_run(exporter="jsonl", spans_path=sys.argv[1] + "/spans.jsonl",
                                   prometheus_port=None, console=False, status_dir=sys.argv[1])
        print("CHILD", run._telemetry.export.pid, flush=True)
        for step in run.steps(range(10**9)):
            with step.phase("forward"):
                time.sleep(0.001)
            if step.index == 100:
                print("READY", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    pid = int(proc.stdout.readline().split()[1])
    assert proc.stdout.readline().startswith("READY")
    os.killpg(proc.pid, signal.SIGTERM)  # as a launcher or `kill -- -pgid` does
    proc.wait(20)
    assert proc.returncode == -signal.SIGTERM
    assert _wait_gone(pid, 5)
    spans = read_file_spans(tmp_path / "spans.jsonl")
    steps = [s for s in spans if s.name == "train.step"]
    assert len(steps) > 100
    assert len(spans) == 3 * len(steps)  # each step whole: root, data, forward


def test_a_malformed_record_is_counted_and_never_fails_the_batch_it_came_with(
        tmp_path: Path) -> None:
    from otlp_receivers import HttpOtlpReceiver

    recs, builder = _records_of_every_shape(tmp_path)
    good = recs[:3]
    # A monitoring record whose attributes are not a dict: its row cannot be encoded.
    bad = recs[0][:6] + ("not a dict",) + recs[0][7:9] + (None, None)
    with HttpOtlpReceiver() as receiver:
        drops = DropCounter()
        client = ExportProcessClient(
            ExportPlan("otlp", endpoint=receiver.endpoint, protocol="http/protobuf"),
            builder.factory.resource, builder.factory.scope, builder.run_constants, drops,
            10_000, 512, 0.05)
        for rec in (good[0], bad, *good[1:]):
            client.send_record(rec, record_span_count(rec))
        client.end_drain()
        assert client.force_flush(10_000)
        client.shutdown(5)
        total = sum(record_span_count(r) for r in good)
        assert drops.counts() == {"build_error": 1}
        assert client.exported == total
        assert len(receiver.spans()) == total  # the good spans of the same frame arrived


# -- the derived metrics in the exporter process (derived/chain.py) ---------------------------
def _scrape(url: str) -> dict[str, float]:
    import urllib.request

    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    out = {}
    for ln in text.splitlines():
        if ln and not ln.startswith("#"):
            name, _, val = ln.rpartition(" ")
            out[name] = float(val)
    return out


def test_the_derived_metrics_run_in_the_exporter_process_and_this_process_serves_a_copy(
        tmp_path: Path) -> None:
    run = start_test_run(tmp_path, prometheus_port=0)
    derived = run._telemetry.derived
    assert derived.remote is run._telemetry.export
    _wait_ready(run._telemetry.export)  # before it is, this process feeds the chain itself
    _train(run, 50)
    costs = run.costs()  # no flush: costs() waits for the child's state after those steps
    assert costs["steps"] == 50
    assert costs["operations"]["val_loss"]["calls"] == 10
    metrics = _scrape(run.prometheus_url)
    assert metrics['otel_train_steps_total{rank="0"}'] == 50
    assert metrics['otel_train_phase_duration_seconds_count{kind="train",loader="",'
                   'phase="forward",rank="0"}'] == 50
    # This process built the records and fed no processor: the child did.
    assert derived.shared._assembler.views == 0
    assert derived.state_loads >= 1
    run.shutdown(timeout=10)
    written = json.loads((tmp_path / "monitoring_costs.json").read_text())
    assert written["steps"] == 50


def test_a_slow_step_is_judged_in_the_child_and_marked_in_the_exported_span(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    run = start_test_run(tmp_path, console=True, log_every=1000,
                         console_min_interval_seconds=0)
    assert run._telemetry.derived.remote is not None
    with caplog.at_level("WARNING", logger="otel_train"):
        for step in run.steps(range(30), loader="train"):
            with step.phase("forward"):
                time.sleep(0.01 if step.index != 20 else 0.5)
        run.shutdown(timeout=10)
    roots = {s.attributes["train.step"]: s for s in read_file_spans(tmp_path / "spans.jsonl")
             if s.name == "train.step"}
    assert roots[20].attributes["train.slow"] is True
    # The copy here counts exactly the steps the child marked (a loaded machine may make
    # another 10 ms step slow too).
    marked = sum(r.attributes["train.slow"] for r in roots.values())
    assert marked == run._telemetry.derived.slow.slow_steps >= 1
    # The child's warning reaches this process's logger; its console lines this stderr.
    assert any("slow step 20" in r.getMessage() for r in caplog.records)
    err = capsys.readouterr().err
    assert "step 0 [warm-up]:" in err and "step 20:" in err and "slow step" in err


def test_gpu_readings_of_this_process_reach_the_spans_the_child_exports(tmp_path: Path) -> None:
    from otel_train.derived.gpu import GpuSample

    run = start_test_run(tmp_path)
    derived = run._telemetry.derived
    assert derived.remote is not None
    derived.gpu_steps.on_samples([GpuSample(0, 0.75, 3 << 30, 8 << 30, time.time_ns())])
    _train(run, 3)
    run.shutdown(timeout=10)
    roots = [s for s in read_file_spans(tmp_path / "spans.jsonl") if s.name == "train.step"]
    assert len(roots) == 3
    assert all(r.attributes["train.gpu.utilization_ratio"] == 0.75 for r in roots)
    assert all(r.attributes["train.gpu.memory_used_bytes"] == 3 << 30 for r in roots)


@pytest.mark.parametrize("step_ring", ["off", "auto"])  # auto: the child read the ring
def test_a_killed_child_leaves_the_metrics_to_this_process_from_its_last_state(
        tmp_path: Path, step_ring: str) -> None:
    run = start_test_run(tmp_path, prometheus_port=0, export_interval_seconds=0.05,
                         step_ring=step_ring)
    client = run._telemetry.export
    assert client.reads_ring == (step_ring == "auto")
    _train(run, 10)
    assert run.flush(timeout_seconds=10)  # exported and its state here
    assert run.costs()["steps"] == 10
    # The span worker looks no more: run.costs()' own drain notices the dead child.
    run._telemetry.worker.paused = True
    os.kill(client.pid, signal.SIGKILL)
    end = time.monotonic() + 5
    while client._proc.poll() is None and time.monotonic() < end:
        time.sleep(0.02)
    _train(run, 15, start=10)
    costs = run.costs()
    run._telemetry.worker.paused = False
    assert costs["steps"] == 25  # the state at 10, then 15 steps fed here
    assert costs["operations"]["val_loss"]["calls"] == 5
    assert _scrape(run.prometheus_url)['otel_train_steps_total{rank="0"}'] == 25
    run.shutdown(timeout=10)
    steps = sorted(s.attributes["train.step"]
                   for s in read_file_spans(tmp_path / "spans.jsonl") if s.name == "train.step")
    assert steps == list(range(25))


@pytest.mark.parametrize("step_ring", ["off", "auto"])  # auto: the child reads the ring
def test_a_sampled_run_decides_in_the_child_and_user_spans_go_with_their_step(
        tmp_path: Path, step_ring: str) -> None:
    run = start_test_run(tmp_path, prometheus_port=0, sample_ratio=0.0,
                         sample_keep_first_steps=2, step_ring=step_ring)
    assert run._telemetry.client.reads_ring == (step_ring == "auto")
    derived = run._telemetry.derived
    assert derived.remote is run._telemetry.export  # the chain and the sampler: there
    _wait_ready(run._telemetry.export)  # before it is, this process feeds the chain itself
    tracer = trace.get_tracer("user")
    for step in run.steps(range(20)):
        with step.phase("forward"), tracer.start_as_current_span("user-work") as span:
            if step.index == 7:  # a user span that failed keeps its step
                span.set_status(trace.Status(trace.StatusCode.ERROR, "bad batch"))
    with tracer.start_as_current_span("user-root"):  # a root of the user's: by the ratio
        pass
    assert run.flush(timeout_seconds=10)
    metrics = _scrape(run.prometheus_url)
    run.shutdown(timeout=10)
    assert derived.shared._assembler.views == 0  # nothing fed here: the child did
    spans = read_file_spans(tmp_path / "spans.jsonl")
    roots = {s.attributes["train.step"]: s for s in spans if s.name == "train.step"}
    reasons = {i: r.attributes["train.sample.reason"] for i, r in roots.items()}
    assert {0: "first", 1: "first", 7: "error"}.items() <= reasons.items()
    assert set(reasons.values()) <= {"first", "error", "slow"}  # a us step may look slow
    users = [s for s in spans if s.name == "user-work"]
    assert sorted(u.trace_id for u in users) == sorted(r.trace_id for r in roots.values())
    assert not any(s.name == "user-root" for s in spans)
    # Left out, counted as sampled out (not dropped): 4 spans a step (root, data, forward,
    # user-work) and the user's root; the metrics saw all 20 steps.
    out = 4 * (20 - len(roots)) + 1
    assert metrics['otel_train_spans_sampled_out_total{rank="0"}'] == out
    assert metrics['otel_train_steps_total{rank="0"}'] == 20
    assert run.dropped_spans() == {}
    assert derived.sampler.sampled_out_spans == out  # the copy here, from the child's state


def test_a_sampled_run_whose_child_dies_goes_on_sampling_here(tmp_path: Path) -> None:
    run = start_test_run(tmp_path, sample_ratio=0.0, sample_keep_first_steps=2,
                         export_interval_seconds=0.05)
    client = run._telemetry.export
    _train(run, 10)
    assert run.flush(timeout_seconds=10)
    os.kill(client.pid, signal.SIGKILL)
    end = time.monotonic() + 5
    while client._proc.poll() is None and time.monotonic() < end:
        time.sleep(0.02)
    _train(run, 10, start=10)
    run.shutdown(timeout=10)
    steps = {s.attributes["train.step"]: s.attributes.get("train.sample.reason")
             for s in read_file_spans(tmp_path / "spans.jsonl") if s.name == "train.step"}
    # Before: the child's decisions (the first two, monitoring every 5th step; a us step may
    # also look slow). After: this process's copy of the chain decides the same way (a dead
    # exporter process must not turn a sampled rank into one that exports every step).
    assert {0, 1, 5, 10, 15} <= set(steps)
    assert steps[1] == "first" and steps[0] == steps[5] == steps[10] == steps[15] == "monitor"
    assert all(why in ("monitor", "slow") for s, why in steps.items() if s >= 10)
    assert len([s for s in steps if s >= 10]) < 10
    assert run._telemetry.derived.sampler.sampled_out_spans > 0  # the child's, until it died


def test_a_rank_left_out_whose_child_never_starts_still_sends_only_what_matters(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A short run ends before the child is up: the in-process stage takes over, and this
    process's copy of the chain decides (no step of a rank left out by export_ranks)."""
    from otel_train.export.process import launch
    from otel_train.export.process.client import ClientState

    monkeypatch.setattr(launch, "_BOOT", "import time; time.sleep(30); " + launch._BOOT)
    run = start_test_run(tmp_path, run_id="left-out", rank=1, world_size=2, export_ranks="0",
                         slow_step_seconds=0.2)
    client = run._telemetry.export
    for step in run.steps(range(30)):
        with step.phase("forward"):
            if step.index == 20:
                time.sleep(0.3)  # the one step that matters
    assert client.state is ClientState.STARTING
    run.shutdown(timeout=2)
    assert client._lifecycle.state in (ClientState.TAKEN_OVER, ClientState.CLOSED)
    roots = {s.attributes["train.step"]: s.attributes.get("train.sample.reason")
             for s in read_file_spans(tmp_path / "spans.jsonl") if s.name == "train.step"}
    assert roots.get(20) == "slow"
    assert all(why == "slow" for why in roots.values()) and len(roots) < 5


@pytest.mark.parametrize("options", [{"metrics_in_export_process": False},
                                     {"export_process": False}])
def test_the_metrics_stay_in_this_process_when_asked_or_when_not_moved_yet(
        tmp_path: Path, options: dict) -> None:
    run = start_test_run(tmp_path, **options)
    derived = run._telemetry.derived
    assert derived.remote is None
    _train(run, 10)
    assert run.costs()["steps"] == 10
    assert derived.shared._assembler.views == 10  # every step fed here
    run.shutdown(timeout=10)


@pytest.mark.parametrize("step_ring", ["off", "auto"])  # auto: the child leaves the ring here
def test_when_the_child_cannot_run_the_metrics_this_process_feeds_them_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, step_ring: str) -> None:
    from otel_train.derived.stage import DerivedMetricsStage

    handed_over = DerivedMetricsStage.run_in_exporter_process

    def broken(self: DerivedMetricsStage, client: ExportProcessClient) -> None:
        self.settings = {k: v for k, v in self.settings.items() if k != "window"}
        handed_over(self, client)

    monkeypatch.setattr(DerivedMetricsStage, "run_in_exporter_process", broken)
    with caplog.at_level("WARNING", logger="otel_train"):
        run = start_test_run(tmp_path, step_ring=step_ring)
        client = run._telemetry.export
        assert client.reads_ring == (step_ring == "auto")
        end = time.monotonic() + 10
        while client.derives_metrics and time.monotonic() < end:
            time.sleep(0.05)
        assert not client.derives_metrics
        _train(run, 20)
        assert run.costs()["steps"] == 20
        run.shutdown(timeout=10)
    assert any("could not run the derived metrics" in r.getMessage() for r in caplog.records)
    # With the ring: the child left, the training process read the ring and exported.
    assert run._telemetry.worker._ring_source is None or (
        not run._telemetry.worker._ring_source.in_child)
    assert run.dropped_spans() == {}
    assert len(read_file_spans(tmp_path / "spans.jsonl")) == 20 * 4 + 4  # export unharmed


# -- the lifecycle of a real client (lifecycle.py) -----------------------------------------------
def test_the_client_moves_from_starting_to_ready_on_the_childs_first_report_and_closes(
        tmp_path: Path) -> None:
    from otel_train.export.process.client import ClientState

    run = start_test_run(tmp_path)
    client = run._telemetry.export
    assert client.state in (ClientState.STARTING, ClientState.READY)
    _train(run, 3)
    assert run.flush(timeout_seconds=10)
    assert client.state is ClientState.READY
    run.shutdown(timeout=10)
    assert client.state is ClientState.CLOSED
    assert client._lifecycle.refused_moves == 0
    client.shutdown(1.0)  # a second shutdown is a no-op, not an illegal move
    assert client.force_flush(1000) and client._lifecycle.refused_moves == 0


def test_a_killed_child_moves_the_client_to_taken_over_then_closed(tmp_path: Path) -> None:
    from otel_train.export.process.client import ClientState

    run = start_test_run(tmp_path, export_interval_seconds=0.05)
    client = run._telemetry.export
    assert run.flush(timeout_seconds=10)
    os.kill(client.pid, signal.SIGKILL)
    assert _wait_gone(client.pid, 5)
    # The span worker's next look at the pipes (a drain, or a tick between drains) finds the
    # child gone; which one comes first is a race, so wait for either, bounded.
    end = time.monotonic() + 5
    while client.state is not ClientState.TAKEN_OVER and time.monotonic() < end:
        run._telemetry.worker.drain()
        time.sleep(0.02)
    assert client.state is ClientState.TAKEN_OVER
    _train(run, 3)
    run._telemetry.worker.drain()
    assert run.flush(timeout_seconds=10)  # through the in-process stage
    run.shutdown(timeout=10)
    assert client.state is ClientState.CLOSED
    assert client._lifecycle.refused_moves == 0
    steps = [s for s in read_file_spans(tmp_path / "spans.jsonl") if s.name == "train.step"]
    assert len(steps) == 3


def test_an_illegal_move_asked_of_a_live_client_is_logged_and_export_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from otel_train.export.process.client import ClientState

    run = start_test_run(tmp_path)
    client = run._telemetry.export
    assert run.flush(timeout_seconds=10)
    with caplog.at_level("WARNING", logger="otel_train"):
        assert not client._lifecycle.child_ready()  # READY -> READY: not in the table
    assert client.state is ClientState.READY
    assert any("refused to move from READY to READY" in r.getMessage() for r in caplog.records)
    _train(run, 4)
    run.shutdown(timeout=10)
    assert len(read_file_spans(tmp_path / "spans.jsonl")) == 4 * 4 + 1


_FORKED_COPY = textwrap.dedent("""
    import os, sys
    import otel_train
    from otel_train.export.process.client import ClientState
    run = otel_train.start_run(exporter="jsonl", spans_path=sys.argv[1] + "/spans.jsonl",
                               prometheus_port=None, console=False, status_dir=sys.argv[1])
    for step in run.steps(range(3)):
        with step.phase("forward"):
            pass
    client = run._telemetry.export
    pid = os.fork()
    if pid == 0:  # the forked copy: inert, whatever its parent's state
        ok = client.state is ClientState.FORKED and not client.derives_metrics
        client.send_record(("never",), 1)
        ok = ok and client._recs == [] and not client._outbox.frames
        client.end_drain(); client.shutdown(1.0)
        ok = ok and client.force_flush(1000) and client._lifecycle.refused_moves == 0
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    print("FORK-EXIT", os.waitstatus_to_exitcode(status), flush=True)
    run.shutdown(timeout=10)
    print("PARENT", client.state.name, flush=True)
""")


def test_a_forked_copy_of_the_client_is_forked_and_inert_and_the_parent_exports(
        tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", _FORKED_COPY, str(tmp_path)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FORK-EXIT 0" in proc.stdout and "PARENT CLOSED" in proc.stdout, proc.stdout
    assert len(read_file_spans(tmp_path / "spans.jsonl")) == 3 * 3


@pytest.mark.parametrize("step_ring", ["off", "auto"])
@pytest.mark.parametrize("sample_ratio", [None, 0.0], ids=["every-step", "sampled"])
def test_steps_before_the_child_is_ready_feed_this_process_and_the_child_goes_on_from_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sample_ratio: float | None,
        step_ring: str) -> None:
    """The child's interpreter takes a while to start: the console and the metrics of the
    first steps do not wait for it; each step is counted once, on either side. A sampled
    run leaves every step to the child (its sampler's counts must match what it was sent),
    and so does a run whose child reads the step ring (the steps wait in the ring)."""
    from otel_train.export.process import launch
    from otel_train.export.process.client import ClientState

    monkeypatch.setattr(launch, "_BOOT", "import time; time.sleep(1.5); " + launch._BOOT)
    run = start_test_run(tmp_path, prometheus_port=0, sample_ratio=sample_ratio,
                         sample_keep_first_steps=2, step_ring=step_ring)
    client, derived = run._telemetry.export, run._telemetry.derived
    assert client.reads_ring == (step_ring == "auto")
    _train(run, 20)
    run._telemetry.worker.drain()  # the child is not up: this process feeds the chain
    assert client.state is ClientState.STARTING
    fed_here = 20 if sample_ratio is None and step_ring == "off" else 0
    assert derived.shared._assembler.views == fed_here
    assert derived.costs()["steps"] == fed_here
    _wait_ready(client)
    _train(run, 30, start=20)
    costs = run.costs()  # the child's state: it went on from the steps fed here
    assert costs["steps"] == 50
    assert costs["operations"]["val_loss"]["calls"] == 10
    assert derived.shared._assembler.views == fed_here  # the rest were the child's
    metrics = _scrape(run.prometheus_url)
    assert metrics['otel_train_steps_total{rank="0"}'] == 50
    run.shutdown(timeout=10)
    written = json.loads((tmp_path / "monitoring_costs.json").read_text())
    assert written["steps"] == 50
    # every step exported once, the slow-step marks of the early ones made here included
    roots = sorted(s.attributes["train.step"] for s in run_spans(run) if s.name == "train.step")
    if sample_ratio is None:
        assert roots == list(range(50))
    else:  # the first two kept, most of the rest left out (a us step may look slow)
        assert roots[:2] == [0, 1] and len(roots) < 25
        assert metrics['otel_train_spans_sampled_out_total{rank="0"}'] > 0


def test_steps_fed_here_before_a_child_that_never_started_are_counted_once_at_the_take_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The shutdown gives up on a child still starting: the frames it never read were fed
    to this process's chain when they were queued, so the take-over exports them and feeds
    them no second time (a SIGTERM soon after the start on a loaded machine)."""
    from otel_train.export.process import launch
    from otel_train.export.process.client import ClientState

    monkeypatch.setattr(launch, "_BOOT", "import time; time.sleep(30); " + launch._BOOT)
    run = start_test_run(tmp_path)
    client = run._telemetry.export
    _train(run, 20)
    run._telemetry.worker.drain()
    assert client.state is ClientState.STARTING
    run.shutdown(timeout=2)
    assert client._lifecycle.state in (ClientState.TAKEN_OVER, ClientState.CLOSED)
    written = json.loads((tmp_path / "monitoring_costs.json").read_text())
    assert written["steps"] == 20
    assert written["operations"]["val_loss"]["calls"] == 4
    roots = sorted(s.attributes["train.step"] for s in read_file_spans(tmp_path / "spans.jsonl")
                   if s.name == "train.step")
    assert roots == list(range(20))


def _spans_of(steps: int, start: int = 0) -> int:
    """Spans ``_train`` makes: the root, data, forward, backward; val_loss every 5th step."""
    return sum(4 + (i % 5 == 0) for i in range(start, start + steps))


KILL_ROUNDS = 10
STEPS_PER_ROUND = 1200


class _KillingReceiver(GrpcOtlpReceiver):
    """A collector that kills the exporter process (SIGKILL) once ``kill_after`` more spans
    have arrived: after it took the request and before it answers, so the exporter never
    learns that this batch arrived (the one case no count can know for sure)."""

    kill_pid: int | None = None
    kill_after = 0
    killed_at: int | None = None

    def _record(self, request: Any, headers: dict[str, str]) -> None:
        super()._record(request, headers)
        with self._cond:
            count = self._span_count
            pid, self.kill_pid = (self.kill_pid, None) if count >= self.kill_after else (
                None, self.kill_pid)
        if pid is not None:
            self.killed_at = count
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(180)  # ~17 s on an idle 2-core VM; room for a loaded one
@pytest.mark.parametrize("step_ring", ["off", "on"])
def test_a_child_killed_mid_export_leaves_every_span_delivered_or_counted_in_every_round(
        tmp_path: Path, step_ring: str) -> None:
    # The child is killed (SIGKILL) while it streams batches to a real collector, 10 times
    # in a row: in even rounds by the collector between taking a batch and answering it, in
    # odd rounds at a random moment. The collector's own count is the truth of what was
    # delivered: every span emitted reaches it or is counted dropped, exactly. What the
    # child had not confirmed is sent again from here, so the batch in flight at the kill
    # may arrive twice: the duplicates are at most what was sent again, and none at all is
    # left out (the kill at a random moment mostly finds the child idle, all confirmed).
    import random

    rng = random.Random(41)
    lines = []
    emitted = _spans_of(STEPS_PER_ROUND)
    with _KillingReceiver() as recv:
        for round_ in range(KILL_ROUNDS):
            recv.clear()
            base = recv.span_count()  # (cumulative)
            run = start_test_run(tmp_path / f"round{round_}", exporter="otlp",
                                 otlp_endpoint=recv.endpoint, otlp_protocol="grpc",
                                 spans_path=None, export_interval_seconds=0.01,
                                 export_batch_size=64, step_ring=step_ring)
            client = run._telemetry.export
            assert client.reads_ring == (step_ring == "on")  # the child reads the ring
            run.flush(timeout_seconds=20)  # the child is up
            killer = None
            recv.killed_at = None
            if round_ % 2 == 0:
                recv.kill_after = base + rng.randrange(200, emitted - 1000)
                recv.kill_pid = client.pid
            else:
                def kill(delay_seconds: float, pid: int = client.pid) -> None:
                    time.sleep(delay_seconds)
                    recv.killed_at = recv.span_count()
                    os.kill(pid, signal.SIGKILL)

                # Drains of 256 steps go to the child every ~0.25 s, and it sends each in
                # batches of 64 spans: the kill lands anywhere in that.
                killer = threading.Thread(target=kill, args=(rng.uniform(0.3, 1.0),))
                killer.start()
            for step in run.steps(range(STEPS_PER_ROUND)):  # ~1.2 s of steps
                for phase in ("forward", "backward"):
                    with step.phase(phase):
                        pass
                if step.index % 5 == 0:
                    with step.monitor("val_loss"):
                        pass
                    time.sleep(0.005)
            if killer is not None:
                killer.join()
            run.shutdown(timeout=10)
            received = recv.spans()
            # A span sent again has the ids of its step (trace, root) but its phases' span
            # ids are drawn anew as it is encoded: a span is its trace, name and times.
            distinct = len({(s.trace_id, s.name, s.start_time_unix_nano,
                             s.end_time_unix_nano) for s in received})
            dropped = run.drops.total
            how = "by the collector" if round_ % 2 == 0 else "by a timer"
            lines.append(f"round {round_}: killed {how} with {recv.killed_at - base} spans "
                         f"received; emitted {emitted}, sent again {client.resent_spans}; "
                         f"received {len(received)} ({distinct} distinct), dropped {dropped}"
                         f" {run.drops.counts()}")
            print(lines[-1])
            assert client.state is ClientState.CLOSED and client.resent_spans >= 0
            assert distinct + dropped == emitted, lines[-1]
            assert len(received) - distinct <= client.resent_spans, lines[-1]
    print(f"{KILL_ROUNDS}/{KILL_ROUNDS} exact: delivered (distinct at the collector) + "
          "dropped == emitted")


def test_with_the_ring_a_child_stopped_at_shutdown_leaves_the_unread_ring_counted(
        tmp_path: Path) -> None:
    # The child reads the step ring (step_ring="on"); stopped (SIGSTOP), it reads nothing
    # more. The shutdown keeps its bound, kills the child at the deadline, and counts every
    # step the child never settled as shutdown_timeout: delivered + dropped = emitted.
    run = start_test_run(tmp_path, step_ring="on", startup_span=False,
                         export_interval_seconds=0.01)
    client = run._telemetry.export
    assert client.reads_ring
    for step in run.steps(range(50)):
        with step.phase("forward"):
            pass
    run.flush(timeout_seconds=20)  # the child is up and has exported those
    os.kill(client.pid, signal.SIGSTOP)
    try:
        for step in run.steps(range(50, 250)):
            with step.phase("forward"):
                pass
        began = time.monotonic()
        run.shutdown(timeout=2)
        took = time.monotonic() - began
    finally:
        try:
            os.kill(client.pid, signal.SIGCONT)
        except OSError:
            pass
    assert took < 4, took  # the bound, and a margin for a loaded machine
    assert _wait_gone(client.pid, 5)
    delivered = [s for s in read_file_spans(tmp_path / "spans.jsonl")]
    dropped = run.drops.counts()
    assert set(dropped) == {"shutdown_timeout"} and dropped["shutdown_timeout"] >= 200 * 3
    assert len(delivered) + dropped["shutdown_timeout"] == 250 * 3  # root, data, forward
    assert sorted({s.attributes["train.step"] for s in delivered}) == list(range(50))
