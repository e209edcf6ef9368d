"""The HF Trainer and Lightning examples govern their own evaluation settings: an evaluation
made expensive is stretched past the trainer's interval, said on the console, and exported
as fewer val_loss spans than the trainer's interval alone would run."""

from __future__ import annotations

import re
import subprocess

import pytest
from integration_support import EXAMPLES, PYTHON, monitor_roots, subprocess_env
from otlp_receivers import GrpcOtlpReceiver

pytestmark = pytest.mark.timeout(400)


def _run(tmp_path, name: str, *args: str) -> tuple[str, str, list]:
    with GrpcOtlpReceiver() as recv:
        proc = subprocess.run([PYTHON, str(EXAMPLES / name), *args],
                              env=subprocess_env(recv, tmp_path), capture_output=True,
                              text=True, timeout=360, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout, proc.stderr, recv.spans()


def test_the_hf_example_stretches_eval_steps_when_evaluation_is_expensive(tmp_path) -> None:
    pytest.importorskip("transformers")
    # Each evaluation: 2 batches of 200 ms, every 5 steps of a tiny GPT-2 (tens of ms).
    out, err, spans = _run(tmp_path, "hf_trainer.py", "--steps", "100", "--eval-every", "5",
                           "--accumulation", "1", "--eval-ms", "200", "--govern")
    interval = int(re.search(r"^val_loss: every (\d+) steps \(asked 5\)$", out, re.M).group(1))
    assert interval > 5
    assert re.search(r"otel-train: val_loss every 5 -> \d+ steps: it costs", err)
    in_steps = [s for s in spans if s.name == "val_loss" and s.parent_span_id is not None]
    assert 2 <= len(in_steps) < 100 // 5


def test_the_lightning_example_stretches_val_check_interval(tmp_path) -> None:
    pytest.importorskip("lightning")
    # Each validation: 2 loaders x 2 batches of 20 ms, every 10 batches of a tiny MLP.
    out, err, spans = _run(tmp_path, "lightning_trainer.py", "--steps", "600",
                           "--val-every", "10", "--val-ms", "20", "--govern")
    interval = int(re.search(r"^val_loss: every (\d+) batches \(asked 10\)$", out,
                             re.M).group(1))
    assert interval > 10
    assert re.search(r"otel-train: val_loss every 10 -> \d+ steps: it costs", err)
    validations = len(monitor_roots(spans, "val_loss")) // 2  # a span per loader
    assert 2 <= validations < 600 // 10
