"""Option background_cpus: otel-train's background (the exporter process, the run's threads)
kept off the CPU the training thread starts on; the training thread itself never pinned."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from train_helpers import clean_env, start_test_run  # noqa: F401  (clean_env: autouse)

from otel_train.common.cpu_affinity import BackgroundCpus, current_cpu
from otel_train.common.options import RunOptions

linux_only = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"),
                                reason="no sched_setaffinity on this platform")


def _on_thread(body):
    """body() on a new thread (affinity changes stay with it); its result."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(body()))
    t.start()
    t.join(10)
    return out[0]


@linux_only
def test_the_training_threads_cpu_is_one_it_may_run_on() -> None:
    assert current_cpu() in os.sched_getaffinity(0)


@linux_only
def test_auto_gives_every_allowed_cpu_but_the_training_threads() -> None:
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("this process may use one CPU only")
    cpus = BackgroundCpus.resolve("auto")
    assert cpus.training_cpu in allowed
    assert cpus.cpus == allowed - {cpus.training_cpu}
    assert f"off CPU {cpus.training_cpu}" in cpus.describe()


@linux_only
def test_one_cpu_or_off_leaves_the_background_to_the_scheduler() -> None:
    def on_one_cpu() -> BackgroundCpus:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        return BackgroundCpus.resolve("auto")

    one = _on_thread(on_one_cpu)
    assert one.cpus is None and one.why_not == "this process may use one CPU only"
    off = BackgroundCpus.resolve("off")
    assert off.cpus is None  # nothing is set on the exporter process either
    assert "the scheduler's (background_cpus='off')" in off.describe()
    assert off.pin_threads([threading.get_native_id()]) == 0


@linux_only
def test_pinning_a_thread_that_has_exited_is_skipped_not_raised() -> None:
    allowed = os.sched_getaffinity(0)
    cpus = BackgroundCpus(frozenset({min(allowed)}), max(allowed))
    gone = _on_thread(threading.get_native_id)
    alive = threading.Event()
    t = threading.Thread(target=alive.wait, args=(10,))
    t.start()
    try:
        assert cpus.pin_threads([gone, t.native_id, None]) == 1
        assert os.sched_getaffinity(t.native_id) == {min(allowed)}
    finally:
        alive.set()
        t.join()


@linux_only
def test_a_thread_id_that_is_not_this_processs_is_never_pinned() -> None:
    allowed = os.sched_getaffinity(0)
    cpus = BackgroundCpus(frozenset({min(allowed)}), max(allowed))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10)"])
    try:  # the id of another process's thread, as a reused thread id would be
        assert cpus.pin_threads([other.pid]) == 0
        assert os.sched_getaffinity(other.pid) == allowed
    finally:
        other.kill()
        other.wait()


def test_an_unknown_mode_is_refused_naming_the_option() -> None:
    with pytest.raises(ValueError, match="background_cpus"):
        RunOptions.resolve({}, background_cpus="cpu3")


@linux_only
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("mode", ["auto", "off"])
def test_a_runs_threads_and_exporter_process_run_where_the_option_says(
        tmp_path: Path, mode: str) -> None:
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("this process may use one CPU only")
    training_affinity = os.sched_getaffinity(0)
    run = start_test_run(tmp_path, background_cpus=mode, prometheus_port=0)
    try:
        for step in run.steps(range(5)):
            with step.phase("forward"):
                pass
        background = run._telemetry.background
        own = [t for t in threading.enumerate() if t.name.startswith("otel-train-")]
        assert own, [t.name for t in threading.enumerate()]
        pid = run.export_plan.process_pid
        assert pid is not None
        want = allowed - {background.training_cpu} if mode == "auto" else allowed
        for t in own:
            assert os.sched_getaffinity(t.native_id) == want, t.name
        assert os.sched_getaffinity(pid) == want
        # The training thread is never pinned.
        assert os.sched_getaffinity(0) == training_affinity
    finally:
        run.shutdown()
