"""``otel-train demo``: trains, prints where everything goes even with --quiet (the banner
stays), writes the HTML report at the end, and ends with the next steps; ``--serve`` keeps
the metrics endpoint up after training until SIGINT."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from train_helpers import clean_env  # noqa: F401

from otel_train.cli.main import main
from otel_train.rundir.report_data import load_run

REPO = Path(__file__).resolve().parents[2]


def test_a_quiet_demo_still_prints_the_banner_and_where_the_report_went(tmp_path, capsys):
    code = main(["demo", "--steps", "6", "--eval-every", "5", "--quiet",
                 "--prometheus-port", "none", "--status-dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0
    assert "otel-train: run " in err
    assert f"spans   -> span file {tmp_path / 'spans.jsonl.gz'}" in err
    assert f"report  -> {tmp_path / 'report.html'} (written at the end)" in err
    assert f"otel-train: report -> {tmp_path / 'report.html'}" in err
    page = (tmp_path / "report.html").read_text()
    assert "Plotly" in page and "<script src=" not in page  # the chart library inlined
    assert "[demo] step" not in out  # quiet: no console timing report
    costs = json.loads((tmp_path / "monitoring_costs.json").read_text())
    assert set(costs["operations"]) == {"inference", "val_loss"}
    assert "inference" in out  # the costs table


def test_no_report_turns_the_report_off(tmp_path, capsys):
    assert main(["demo", "--steps", "2", "--eval-every", "0", "--quiet", "--no-report",
                 "--prometheus-port", "none", "--status-dir", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "report  ->" not in err and "report ->" not in err
    assert not (tmp_path / "report.html").exists()
    assert f"write the report       otel-train report {tmp_path}" in out


def test_the_demo_ends_with_the_next_steps(tmp_path, capsys):
    assert main(["demo", "--steps", "2", "--eval-every", "0", "--quiet",
                 "--prometheus-port", "none", "--status-dir", str(tmp_path)]) == 0
    last = capsys.readouterr().out.rstrip("\n").splitlines()[-5:]
    assert last[0] == "next steps:"
    assert last[1].split() == ["open", "the", "report", str(tmp_path / "report.html")]
    assert "otel-train demo --serve" in last[2] and "curl" in last[2]
    assert f"otel-train export {tmp_path}" in last[3] and "perfetto" in last[3]
    assert "OTEL_EXPORTER_OTLP_ENDPOINT=http://localhost:4318 otel-train demo" in last[4]


def _demo_process(status_dir: Path, *flags: str) -> subprocess.Popen:
    """The real command, a short run, a free metrics port, without the caller's OTEL_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.Popen(
        [sys.executable, "-m", "otel_train.cli", "demo", "--steps", "4", "--eval-every", "2",
         "--quiet", "--prometheus-port", "0", "--status-dir", str(status_dir), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _lines_until(proc: subprocess.Popen, prefix: str, timeout_seconds: float) -> list[str]:
    """Stdout lines up to the first that starts with ``prefix`` (the process goes on)."""
    lines: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith(prefix):
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(timeout_seconds), lines
    return lines


def test_serve_keeps_the_metrics_up_after_training_until_sigint(tmp_path):
    proc = _demo_process(tmp_path, "--serve")
    try:
        lines = _lines_until(proc, "serving ", timeout_seconds=180)
        url = lines[-1].split()[1]
        assert lines[-1] == f"serving {url} until Ctrl-C"
        assert f"  query the metrics      curl {url}" in lines
        body = urllib.request.urlopen(url, timeout=10).read().decode()
        assert 'otel_train_steps_total{rank="0"} 4.0' in body
        # The report written before serving holds every step, and the costs of the end
        # (the costs file lags the run by its interval).
        assert load_run(tmp_path).steps_per_rank == {0: 4}
        page = (tmp_path / "report.html").read_text()
        assert re.search(r"monitoring costs as the report was written \(rank 0\).*?over 4 "
                         r"steps", page)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "stopping: the run shuts down" in err
    # The run shut down: its targets file is gone, its endpoint closed.
    assert not (tmp_path / "prometheus_targets-rank0.json").exists()
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=5)


def test_serve_with_the_metrics_endpoint_off_is_refused(tmp_path, capsys):
    assert main(["demo", "--steps", "1", "--serve", "--quiet", "--no-report",
                 "--prometheus-port", "none", "--status-dir", str(tmp_path)]) == 2
    assert "--serve keeps the metrics endpoint up" in capsys.readouterr().err


def test_a_planted_slowdown_makes_the_phase_slower_by_its_share():
    from otel_train.cli.demo import PlantedSlowdown

    slowdown = PlantedSlowdown("forward:50")
    started = time.perf_counter()
    with slowdown("forward"):
        time.sleep(0.02)
    assert time.perf_counter() - started >= 0.03
    assert PlantedSlowdown("forward:20,optimizer:5").extra == {"forward": 0.2, "optimizer": 0.05}


