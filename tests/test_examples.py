"""Every example runs in seconds on a CPU, with few steps, and exports the expected traces.

(``examples/zero_code.py`` runs under ``opentelemetry-instrument`` in
``test_integrations_instrumentor.py``; ``examples/distributed.py`` under ``torchrun`` in
``test_integrations_distributed.py``.)
"""

from __future__ import annotations

import os
import subprocess
from collections import Counter

import pytest
import torch
from integration_support import (
    EXAMPLES,
    PYTHON,
    REPO,
    children,
    monitor_roots,
    step_roots,
    subprocess_env,
)
from otlp_receivers import GrpcOtlpReceiver


def _run_example(tmp_path, name: str, *args: str) -> list:
    with GrpcOtlpReceiver() as recv:
        proc = subprocess.run([PYTHON, str(EXAMPLES / name), *args],
                              env=subprocess_env(recv, tmp_path), capture_output=True,
                              text=True, timeout=180, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return recv.spans()  # the run flushed and shut down before the process exited


def test_tiny_gpt_steps_carry_inference_and_val_loss_on_eval_steps(tmp_path) -> None:
    spans = _run_example(tmp_path, "tiny_gpt.py", "--steps", "4", "--eval-every", "2")
    roots = step_roots(spans)
    assert sorted(roots) == [0, 1, 2, 3]
    for index, root in roots.items():
        names = [s.name for s in children(spans, root)]
        expected = ["data", "forward", "backward", "optimizer"]
        assert names == expected + (["inference", "val_loss"] if index % 2 == 0 else [])
    val = [s for s in spans if s.name == "val_loss"]
    assert all(c.name == "data" and c.attributes["train.dataloader"] == "val"
               and c.attributes["train.phase.kind"] == "monitor"
               for v in val for c in children(spans, v))


def test_hf_trainer_example_has_micro_steps_and_evaluation(tmp_path) -> None:
    spans = _run_example(tmp_path, "hf_trainer.py", "--steps", "2", "--eval-every", "1",
                         "--accumulation", "2")
    roots = step_roots(spans)
    assert sorted(roots) == [0, 1]
    for root in roots.values():
        names = [s.name for s in children(spans, root)]
        assert names == ["data", "micro_step", "micro_step", "optimizer", "log", "val_loss"]
    assert [s.name for s in monitor_roots(spans)] == ["val_loss", "inference"]


def test_lightning_example_validates_two_named_loaders(tmp_path) -> None:
    spans = _run_example(tmp_path, "lightning_trainer.py", "--steps", "4", "--val-every", "2")
    assert sorted(step_roots(spans)) == [0, 1, 2, 3]
    val = monitor_roots(spans, "val_loss")
    assert [s.attributes["train.dataloader"] for s in val] == ["clean", "noisy"] * 2


def test_multi_dataloader_example_tags_steps_and_validation_by_loader(tmp_path) -> None:
    spans = _run_example(tmp_path, "multi_dataloader.py", "--steps", "8", "--eval-every", "4",
                         "--aux-weight", "0.5")
    roots = step_roots(spans)
    assert len(roots) == 8
    assert set(r.attributes["train.dataloader"] for r in roots.values()) == {"main", "aux"}
    for root in roots.values():
        data = children(spans, root)[0]
        assert data.name == "data"
        assert data.attributes["train.dataloader"] == root.attributes["train.dataloader"]
    val = [s for s in spans if s.name == "val_loss"]
    assert len(val) == 2
    loaders = Counter(c.attributes["train.dataloader"] for v in val
                      for c in children(spans, v))
    assert set(loaders) == {"val_main", "val_aux"}


def test_rl_example_steps_are_made_of_the_users_own_phases(tmp_path) -> None:
    spans = _run_example(tmp_path, "rl_custom_phases.py", "--steps", "6")
    roots = step_roots(spans)
    assert len(roots) == 6
    full = ["generation", "test_generation", "log_probs", "execution", "training"]
    shapes = [[s.name for s in children(spans, r) if s.name != "reward_log"]
              for r in roots.values()]
    assert all(shape in (full, ["generation"]) for shape in shapes)
    assert full in shapes
    skipped = [r for r in roots.values() if r.attributes.get("train.skipped")]
    assert len(skipped) == shapes.count(["generation"])


ALL = ["tiny_gpt.py", "hf_trainer.py", "lightning_trainer.py", "multi_dataloader.py",
       "rl_custom_phases.py", "distributed.py", "zero_code.py"]


def test_an_example_says_at_start_which_device_it_trains_on(tmp_path) -> None:
    with GrpcOtlpReceiver() as recv:
        proc = subprocess.run([PYTHON, str(EXAMPLES / "tiny_gpt.py"), "--steps", "2",
                               "--eval-every", "2", "--device", "cpu"],
                              env=subprocess_env(recv, tmp_path), capture_output=True,
                              text=True, timeout=180, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.splitlines()[0] == "tiny_gpt: training on cpu (--device cpu)"
        assert sorted(step_roots(recv.spans())) == [0, 1]


@pytest.mark.parametrize("name", ALL)
def test_every_example_refuses_cuda_where_there_is_none_naming_device(tmp_path,
                                                                       name: str) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present here")
    proc = subprocess.run([PYTHON, str(EXAMPLES / name), "--steps", "1", "--device", "cuda"],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True,
                          text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "--device cuda: no CUDA device is available" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("name", ALL)
def test_every_example_documents_how_to_run_it(name: str) -> None:
    text = (EXAMPLES / name).read_text()
    assert "Usage::" in text and "--steps" in text


_EXAMPLE_NAMES = ["tiny_gpt.py", "hf_trainer.py", "lightning_trainer.py", "multi_dataloader.py",
                  "rl_custom_phases.py", "distributed.py", "zero_code.py"]


@pytest.mark.parametrize("name", _EXAMPLE_NAMES)
def test_an_examples_endpoint_is_the_port_of_the_protocol_it_runs_with(name: str) -> None:
    # The default protocol is http/protobuf (port 4318); 4317 is the gRPC port and must come
    # with OTEL_EXPORTER_OTLP_PROTOCOL=grpc on the same command.
    text = (EXAMPLES / name).read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if ":4317" in line:
            assert "OTEL_EXPORTER_OTLP_PROTOCOL=grpc" in line, line
        if ":4318" in line:
            assert "OTEL_EXPORTER_OTLP_PROTOCOL=grpc" not in line, line


@pytest.mark.parametrize("name", _EXAMPLE_NAMES)
def test_an_examples_docstring_speaks_to_its_reader_not_of_the_projects_notes(name: str) -> None:
    text = (EXAMPLES / name).read_text()
    for word in ("field notes", "seed 00", "the notes"):
        assert word not in text, f"{name}: {word!r}"
