"""The GPU-default benchmark runs end to end on the CPU (smoke mode: the same loops, blocks and
table as on a GPU), and skips a device_sync mode this otel-train does not accept."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_gpu_default.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_gpu_default import accepted_modes, format_table  # noqa: E402

_RATIO = r"(\d+\.\d+)x \[(\d+\.\d+), (\d+\.\d+)\]"


def test_the_smoke_run_prints_one_table_with_every_mode_beside_the_truth_and_saves_blocks(
        tmp_path: Path) -> None:
    if not Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists():
        pytest.skip("no per-thread schedstat here")
    saved = tmp_path / "blocks.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, str(BENCH), "--smoke", "--save", str(saved)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "device: cpu (cpu)" in out
    accepted, refused = accepted_modes(["auto", "sync", "events", "monitor_sync"])
    assert {"auto", "sync", "events"} <= set(accepted)
    table = [line for line in out.splitlines() if line.startswith("|")]
    assert table[0].startswith("| variant | gpt step vs bare [95% CI] | mlp step vs bare")
    truth = re.search(r"truth: gpt (\d+\.\d)%, mlp (\d+\.\d)%", table[0])
    # Monitoring over training time: above 100% when the tiny smoke steps train for less
    # time than their monitoring takes (a loaded machine stretches either).
    assert truth and all(float(x) > 0.0 for x in truth.groups()), table[0]
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table[2:]}
    expected = [f"`{m}`" for m in accepted] + [
        '`auto`, no `set_attribute("train.loss", loss)`',
        "bare, monitoring synced and timed by hand (the truth)"]
    for label in expected:
        row = rows[label]
        for med, lo, hi in re.findall(_RATIO, row):
            assert float(lo) <= float(med) <= float(hi) and float(med) > 0.05
        assert len(re.findall(_RATIO, row)) == 2, row  # both workloads
    for mode in accepted:  # each run reports a monitoring share and an own cost
        row = rows[f"`{mode}`"]
        assert re.search(r"gpt \d+\.\d%; mlp \d+\.\d% \|", row), row
        assert re.search(r"gpt -?\d+\.\d\d% / -?\d+\.\d\d%; mlp -?\d+\.\d\d% / "
                         r"-?\d+\.\d\d%", row), row
    for mode, why in refused.items():  # before the mode exists: a line, and a skipped row
        assert f"skipped device_sync={mode}: not accepted by this otel-train" in out
        assert rows[f"`{mode}`"].startswith(f"| `{mode}` | skipped")
    # Progress: one line per block pair on stderr.
    assert "gpt auto: pair 1/1 bare " in proc.stderr and "mlp truth: pair 1/1" in proc.stderr
    data = json.loads(saved.read_text())
    for workload in ("gpt", "mlp"):
        results = data["workloads"][workload]
        assert set(results) == {"truth", *accepted, "auto:no-loss-attr"}
        for res in results.values():
            assert len(res["pairs"]) == 1 and all(b["wall"] > 0 and v["wall"] > 0
                                                  for b, v in res["pairs"])
        assert results["truth"]["monitoring_ns"] > 0
        assert results["auto"]["reported_monitoring_seconds"] > 0
        assert results["auto"]["reported_lost_ns"] > 0  # the hot path, at least
    assert not list(tmp_path.glob("bench-gpu-*")), "a run's temp dir is left behind"


def test_a_mode_the_options_refuse_is_reported_not_raised() -> None:
    ok, refused = accepted_modes(["auto", "no_such_mode"])
    assert ok == ["auto"]
    assert "device_sync" in refused["no_such_mode"] and "must be one of" in refused[
        "no_such_mode"]
    table = format_table({}, ["auto", "no_such_mode"], refused, ["gpt"])
    assert "| `no_such_mode` | skipped: device_sync does not accept it here |" in table


def test_on_cuda_the_blocks_end_with_torch_cuda_synchronize_and_the_table_names_the_card(
        monkeypatch) -> None:
    import torch

    import bench_gpu_default
    from otel_train.common import training_device

    calls: list[str] = []
    monkeypatch.setattr(training_device, "accelerator_device",
                        lambda _torch: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    device = bench_gpu_default.Device()
    assert (device.type, device.name) == ("cuda", "NVIDIA H200")
    figures = bench_gpu_default._block(bench_gpu_default.ThreadClock(), lambda: None, device)
    assert calls == ["synchronize"] and figures["wall"] > 0
