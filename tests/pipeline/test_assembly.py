"""Assembly: a disabled run (OTEL_SDK_DISABLED, enabled=False, OTEL_TRAIN_ENABLED=false) has a
working API and nothing else: no thread, no socket, no file, no crash on a taken port."""

from __future__ import annotations

import gzip
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from train_helpers import clean_env  # noqa: F401  (autouse fixture)

import otel_train


def _socket_fds() -> int:
    fd_dir = Path("/proc/self/fd")
    count = 0
    for fd in fd_dir.iterdir():
        try:
            if os.readlink(fd).startswith("socket:"):
                count += 1
        except OSError:
            pass
    return count


def _train(run: otel_train.Run) -> list[int]:
    seen = []
    for step in run.steps(range(5)):
        with step.phase("forward"):
            seen.append(step.batch)
        step.set_attribute("train.loss", 0.5)
        if step.index == 3:
            with step.monitor("val_loss"):
                for _ in step.iter_data(range(2), loader="val"):
                    pass
    with run.monitor("checkpoint"):
        pass
    with run.step() as step, step.phase("data"):
        pass
    return seen


@pytest.mark.parametrize("step_ring", ["off", "on"])
@pytest.mark.parametrize("how", ["OTEL_SDK_DISABLED", "OTEL_TRAIN_ENABLED", "argument"])
def test_a_disabled_run_trains_with_no_thread_socket_or_file(tmp_path, monkeypatch, capsys,
                                                             how, step_ring):
    kwargs = {"step_ring": step_ring}  # on: no ring either (no memory, no exporter process)
    if how == "OTEL_SDK_DISABLED":
        monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    elif how == "OTEL_TRAIN_ENABLED":
        monkeypatch.setenv("OTEL_TRAIN_ENABLED", "false")
    else:
        kwargs["enabled"] = False
    monkeypatch.chdir(tmp_path)
    threads = {t.ident for t in threading.enumerate()}
    sockets = _socket_fds()
    with socket.socket() as taken:  # a taken metrics port must not matter to a disabled run
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with otel_train.start_run(prometheus_port=port, status_dir=str(tmp_path / "run"),
                                  **kwargs) as run:
            # nothing new (threads an earlier test left behind may end meanwhile)
            assert {t.ident for t in threading.enumerate()} <= threads
            assert _socket_fds() <= sockets + 1  # only the test's own socket
            assert _train(run) == [0, 1, 2, 3, 4]
            assert run.prometheus_url is None and run.spans_path is None
            assert run.costs()["enabled"] is False
            assert run.flush() is True
            assert run._recorder.ring is None
    assert list(tmp_path.iterdir()) == []  # no status dir, no span file, no costs file
    assert run.dropped_spans() == {}
    banner = capsys.readouterr().err
    assert "disabled" in banner and ("OTEL_" in banner or "enabled" in banner)


def test_a_disabled_run_neither_imports_torch_nor_synchronizes(tmp_path):
    script = textwrap.dedent("""
        import sys, otel_train
        with otel_train.start_run(enabled=False, console=False) as run:
            for step in run.steps(range(3)):
                with step.phase("forward"):
                    pass
        print("torch" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path)
    assert out.stdout.strip() == "False", out.stderr


def _patched_after_construction(source: str) -> list[str]:
    """``line: target`` for each assignment to another object's attribute (``x.y = ...``
    with ``x`` not ``self``): a part wired after it was made."""
    import ast
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign))
                   else [])
        for target in targets:
            if isinstance(target, ast.Attribute) and not (
                    isinstance(target.value, ast.Name) and target.value.id == "self"):
                found.append(f"{node.lineno}: {ast.unparse(target)}")
    return found


def test_the_builder_passes_everything_at_construction_and_patches_no_part_after():
    assembly = Path(otel_train.__file__).parent / "pipeline" / "assembly.py"
    assert _patched_after_construction(assembly.read_text()) == []
    # The check sees the wiring it forbids.
    assert _patched_after_construction(
        "sampler.downstream = export\nbuilder.host_rss_every_steps = 2\n") == [
        "1: sampler.downstream", "2: builder.host_rss_every_steps"]


def test_the_derived_stage_and_chain_pass_everything_at_construction_and_patch_no_part_after():
    derived = Path(otel_train.__file__).parent / "derived"
    for name in ("stage.py", "chain.py"):
        assert _patched_after_construction((derived / name).read_text()) == [], name
    # A part reached through ``self`` is another object all the same.
    assert _patched_after_construction(
        "self.metrics.progress = p\nself.console.throughput = t\nself.remote = c\n") == [
        "1: self.metrics.progress", "2: self.console.throughput"]


def test_a_run_holds_the_parts_the_builder_made(tmp_path: Path):
    with otel_train.start_run(exporter="none", prometheus_port=None, console=False,
                              status_dir=str(tmp_path)) as run:
        recorder = run._recorder
        assert recorder.batch_counter is run._counter  # given at construction
        assert run.self_cost.device_work is None  # CPU: no device work to time
        for step in run.steps(range(3)):
            step.count(batch=[[1, 2], [3, 4]])
        assert run.costs()["steps"] == 3


def test_an_exporter_process_that_cannot_start_gives_the_planned_in_process_stage_and_why(
        tmp_path: Path, monkeypatch, caplog):
    from otel_train.pipeline import assembly

    def no_fork(*args, **kwargs):
        raise OSError("no fork")

    monkeypatch.setattr(assembly, "ExportProcessClient", no_fork)
    with otel_train.start_run(prometheus_port=None, console=False,
                              status_dir=str(tmp_path)) as run:
        plan = run._telemetry.plan
        assert plan.route == "in-process stage" and plan.export.kind == "jsonl"
        assert "the exporter process could not start: OSError('no fork')" in plan.reasons
        _train(run)
    assert "could not start the exporter process" in caplog.text
    assert run.spans_path is not None
    assert b"train.step" in gzip.decompress(run.spans_path.read_bytes())