@pytest.mark.parametrize("spec", ["data:20", "forward", "forward:-5", "forward:x"])
def test_a_bad_planted_slowdown_is_refused_before_training(spec, capsys):
    assert main(["demo", "--plant-slowdown", spec, "--quiet", "--prometheus-port", "none"]) == 2
    assert "--plant-slowdown" in capsys.readouterr().err


def test_the_demo_says_which_device_it_trains_on(tmp_path, capsys):
    assert main(["demo", "--steps", "2", "--eval-every", "1", "--device", "cpu", "--quiet",
                 "--no-report", "--prometheus-port", "none", "--status-dir", str(tmp_path)]) == 0
    assert "otel-train demo: training on cpu (--device cpu)" in capsys.readouterr().err
    assert load_run(tmp_path).steps_per_rank == {0: 2}


def test_device_auto_trains_on_the_accelerator_when_present_else_the_cpu(tmp_path, capsys):
    import torch

    assert main(["demo", "--steps", "2", "--eval-every", "0", "--quiet", "--no-report",
                 "--prometheus-port", "none", "--status-dir", str(tmp_path)]) == 0
    expected = torch.accelerator.current_accelerator().type if (
        torch.accelerator.is_available()) else "cpu"
    assert f"otel-train demo: training on {expected} (--device auto)" in capsys.readouterr().err


def test_device_cuda_without_a_cuda_device_is_refused_before_training(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present here")
    assert main(["demo", "--device", "cuda", "--quiet", "--no-report",
                 "--prometheus-port", "none", "--status-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "otel-train demo: --device cuda: no CUDA device is available" in err
    assert not (tmp_path / "monitoring_costs.json").exists()  # no run was started


def test_the_demos_batches_are_moved_to_its_device_as_part_of_the_fetch():
    import torch

    from otel_train.cli.demo import _batches

    data = torch.arange(200)
    # The meta device stands in for an accelerator: a tensor moved there keeps its shape.
    x, y = next(_batches(data, 8, 4, seed=0, device=torch.device("meta")))
    assert x.device.type == y.device.type == "meta" and x.shape == y.shape == (4, 8)
    cx, cy = next(_batches(data, 8, 4, seed=0, device=torch.device("cpu")))
    assert cx.device.type == "cpu" and torch.equal(cy[:, :-1], cx[:, 1:])
def test_the_demo_says_its_goodput_once(tmp_path, capsys):
    assert main(["demo", "--steps", "6", "--eval-every", "5", "--prometheus-port", "none",
                 "--status-dir", str(tmp_path), "--no-report"]) == 0
    out, err = capsys.readouterr()
    assert len(re.findall(r"goodput [\d.]+%", out + err)) == 1, out + err
    assert "otel-train: goodput " in err  # the run's own line, as it shuts down


def test_a_serving_demo_says_its_goodput_once(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_train.cli", "demo", "--steps", "4", "--eval-every", "2",
         "--prometheus-port", "0", "--status-dir", str(tmp_path), "--no-report", "--serve"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        lines = _lines_until(proc, "serving ", timeout_seconds=180)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    text = "\n".join(lines) + out + err
    assert len(re.findall(r"goodput [\d.]+%", text)) == 1, text


def test_the_demos_console_is_calm_and_says_no_share_before_it_means_something(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(REPO)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "otel_train.cli", "demo", "--prometheus-port", "none",
         "--no-report", "--status-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env)
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    err = done.stderr
    explained = re.findall(r"^otel-train: slow step \d+:", err, re.M)
    summed_up = re.findall(r"^otel-train: \d+ more slow steps? ", err, re.M)
    costs = json.loads((tmp_path / "monitoring_costs.json").read_text())
    print(f"demo: {costs['slow_steps']} slow steps, {len(explained)} explained, "
          f"{len(summed_up)} summary line(s), {len(err.splitlines())} console lines in "
          f"{seconds:.0f} s")
    assert len(explained) <= 3  # the first few; then summed up (a 1 s run: once at its end)
    assert len(summed_up) <= 1 + seconds / 30  # one per 30 s of steps at most, one at the end
    # The first verdicts wait for evidence; none says a share of a few steps (hundreds of %).
    verdicts = re.findall(r"\| monitoring (verdict: [^\n]*|[A-Z]+: [\d.]+%)", err)
    assert verdicts[0].startswith("verdict: not enough steps yet")
    shares = [float(v.split(": ")[1].rstrip("%")) for v in verdicts if not
              v.startswith("verdict")]
    # Unless a monitoring call itself stalled (a loaded machine can hold one for a second,
    # and a share is then truly over 100%), no share reaches 100% either.
    stalled = [name for name, op in costs["operations"].items()
               if op["max_seconds"] > 3 * op["steady_mean_seconds"]]
    assert shares and (stalled or max(shares) < 100.0), (shares, costs["operations"])
    # Why a figure disagrees with the verdict is said once per kind, not on every line.
    assert err.count("so the verdict stands") <= 3
