"""Fork and signals: a forked child never hangs or exports the parent's spans; SIGTERM and
SIGINT end a training run with its costs written, its drops counted and the exit status the
scheduler expects. Every scenario runs in a subprocess against a real OTLP receiver."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest
from otlp_receivers import HttpOtlpReceiver

pytestmark = pytest.mark.timeout(120)

_FORK_SCRIPT = textwrap.dedent("""
    import faulthandler, os, random, sys, time
    import otel_train

    endpoint, status_dir, step_ring = sys.argv[1], sys.argv[2], sys.argv[3]
    rng = random.Random(7)
    children = []
    with otel_train.start_run(exporter="otlp", otlp_endpoint=endpoint, run_id="parent",
                              prometheus_port=0, console=False, status_dir=status_dir,
                              export_interval_seconds=0.01, device_sync="off",
                              step_ring=step_ring,
                              shutdown_timeout_seconds=15) as run:  # a loaded CI machine
        for step in run.steps(range(240)):
            with step.phase("forward"):
                for _ in range(rng.randrange(0, 400)):
                    pass
            with step.phase("backward"):
                pass
            if rng.random() < 0.2:  # fork at random points, while the workers are busy
                kind = len(children) % 3
                pid = os.fork()
                if pid == 0:
                    # a hang shows its stack (stderr) and fails the child instead of stalling
                    faulthandler.dump_traceback_later(15, exit=True)
                    if kind == 0:
                        sys.exit(0)  # the inherited run's atexit path must not hang
                    if kind == 1:
                        os._exit(0)
                    # kind 2: the child trains on its own run, then exits normally
                    # stall_stacks=False: the run's stacks timer would replace the
                    # process-wide later-timer armed above (this test's hang net)
                    with otel_train.start_run(
                            exporter="otlp", otlp_endpoint=endpoint, prometheus_port=None,
                            run_id=f"child-{os.getpid()}", console=False, stall_stacks=False,
                            device_sync="off", shutdown_timeout_seconds=10,
                            status_dir=status_dir + f"/child-{os.getpid()}") as child:
                        for s in child.steps(range(3)):
                            with s.phase("forward"):
                                pass
                    sys.exit(0)
                children.append((pid, kind))
    hung = 0
    for pid, kind in children:
        deadline = time.monotonic() + 20  # a hang is forever; a loaded machine is slow
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                if os.waitstatus_to_exitcode(status) != 0:
                    print("CHILD-FAILED", pid, kind, status, flush=True)
                break
            if time.monotonic() > deadline:
                hung += 1
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                break
            time.sleep(0.01)
    print("CHILDREN", len(children), "HUNG", hung,
          "TRAINED", sum(1 for _, k in children if k == 2), flush=True)
""")


@pytest.mark.parametrize("step_ring", ["off", "on"])
def test_random_forks_never_hang_nor_export_the_parents_spans_twice(tmp_path: Path,
                                                                     step_ring: str) -> None:
    with HttpOtlpReceiver() as recv:
        proc = subprocess.run(
            [sys.executable, "-c", _FORK_SCRIPT, recv.endpoint, str(tmp_path), step_ring],
            capture_output=True, text=True, timeout=100)
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = next(x for x in proc.stdout.splitlines() if x.startswith("CHILDREN"))
        _, children, _, hung, _, trained = line.split()
        assert int(children) >= 20, proc.stdout
        assert int(hung) == 0, proc.stdout + proc.stderr[-3000:]
        assert "CHILD-FAILED" not in proc.stdout, proc.stdout + proc.stderr[-6000:]
        # the parent's 240 steps x 4 spans; each training child's 3 steps x 3 spans
        spans = recv.wait_for_spans(240 * 4 + int(trained) * 3 * 3, timeout_seconds=20)
    parent = [s for s in spans if s.attributes.get("train.run.id") == "parent"]
    roots = Counter(s.attributes["train.step"] for s in parent if s.name == "train.step")
    assert sorted(roots) == list(range(240))
    assert set(roots.values()) == {1}, "a parent step was exported twice (by a child)"
    assert len(parent) == 240 * 4  # root + data + forward + backward, each exactly once
    child_roots = [s for s in spans if s.name == "train.step"
                   and str(s.attributes.get("train.run.id")).startswith("child-")]
    assert len(child_roots) == int(trained) * 3  # children that train export their own run


_TRAIN_SCRIPT = textwrap.dedent("""
    import faulthandler, signal, sys, time
    import otel_train

    faulthandler.register(signal.SIGUSR1)  # the test asks for every thread's stack if stuck
    # SIGINT raises KeyboardInterrupt, as in a terminal, even when the test runner was
    # started with SIGINT ignored (a background job of a shell without job control):
    # Python then installs no handler, and the process inherits the ignore.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    endpoint, status_dir, use_with = sys.argv[1], sys.argv[2], sys.argv[3] == "with"
    run = otel_train.start_run(exporter="otlp", otlp_endpoint=endpoint, run_id="sig",
                               prometheus_port=None, console=False, status_dir=status_dir,
                               export_interval_seconds=0.05, shutdown_timeout_seconds=1.0,
                               costs_interval_seconds=3600, device_sync="off",
                               step_ring=sys.argv[4] if len(sys.argv) > 4 else "off")

    def loop():
        for step in run.steps(range(10**9)):
            with step.phase("forward"):
                time.sleep(0.002)
            if step.index == 20:
                with step.monitor("val_loss"):
                    time.sleep(0.01)
            if step.index == 50:
                print("READY", flush=True)

    if use_with:
        with run:
            loop()
    else:
        loop()
