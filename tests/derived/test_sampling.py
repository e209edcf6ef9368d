"""Sampling that keeps what matters: the same ordinary steps on every rank, every slow,
failed, monitoring and first step on the rank that saw it, and metrics that count every step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
from opentelemetry.trace import SpanContext, Status, StatusCode
from otlp_receivers import GrpcOtlpReceiver
from prometheus_client.parser import text_string_to_metric_families
from train_helpers import clean_env, run_spans, start_test_run  # noqa: F401  (autouse)

from otel_train.common import attributes as A
from otel_train.common.identity import step_trace_id
from otel_train.common.options import RunOptions
from otel_train.derived.sampling import SAMPLE_REASON, StepTailSampler
from otel_train.pipeline.plan import resolve_sample_ratio
from otel_train.common.trace_ids import SAMPLED

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import json, sys, time, urllib.request
    import otel_train
    rank, endpoint, status = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    metrics_there = sys.argv[4] == "1"
    slow = {0: {40, 120}, 1: {70, 150}}[rank]
    run = otel_train.start_run(
        run_id="sampled-run", rank=rank, world_size=2, sample_ratio=0.1,
        sample_keep_first_steps=10, exporter="otlp", otlp_endpoint=endpoint,
        otlp_protocol="grpc", prometheus_port=0, console=False, status_dir=status,
        export_interval_seconds=0.2, metrics_in_export_process=metrics_there,
        device_sync="off")
    for step in run.steps(range(200)):
        with step.phase("forward"):
            time.sleep(0.08 if step.index in slow else 0.002)
        with step.phase("backward"):
            pass
        if step.index == 100:
            with step.monitor("inference"):
                time.sleep(0.005)
    run.flush()
    with urllib.request.urlopen(run.prometheus_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    run.shutdown()
    print(json.dumps({"metrics": text}))
""")
PLANTED_SLOW = {0: {40, 120}, 1: {70, 150}}


def _metric(text: str, name: str, **labels: str) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise KeyError(name)


