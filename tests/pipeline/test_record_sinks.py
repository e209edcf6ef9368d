"""The span worker's one Export: each drain to the route's sinks, the exporter process's drain
end, ticks and sleeps forwarded to its client, and a null export where nothing is exported."""

from __future__ import annotations

import ast
import os
import time
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from train_helpers import clean_env, nested_step  # noqa: F401  (clean_env: autouse)

from otel_train.common.drop_counter import DropCounter
from otel_train.common.identity import RunIdentity
from otel_train.common.self_cost import SelfCostMeter
from otel_train.pipeline.record_sinks import Export, NullExport, SinkExport
from otel_train.pipeline.span_worker import RowRoute, SpanBuildWorker
from otel_train.recording.recorder import Recorder
from otel_train.records.step_records import StepRecordBuilder, epoch_offset_ns

pytestmark = pytest.mark.timeout(30)

IDENT = RunIdentity("run-x", rank=0, world_size=1, local_rank=0, run_id_source="option")
SPAN_WORKER = Path(__file__).resolve().parents[2] / "otel_train" / "pipeline" / "span_worker.py"


def _builder() -> StepRecordBuilder:
    return StepRecordBuilder(IDENT, Resource.create({"service.name": "export-test"}),
                             InstrumentationScope("otel_train", "0.1.0"), False, "cpu",
                             lambda tid: True, epoch_offset_ns())


class Sink:
    """A route's sink: what it was handed, and whether it was closed."""

    def __init__(self) -> None:
        self.records: list[tuple] = []
        self.closed = False

    def on_records(self, records, rows=()) -> None:
        self.records += records

    def close(self) -> None:
        self.closed = True


class Client:
    """Stands in for the exporter process's client: the calls the export forwards."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.calls: list[str] = []
        self.reports = True

    def end_drain(self) -> None:
        self.calls.append("end_drain")

    def tick(self, reports: bool) -> None:
        self.calls.append(f"tick {reports}")

    def wait_for_io(self, seconds: float, wake_fd: int) -> bool:
        self.calls.append("wait_for_io")
        time.sleep(min(seconds, 0.01))
        return self.reports


def test_the_null_export_takes_a_drain_and_says_it_has_no_exporter_process():
    export: Export = NullExport()
    export.on_records([("a",)], [("b",)])
    export.end_drain()
    export.tick(True)
    export.close()
    assert export.pid is None and not export.waits_on_io
    assert export.wait_for_io(0.0, -1) is False


def test_a_route_without_an_export_drains_into_the_null_export():
    drops = DropCounter()
    rec = Recorder(10, drops, None)
    for i in range(3):
        nested_step(rec, index=i)
    worker = SpanBuildWorker(rec, _builder(), RowRoute(None, None, IDENT.rank), drops,
                             SelfCostMeter(), 0.01)
    assert isinstance(worker._route.export, NullExport)
    assert worker.drain() == 3
    assert drops.counts() == {}  # nothing lost: nothing was to be exported


def test_each_sink_gets_every_drain_and_the_client_one_drain_end_per_drain():
    drops = DropCounter()
    rec = Recorder(10, drops, None)
    first, second, client = Sink(), Sink(), Client()
    export = SinkExport([first, second], process=client)  # type: ignore[arg-type]
    assert export.waits_on_io and export.pid == os.getpid()
    worker = SpanBuildWorker(rec, _builder(), RowRoute(None, export, IDENT.rank), drops,
                             SelfCostMeter(), 0.01)
    for i in range(2):
        nested_step(rec, index=i)
    worker.drain()
    nested_step(rec, index=2)
    worker.drain()
    assert len(first.records) == len(second.records) == 3
    assert client.calls == ["end_drain", "end_drain"]
    worker.stop(1.0)
    assert first.closed and second.closed


def test_between_drains_the_worker_sleeps_on_the_client_and_ticks_it_with_its_reports():
    drops = DropCounter()
    rec = Recorder(10, drops, None)
    client = Client()
    worker = SpanBuildWorker(rec, _builder(),
                             RowRoute(None, SinkExport([Sink()], process=client),  # type: ignore[arg-type]
                                      IDENT.rank),
                             drops, SelfCostMeter(), 0.01)
    worker.start()
    deadline = time.monotonic() + 5.0
    while "tick True" not in client.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.stop(1.0)
    assert "wait_for_io" in client.calls and "tick True" in client.calls


def test_without_an_exporter_process_the_export_forwards_nothing_and_never_waits_on_io():
    export = SinkExport([Sink()])
    assert export.pid is None and not export.waits_on_io
    export.end_drain()
    export.tick(True)
    assert export.wait_for_io(0.0, -1) is False


def _export_probes(source: str) -> list[int]:
    """Lines where ``getattr``/``hasattr`` probe something named like an export."""
    def named_export(arg: ast.expr) -> bool:
        name = (arg.attr if isinstance(arg, ast.Attribute)
                else arg.id if isinstance(arg, ast.Name) else "")
        return "export" in name
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr") and named_export(node.args[0])]


def test_the_span_worker_calls_its_export_by_name_never_probing_it():
    assert _export_probes(SPAN_WORKER.read_text()) == []
    # The check sees both ways a probe was written.
    assert _export_probes("tick = getattr(self._export, 'tick', None)\n"
                          "w = getattr(export, 'wait_for_io', None)\n") == [1, 2]


def _probes(source: str) -> list[int]:
    """Lines where ``getattr``/``hasattr`` probe anything at all."""
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")]


def test_the_span_worker_reads_its_recorder_by_name_never_probing_it():
    assert _probes(SPAN_WORKER.read_text()) == []
    assert _probes("p = getattr(recorder, 'probes', None)\nok = hasattr(r, 'keep_value')\n"
                   ) == [1, 2]