""")


def _signal_training(tmp_path: Path, recv: HttpOtlpReceiver, sig: int, use_with: bool,
                     step_ring: str = "off") -> tuple[subprocess.CompletedProcess[str], float]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _TRAIN_SCRIPT, recv.endpoint, str(tmp_path),
         "with" if use_with else "bare", step_ring],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "READY", proc.stderr.read() if proc.stderr else ""
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(_stuck_report(proc), pytrace=False)
    took = time.monotonic() - sent
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), took


def _stuck_report(proc: subprocess.Popen[str]) -> str:
    """What kept a signalled training process (or what it started) from ending: every
    thread's stack if it is still alive, the processes left, its stderr."""
    alive = proc.poll() is None
    if alive:
        proc.send_signal(signal.SIGUSR1)  # faulthandler: every thread's stack to stderr
        time.sleep(1.0)
    left = subprocess.run(["ps", "-eo", "pid,ppid,stat,etime,args"], capture_output=True,
                          text=True).stdout
    left = "\n".join(ln for ln in left.splitlines() if "otel_train" in ln or "PID" in ln)
    proc.kill()
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        err = "(its pipes are still held open by a process it started)"
    return (f"the training process did not end within 30 s of the signal (still alive: "
            f"{alive})\nprocesses:\n{left}\nstderr (end):\n{(err or '')[-6000:]}")


@pytest.mark.parametrize("step_ring", ["off", "on"])
def test_sigterm_flushes_writes_costs_and_dies_of_sigterm(tmp_path: Path, step_ring: str
                                                          ) -> None:
    with HttpOtlpReceiver() as recv:
        done, took = _signal_training(tmp_path, recv, signal.SIGTERM, use_with=False,
                                      step_ring=step_ring)
        spans = recv.spans()
    assert done.returncode == -signal.SIGTERM, done.stderr[-3000:]
    assert took < 1.0 + 2.0, f"SIGTERM took {took:.2f}s to end the run"
    costs = json.loads((tmp_path / "monitoring_costs.json").read_text())
    assert costs["steps"] >= 50 and costs["operations"]["val_loss"]["calls"] == 1
    assert costs["dropped_spans"] == {}
    roots = [s for s in spans if s.name == "train.step"]
    assert len(roots) == costs["steps"]  # everything recorded went out before the exit
    interrupted = [s for s in roots if s.status_code == 2]
    assert len(interrupted) == 1 and "SIGTERM" in interrupted[0].status_message


def test_sigterm_with_a_hanging_collector_counts_what_it_could_not_send(tmp_path: Path) -> None:
    with HttpOtlpReceiver(mode="hang", hang_seconds=20) as recv:
        done, took = _signal_training(tmp_path, recv, signal.SIGTERM, use_with=True)
    assert done.returncode == -signal.SIGTERM, done.stderr[-3000:]
    assert took < 1.0 + 2.0, f"SIGTERM took {took:.2f}s with the collector hanging"
    costs = json.loads((tmp_path / "monitoring_costs.json").read_text())
    assert sum(costs["dropped_spans"].values()) > 0, costs["dropped_spans"]
    assert "spans were not delivered" in done.stderr