# The metrics and the decision run in the exporter process, or here: the span worker sends
# the records there after its drain's views went through the metrics (which mark the slow
# steps the decision keeps).
@pytest.mark.parametrize("metrics_there", [True, False], ids=["exporter-process", "here"])
def test_two_ranks_keep_the_same_ordinary_steps_and_every_step_that_matters(
        tmp_path: Path, metrics_there: bool):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    with GrpcOtlpReceiver() as rx:
        procs = [subprocess.Popen(
            [sys.executable, str(script), str(rank), rx.endpoint, str(tmp_path / f"r{rank}"),
             "1" if metrics_there else "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for rank in (0, 1)]
        outs = [p.communicate(timeout=90) for p in procs]
        for p, (out, err) in zip(procs, outs):
            assert p.returncode == 0, err[-3000:]
        roots = rx.spans("train.step")
    metrics = [json.loads(out.strip().splitlines()[-1])["metrics"] for out, _ in outs]

    expected = {s for s in range(10, 200) if _sdk_keeps(step_trace_id("sampled-run", s), 0.1)}
    assert 5 <= len(expected) <= 40  # about 10% of 190
    kept: dict[int, dict[int, str]] = defaultdict(dict)
    slow_kept: dict[int, set[int]] = defaultdict(set)
    for r in roots:
        rank, step = r.attributes["train.rank"], r.attributes["train.step"]
        kept[rank][step] = r.attributes[SAMPLE_REASON]
        if r.attributes["train.slow"]:
            slow_kept[rank].add(step)
    for rank in (0, 1):
        steps = kept[rank]
        # Every ordinary step the trace-id ratio keeps, on both ranks (so its trace is whole).
        assert expected <= set(steps), sorted(expected - set(steps))
        assert {s for s, why in steps.items() if why == "ratio"} <= expected
        # Anything else kept was kept for a reason that matters on this rank.
        assert {why for s, why in steps.items() if s not in expected} <= {
            "slow", "monitor", "first", "error"}
        assert set(range(10)) <= set(steps)
        assert steps[100] in ("monitor", "slow", "ratio") and 100 in steps
        assert PLANTED_SLOW[rank] <= slow_kept[rank], (rank, sorted(slow_kept[rank]))
        for s in PLANTED_SLOW[rank]:
            assert steps[s] == "slow"
        # The metrics saw every step; what sampling left out is counted, not dropped.
        text = metrics[rank]
        assert _metric(text, "otel_train_steps_total", rank=str(rank)) == 200
        assert _metric(text, "otel_train_slow_steps_total", rank=str(rank)) >= 2
        spans_per_step = 4  # train.step, data, forward, backward
        assert _metric(text, "otel_train_spans_sampled_out_total", rank=str(rank)) == \
            spans_per_step * (200 - len(steps))
        for fam in text_string_to_metric_families(text):
            if fam.name == "otel_train_spans_dropped":
                assert all(s.value == 0 for s in fam.samples), fam.samples
    # The ordinary steps kept are literally the same on both ranks.
    ordinary = [{s for s, why in kept[r].items() if why == "ratio"} | (expected & set(kept[r]))
                for r in (0, 1)]
    assert ordinary[0] == ordinary[1] == expected


def test_sample_ratio_comes_from_the_option_or_the_standard_sampler_variables():
    opts = RunOptions.resolve(environ={})
    assert resolve_sample_ratio(opts, env={}) is None
    assert resolve_sample_ratio(RunOptions.resolve(environ={}, sample_ratio=0.25), env={
        "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"}) == 0.25
    for name in ("traceidratio", "parentbased_traceidratio"):
        assert resolve_sample_ratio(opts, env={"OTEL_TRACES_SAMPLER": name,
                                               "OTEL_TRACES_SAMPLER_ARG": "0.1"}) == 0.1
    # always_off keeps its SDK meaning (export nothing): not a ratio of ours
    assert resolve_sample_ratio(opts, env={"OTEL_TRACES_SAMPLER": "always_off"}) is None
    assert resolve_sample_ratio(opts, env={"OTEL_TRACES_SAMPLER": "traceidratio",
                                           "OTEL_TRACES_SAMPLER_ARG": "x"}) is None
    with pytest.raises(ValueError, match="sample_ratio"):
        RunOptions.resolve(environ={}, sample_ratio=1.5)


def _sdk_keeps(trace_id: int, ratio: float) -> bool:
    """The OpenTelemetry SDK's own TraceIdRatioBased decision."""
    sdk = TraceIdRatioBased(ratio)
    return sdk.should_sample(None, trace_id, "x").decision.is_sampled()


def test_the_ratio_rule_is_the_sdks_traceidratio_rule():
    out = _Collect()
    sampler = StepTailSampler(0.1, keep_first_steps=0, downstream=out)  # type: ignore[arg-type]
    for step in range(500):
        for span in _step(step_trace_id("r", step), step):
            sampler.on_end(span)
    kept = {s.attributes[A.STEP] for s in out.spans if s.name == A.STEP_SPAN_NAME}
    assert kept == {s for s in range(500) if _sdk_keeps(step_trace_id("r", s), 0.1)}
    assert 20 <= len(kept) <= 80  # about 10% of 500


class _Collect:
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


def _step(trace_id: int, step: int, error: bool = False, kind: str = "train"):
    root = SpanContext(trace_id, 1, False, SAMPLED)
    child = ReadableSpan(name="forward", context=SpanContext(trace_id, 2, False, SAMPLED),
                         parent=root, attributes={A.PHASE_KIND: kind},
                         status=Status(StatusCode.ERROR if error else StatusCode.UNSET))
    top = ReadableSpan(name=A.STEP_SPAN_NAME, context=root, parent=None,
                       attributes={A.STEP: step, A.SLOW: False})
    return [child, top]


def test_a_failed_step_and_a_monitoring_step_are_kept_even_at_ratio_zero():
    out = _Collect()
    sampler = StepTailSampler(0.0, keep_first_steps=1, downstream=out)  # type: ignore[arg-type]
    for span in (_step(11, 0) + _step(12, 5) + _step(13, 6, error=True)
                 + _step(14, 7, kind="monitor")):
        sampler.on_end(span)
    reasons = {s.attributes[A.STEP]: s.attributes[SAMPLE_REASON] for s in out.spans
               if s.name == A.STEP_SPAN_NAME}
    assert reasons == {0: "first", 6: "error", 7: "monitor"}
    assert (sampler.sampled_out_steps, sampler.sampled_out_spans) == (1, 2)


def test_spans_whose_root_never_comes_are_exported_not_lost():
    out = _Collect()
    sampler = StepTailSampler(0.0, downstream=out, max_pending_traces=2)  # type: ignore
    for tid in (21, 22, 23):
        sampler.on_end(_step(tid, 50)[0])  # children only
    assert len(out.spans) == 1  # the oldest, evicted
    sampler.shutdown()
    assert len(out.spans) == 3


def test_a_run_without_sampling_exports_every_step(tmp_path: Path):
    run = start_test_run(tmp_path)
    for _ in run.steps(range(30)):
        pass
    run.shutdown()
    roots = [s for s in run_spans(run) if s.name == A.STEP_SPAN_NAME]
    assert len(roots) == 30
    assert all(SAMPLE_REASON not in s.attributes for s in roots)


@pytest.mark.parametrize("where", [
    {"step_ring": "off"},  # decided in the exporter process, after the derived metrics there
    {"metrics_in_export_process": False},  # decided here, exported from the exporter process
    {"export_process": False},  # decided and exported here
    {"step_ring": "on"},  # decided in the exporter process, which reads the step ring
    {},  # the same, the step ring by default (auto)
])
def test_a_sampled_run_writes_only_kept_steps_and_keeps_user_spans_with_their_step(
        tmp_path: Path, where: dict):
    from opentelemetry import trace
    run = start_test_run(tmp_path, sample_ratio=0.0, sample_keep_first_steps=2, **where)
    there = "metrics_in_export_process" not in where and "export_process" not in where
    assert (run._telemetry.derived.remote is not None) is there
    assert run._telemetry.client is None or run._telemetry.client.reads_ring == (
        there and where.get("step_ring") != "off")
    tracer = trace.get_tracer("user")
    for step in run.steps(range(20)):
        with step.phase("forward"), tracer.start_as_current_span("user-work"):
            pass
    run.shutdown()
    spans = run_spans(run)
    # (A microsecond step can be flagged slow next to its neighbours: that is kept too.)
    steps = sorted(s.attributes[A.STEP] for s in spans
                   if s.name == A.STEP_SPAN_NAME and not s.attributes[A.SLOW])
    assert steps == [0, 1]
    kept_traces = {s.trace_id for s in spans if s.name == A.STEP_SPAN_NAME}
    users = [s for s in spans if s.name == "user-work"]
    assert len(users) == len(kept_traces) and {u.trace_id for u in users} == kept_traces
    assert run.dropped_spans() == {}


def test_span_records_are_kept_for_the_same_reasons_as_spans_at_ratio_zero(tmp_path: Path):
    """The row path (span records, the exporter process's input) decides as the span path."""
    run = start_test_run(tmp_path, exporter="none")
    run._telemetry.worker.paused = True
    for step in run.steps(range(9)):
        if step.index == 6:
            with pytest.raises(RuntimeError), step.phase("forward"):
                raise RuntimeError("nan loss")
        elif step.index == 7:
            with step.monitor("val_loss"):
                pass
        else:
            with step.phase("forward"):
                pass
    with run.monitor("checkpoint"):
        pass
    builder = run._telemetry.builder
    recs = [builder.record(r) for r in list(run._recorder.queue)]
    run.shutdown(timeout=5)
    out = _Collect()
    sampler = StepTailSampler(0.0, keep_first_steps=1, downstream=out)  # type: ignore[arg-type]
    # A user's failed span held for step 5's trace: the step is kept for it.
    held_for = recs[5][1]
    failed = ReadableSpan(name="user", context=SpanContext(held_for, 99, False, SAMPLED),
                          parent=SpanContext(held_for, 98, False, SAMPLED),
                          status=Status(StatusCode.ERROR))
    sampler.on_end(failed)
    kept = {(rec[0], rec[6][A.STEP]): rec[6].get(SAMPLE_REASON)
            for rec in recs if sampler.keep_record(rec)}
    assert kept == {(A.STEP_SPAN_NAME, 0): "first", (A.STEP_SPAN_NAME, 5): "error",
                    (A.STEP_SPAN_NAME, 6): "error", (A.STEP_SPAN_NAME, 7): "monitor",
                    (A.CHECKPOINT_SPAN_NAME, 8): None}
    assert [s.name for s in out.spans] == ["user"]  # forwarded with its kept step
    assert sampler.sampled_out_steps == 5  # steps 1-4 and 8: ordinary


def test_the_exporter_process_decides_on_records_and_user_span_rows_as_on_spans(
        tmp_path: Path):
    """filter_frame (the exporter process's path): the same decisions as keep_record, user
    span rows going with their step, a user root decided on its own, and a row whose step
    never comes exported at the end (fail open)."""
    from otel_train.records.span_rows import record_span_count, row_from_span

    run = start_test_run(tmp_path, exporter="none")
    run._telemetry.worker.paused = True
    for step in run.steps(range(9)):
        with step.phase("forward"):
            pass
    builder = run._telemetry.builder
    recs = [builder.record(r) for r in list(run._recorder.queue)]
    run.shutdown(timeout=5)

    def user_row(trace_id, parent, failed=False, name="user"):
        return row_from_span(ReadableSpan(
            name=name, context=SpanContext(trace_id, 99, False, SAMPLED),
            parent=SpanContext(trace_id, 98, False, SAMPLED) if parent else None,
            status=Status(StatusCode.ERROR if failed else StatusCode.UNSET)))

    failed, plain = user_row(recs[5][1], True, failed=True), user_row(recs[2][1], True)
    root, orphan = user_row(12345, False, name="user-root"), user_row(777, True)
    sampler = StepTailSampler(0.0, keep_first_steps=1)
    kept, rows = sampler.filter_frame(recs, [failed, plain, root, orphan])
    assert {rec[6][A.STEP]: rec[6][SAMPLE_REASON] for rec in kept} == {0: "first", 5: "error"}
    assert rows == [failed]  # with its kept step; the plain one left out with step 2
    out_steps = [rec for rec in recs if rec not in kept]
    assert sampler.sampled_out_steps == len(out_steps) + 1  # and the user's root
    assert sampler.sampled_out_spans == sum(map(record_span_count, out_steps)) + 2
    assert sampler.release_held() == [orphan] and sampler.release_held() == []
    # The counts travel to the training process's copy with the chain's state.
    copy = StepTailSampler(0.0)
    copy.load_state(sampler.export_state())
    assert copy.sampled_out_spans == sampler.sampled_out_spans


def test_a_user_span_row_that_comes_after_its_step_follows_the_steps_decision(
        tmp_path: Path):
    """The exporter process reading the step ring builds a step as it ends; the user spans
    inside it come later, with the training process's drain: each follows its step's
    decision (kept with a kept step, counted sampled out with a left-out one) instead of
    waiting for a step that already went."""
    from otel_train.records.span_rows import row_from_span

    run = start_test_run(tmp_path, exporter="none")
    run._telemetry.worker.paused = True
    for step in run.steps(range(4)):
        with step.phase("forward"):
            pass
    builder = run._telemetry.builder
    recs = [builder.record(r) for r in list(run._recorder.queue)]
    run.shutdown(timeout=5)

    def user_row(trace_id):
        return row_from_span(ReadableSpan(
            name="user", context=SpanContext(trace_id, 99, False, SAMPLED),
            parent=SpanContext(trace_id, 98, False, SAMPLED)))

    sampler = StepTailSampler(0.0, keep_first_steps=1)
    kept, rows = sampler.filter_frame(recs, [])  # the steps first: step 0 kept
    assert [rec[6][A.STEP] for rec in kept] == [0] and rows == []
    out_before = sampler.sampled_out_spans
    with_kept, with_out = user_row(recs[0][1]), user_row(recs[2][1])
    kept, rows = sampler.filter_frame([], [with_kept, with_out])
    assert kept == [] and rows == [with_kept]
    assert sampler.sampled_out_spans == out_before + 1
    assert sampler.release_held() == []  # nothing left waiting for a step