def test_sigint_ends_the_run_through_keyboard_interrupt_with_costs_written(tmp_path: Path
                                                                           ) -> None:
    with HttpOtlpReceiver() as recv:
        done, took = _signal_training(tmp_path, recv, signal.SIGINT, use_with=True)
        spans = recv.spans()
    # An uncaught KeyboardInterrupt ends CPython by SIGINT (status -2), as without us.
    assert done.returncode == -signal.SIGINT, done.stderr[-3000:]
    assert "KeyboardInterrupt" in done.stderr
    costs = json.loads((tmp_path / "monitoring_costs.json").read_text())
    roots = [s for s in spans if s.name == "train.step"]
    assert costs["steps"] >= 50 and len(roots) == costs["steps"]
    assert [s.status_code for s in roots].count(2) == 1  # the interrupted step


_OWN_HANDLER_SCRIPT = textwrap.dedent("""
    import signal, sys
    import otel_train
    signal.signal(signal.SIGTERM, lambda *a: None)
    mine = signal.getsignal(signal.SIGTERM)
    run = otel_train.start_run(exporter="none", prometheus_port=None, console=False,
                               status_dir=sys.argv[1], device_sync="off")
    print("KEPT" if signal.getsignal(signal.SIGTERM) is mine else "REPLACED")
    run.shutdown()
""")


def test_an_application_sigterm_handler_is_left_in_place(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", _OWN_HANDLER_SCRIPT, str(tmp_path)],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "KEPT", out.stderr


def test_a_run_started_off_the_main_thread_installs_no_handler(tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import signal, sys, threading
        import otel_train
        def work():
            otel_train.start_run(exporter="none", prometheus_port=None, console=False,
                                 status_dir=sys.argv[1], device_sync="off").shutdown()
        t = threading.Thread(target=work); t.start(); t.join()
        print("DEFAULT" if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else "SET")
    """)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)],
                         capture_output=True, text=True, timeout=60, env={**os.environ})
    assert out.stdout.strip() == "DEFAULT", out.stderr


_LOADER_SCRIPT = textwrap.dedent("""
    import sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    import otel_train

    def main():
        endpoint, status_dir, method = sys.argv[1], sys.argv[2], sys.argv[3]
        data = TensorDataset(torch.arange(32.0).reshape(16, 2))  # 8 batches of 2
        # spawn/forkserver workers import torch afresh (seconds each): one worker, one epoch
        forked = method == "fork"
        loader = DataLoader(data, batch_size=2, num_workers=2 if forked else 1,
                            multiprocessing_context=method, persistent_workers=False)
        with otel_train.start_run(exporter="otlp", otlp_endpoint=endpoint, run_id=method,
                                  prometheus_port=None, console=False,
                                  status_dir=status_dir) as run:
            for epoch in range(2 if forked else 1):  # workers start once per epoch
                for step in run.steps(loader):
                    with step.phase("forward"):
                        step.batch[0].sum()
        print("STEPS", run.costs()["steps"] // (2 if forked else 1), flush=True)

    if __name__ == "__main__":
        main()
""")


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_dataloader_workers_export_nothing_under_every_start_method(tmp_path: Path, method: str
                                                                    ) -> None:
    script = tmp_path / "train_with_workers.py"
    script.write_text(_LOADER_SCRIPT)
    with HttpOtlpReceiver() as recv:
        out = subprocess.run([sys.executable, str(script), recv.endpoint, str(tmp_path), method],
                             capture_output=True, text=True, timeout=100)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "STEPS 8" in out.stdout, out.stdout
        epochs = 2 if method == "fork" else 1
        spans = recv.wait_for_spans(8 * epochs * 3, timeout_seconds=10)
        time.sleep(0.3)  # anything a worker might (wrongly) send would arrive by now
        spans = recv.spans()
    assert len(spans) == 8 * epochs * 3  # root + data + forward per step: the parent's, once
    assert {s.resource_attributes.get("service.instance.id") for s in spans} == {
        f"{method}/rank0"}
