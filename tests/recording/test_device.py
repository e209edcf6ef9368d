"""Device timing, with a faithful fake of ``torch.accelerator`` (asynchronous work queue).

On an accelerator a launch returns at once and the work finishes later; only a synchronize
(or a host read such as ``.item()``) waits for it. ``device_sync="sync"`` must charge the
work to the phase that launched it; ``"off"`` leaves it to whichever phase waits next.
"""

from __future__ import annotations

import time
import types

import pytest
from train_helpers import (  # noqa: F401  (clean_env: autouse fixture)
    SLACK_SECONDS,
    FakeAccelerator,
    clean_env,
    one,
    run_spans,
    start_in_process_run,
    use_fake_accelerator,
)

import otel_train.run
from otel_train.recording import device as device_mod
from otel_train.recording.device import resolve_device_timing

pytestmark = pytest.mark.timeout(60)

WORK = 0.1  # seconds of simulated device work


def test_fake_accelerator_is_asynchronous_until_synchronized():
    fake = FakeAccelerator()
    t0 = time.monotonic()
    fake.launch(WORK)
    assert time.monotonic() - t0 < WORK  # the launch itself does not wait
    assert fake.pending_seconds > 0
    fake.synchronize()
    assert time.monotonic() - t0 >= WORK
    assert fake.pending_seconds == 0


def test_sync_mode_with_an_accelerator_synchronizes():
    fake = FakeAccelerator()
    timing = resolve_device_timing("sync", accelerator=fake)
    assert timing.synced is True
    assert timing.device_type == "cuda"
    timing.synchronize()
    assert fake.synchronize_calls == 1
    assert timing.work.syncs == 1  # timed: the wait is part of the own cost
    assert "synchronized at every phase boundary" in timing.describe()


def test_auto_mode_with_an_accelerator_is_monitor_sync():
    timing = resolve_device_timing("auto", accelerator=FakeAccelerator(device_type="xpu"))
    assert timing.synced is False  # no synchronize in training phases
    assert timing.resolved == "monitor_sync"
    assert timing.monitor_synchronize is not None and timing.make_event is not None
    assert timing.device_type == "xpu"
    assert timing.span_timing is None  # each span says its own


def test_off_mode_with_an_accelerator_uses_the_host_clock():
    timing = resolve_device_timing("off", accelerator=FakeAccelerator())
    assert timing.synced is False
    assert timing.synchronize is None
    assert timing.device_type == "cuda"
    assert "device_sync=off" in timing.describe()


def test_auto_mode_on_this_cpu_only_torch_uses_the_host_clock():
    timing = resolve_device_timing("auto")
    assert timing.synced is False
    assert timing.device_type == "cpu"
    assert "cpu" in timing.describe()


def test_sync_mode_without_an_accelerator_is_not_synced():
    timing = resolve_device_timing("sync", accelerator=FakeAccelerator(available=False))
    assert (timing.synced, timing.device_type) == (False, "cpu")


def test_a_broken_accelerator_degrades_to_the_host_clock():
    class Broken(FakeAccelerator):
        def is_available(self) -> bool:
            raise RuntimeError("driver/library version mismatch")

    timing = resolve_device_timing("auto", accelerator=Broken())
    assert (timing.synced, timing.device_type) == (False, "cpu")


def test_old_torch_without_accelerator_module_falls_back_to_torch_cuda():
    synced = []
    cuda = types.SimpleNamespace(is_available=lambda: True,
                                 synchronize=lambda device=None: synced.append(device))
    old_torch = types.SimpleNamespace(cuda=cuda, device=lambda t: types.SimpleNamespace(type=t))
    api = device_mod._accelerator_api(old_torch)
    timing = resolve_device_timing("sync", accelerator=api)
    assert (timing.synced, timing.device_type) == (True, "cuda")
    timing.synchronize()
    assert synced == [None]



def test_an_accelerator_this_process_has_not_initialized_is_not_synchronized_yet():
    fake = FakeAccelerator(initialized=False)  # e.g. a CPU loop on a GPU machine
    timing = resolve_device_timing("sync", accelerator=fake)
    assert timing.synced and timing.pending_first_use
    assert "once this process uses cuda" in timing.describe()
    timing.synchronize()
    # No synchronize, so no device context created for an empty queue.
    assert (fake.synchronize_calls, fake.initialized) == (0, False)
    fake.launch(0.0)  # the process's first device call
    timing.synchronize()
    assert fake.synchronize_calls == 1


def test_an_initialized_accelerator_is_synchronized_at_once_and_each_wait_is_timed():
    fake = FakeAccelerator()
    timing = resolve_device_timing("sync", accelerator=fake)
    assert not timing.pending_first_use
    fake.launch(0.02)
    timing.synchronize()
    assert fake.synchronize_calls == 1
    assert timing.work.sync_ns >= 0.015e9  # the wait, charged to the own cost


def test_the_first_use_check_is_the_device_backends_is_initialized():
    import torch

    acc = FakeAccelerator()
    assert device_mod._in_use_check(torch, acc, "cuda") is torch.cuda.is_initialized
    assert device_mod._in_use_check(None, acc, "cuda") == acc.is_initialized
    assert device_mod._in_use_check(torch, acc, "mps-like") is None  # no check: synchronize

# -- a whole run on the fake accelerator ---------------------------------------------------

@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeAccelerator:
    """Runs resolve their device timing against the fake (the only thing patched)."""
    return use_fake_accelerator(monkeypatch)


def _train_one_step(run, fake: FakeAccelerator) -> None:
    for step in run.steps([0], loader="train"):
        with step.phase("forward"):
            fake.launch(WORK)  # asynchronous kernels
        with step.phase("optimizer"):
            fake.item()  # e.g. loss.item(): the host waits for the device here


def test_sync_mode_charges_async_work_to_the_phase_that_launched_it(tmp_path, fake):
    with start_in_process_run(tmp_path, device_sync="sync") as run:
        assert run.device.synced
        _train_one_step(run, fake)
    spans = run_spans(run)
    forward, optimizer = one(spans, "forward"), one(spans, "optimizer")
    assert WORK <= forward.duration_seconds < WORK + SLACK_SECONDS
    assert optimizer.duration_seconds < WORK / 2
    assert fake.synchronize_calls >= 4
    for span in spans:
        assert span.attributes["train.device.synced"] is True
        assert span.attributes["train.device.type"] == "cuda"


def test_auto_mode_with_the_fake_accelerator_leaves_training_phases_unsynchronized(tmp_path,
                                                                                   fake):
    with start_in_process_run(tmp_path) as run:
        _train_one_step(run, fake)
    spans = run_spans(run)
    assert one(spans, "forward").duration_seconds < WORK / 2  # the launch only
    assert fake.synchronize_calls == 0  # no monitoring: no synchronize at all
    assert all(s.attributes["train.device.synced"] is False for s in spans)



def test_a_run_synchronizes_from_the_processs_first_device_use_on(tmp_path, monkeypatch):
    acc = FakeAccelerator(initialized=False)
    real = resolve_device_timing
    monkeypatch.setattr(otel_train.pipeline.assembly, "resolve_device_timing",
                        lambda mode, *args, **kwargs: real(mode, accelerator=acc))
    with start_in_process_run(tmp_path, device_sync="sync") as run:
        assert run.device.pending_first_use
        for step in run.steps([0, 1], loader="train"):
            with step.phase("forward"):
                if step.index == 1:
                    syncs_before_first_use = acc.synchronize_calls
                    acc.launch(WORK)  # the model reaches the device only in step 1
    spans = run_spans(run)
    forwards = sorted((s for s in spans if s.name == "forward"),
                      key=lambda s: s.attributes["train.step"])
    assert forwards[0].duration_seconds < WORK / 2
    assert forwards[1].duration_seconds >= WORK  # synchronized: charged where launched
    assert syncs_before_first_use == 0
    assert acc.synchronize_calls >= 2

def test_off_mode_lets_async_work_land_in_the_phase_that_waits(tmp_path, fake):
    with start_in_process_run(tmp_path, device_sync="off") as run:
        assert not run.device.synced
        _train_one_step(run, fake)
    spans = run_spans(run)
    forward, optimizer = one(spans, "forward"), one(spans, "optimizer")
    assert forward.duration_seconds < WORK / 2
    assert WORK / 2 <= optimizer.duration_seconds < WORK + SLACK_SECONDS
    assert forward.duration_seconds + optimizer.duration_seconds >= WORK * 0.99
    assert fake.synchronize_calls == 0
    for span in spans:
        assert span.attributes["train.device.synced"] is False


def test_monitor_phases_are_synchronized_too(tmp_path, fake):
    with start_in_process_run(tmp_path, device_sync="sync") as run:
        for step in run.steps([0]):
            with step.monitor("inference"):
                fake.launch(WORK)
        with run.monitor("snapshot"):  # outside any step
            fake.launch(WORK)
    spans = run_spans(run)
    assert one(spans, "inference").duration_seconds >= WORK
    assert one(spans, "snapshot").duration_seconds >= WORK


def test_the_step_ends_after_its_device_work(tmp_path, fake):
    with start_in_process_run(tmp_path, device_sync="sync") as run:
        for _step in run.steps([0]):
            fake.launch(WORK)  # in the loop body, outside any phase
    assert one(run_spans(run), "train.step").duration_seconds >= WORK


def test_sync_mode_charges_device_work_of_the_fetch_to_the_data_phase(tmp_path, fake):
    class DeviceLoader:
        def __iter__(self):
            for i in range(1):
                fake.launch(WORK)  # e.g. batch.to("cuda", non_blocking=True)
                yield i

    with start_in_process_run(tmp_path, device_sync="sync") as run:
        for step in run.steps(DeviceLoader()):
            with step.phase("forward"):
                pass
    spans = run_spans(run)
    assert one(spans, "data").duration_seconds >= WORK


# -- the default on an accelerator: monitor_sync ----------------------------------------------

class CountingAccelerator(FakeAccelerator):
    """The fake, remembering which phase was open at each synchronize (by the span names the
    test passes in ``where``)."""

    def __init__(self) -> None:
        super().__init__()
        self.where = "outside"
        self.synced_in: list[str] = []

    def synchronize(self, device=None) -> None:
        self.synced_in.append(self.where)
        super().synchronize(device)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> CountingAccelerator:
    return use_fake_accelerator(monkeypatch, CountingAccelerator())


def _train_phases(step, acc: CountingAccelerator) -> None:
    for name in ("forward", "backward", "optimizer"):
        with step.phase(name):
            acc.where = name
            acc.launch(0.01)
        acc.where = "between"


def test_auto_on_an_accelerator_never_synchronizes_in_training_phases(tmp_path, counting):
    with start_in_process_run(tmp_path, device_events_every_steps=2) as run:
        assert run.device.resolved == "monitor_sync"
        for step in run.steps(range(4)):
            _train_phases(step, counting)
            with step.phase("my_phase"):  # a user's own training phase
                counting.launch(0.01)
            for _batch in step.iter_data([0, 1], loader="extra"):
                pass
            run.timestamp_ns()  # an integration's boundary timestamp
    assert counting.synchronize_calls == 0
    assert counting.events_recorded > 0  # device time from events instead


def test_auto_synchronizes_once_at_the_start_and_once_at_the_end_of_step_monitor(tmp_path,
                                                                                counting):
    with start_in_process_run(tmp_path) as run:
        for step in run.steps(range(3)):
            _train_phases(step, counting)
            counting.where = "val_loss"
            with step.monitor("val_loss"):
                counting.launch(0.01)
            counting.where = "after"
    # Exactly two per monitoring call, none anywhere else.
    assert counting.synced_in == ["val_loss"] * 6
    assert run.device.work.monitor_syncs == 6 and run.device.work.syncs == 0


def test_auto_synchronizes_monitor_phases_opened_by_timestamps_and_run_monitor(tmp_path,
                                                                             counting):
    with start_in_process_run(tmp_path) as run:
        for step in run.steps(range(2)):
            _train_phases(step, counting)
            step.open_phase("forward", start_ns=run.timestamp_ns())  # training: no sync
            step.close_phase(run.timestamp_ns())
            counting.where = "eval"
            step.open_phase("eval", kind="monitor", start_ns=run.timestamp_ns())
            step.open_phase("data", loader="eval")  # nested training-kind fetch: no sync
            step.close_phase()
            counting.launch(0.01)
            step.close_phase(run.timestamp_ns())
            counting.where = "after"
        counting.where = "final_eval"
        counting.launch(WORK)  # training work still queued when the final eval starts
        with run.monitor("final_eval"):
            counting.launch(0.01)
    assert counting.synced_in == ["eval"] * 4 + ["final_eval"] * 2
    spans = run_spans(run)
    assert one(spans, "final_eval").attributes["train.device.queued_wait_seconds"] >= WORK * 0.8
    evals = [s for s in spans if s.name == "eval"]
    assert len(evals) == 2
    assert all(s.attributes["train.device.queued_wait_seconds"] >= 0 for s in evals)
    assert all(s.attributes["train.device.timing"] == "sync" for s in evals)


def test_auto_charges_queued_training_work_to_training_and_monitoring_kernels_to_monitoring(
        tmp_path, counting):
    with start_in_process_run(tmp_path) as run:
        for step in run.steps(range(1)):
            with step.phase("forward"):
                counting.launch(WORK)  # still queued when monitoring starts
            with step.monitor("inference"):
                counting.launch(WORK / 2)  # monitoring's own kernels
    spans = run_spans(run)
    inference = one(spans, "inference")
    # Not the training work before it (WORK), but all of its own (WORK / 2).
    assert WORK / 2 <= inference.duration_seconds < WORK / 2 + SLACK_SECONDS
    assert inference.duration_seconds < WORK
    assert inference.attributes["train.device.timing"] == "sync"
    assert inference.attributes["train.device.synced"] is True
    # The training work it waited for before starting, said on the span (not inside it).
    assert WORK * 0.8 <= inference.attributes["train.device.queued_wait_seconds"] <= WORK * 1.5
    forward = one(spans, "forward")
    assert forward.duration_seconds < WORK / 2  # the host's time: the launch
    assert forward.attributes["train.device.synced"] is False
    # Step 0 is sampled (1 step in 10): its training spans carry device time from events.
    assert forward.attributes["train.device.timing"] == "events"
    assert forward.attributes["train.device.duration_seconds"] >= WORK * 0.9
    assert one(spans, "train.step").attributes["train.device.timing"] == "events"


def test_auto_marks_unsampled_training_spans_host_and_run_monitor_sync(tmp_path, counting):
    with start_in_process_run(tmp_path, device_events_every_steps=10) as run:
        for step in run.steps(range(2)):
            _train_phases(step, counting)
        with run.monitor("final_eval"):
            counting.launch(0.001)
    spans = run_spans(run)
    step1 = [s for s in spans if s.attributes.get("train.step") == 1
             and s.name != "final_eval"]
    assert {s.attributes["train.device.timing"] for s in step1} == {"host"}
    final = one(spans, "final_eval")
    assert (final.attributes["train.device.timing"], final.attributes["train.device.synced"]) \
        == ("sync", True)


def test_sync_mode_marks_every_span_sync_and_cpu_runs_every_span_host(tmp_path, counting):
    with start_in_process_run(tmp_path / "sync", device_sync="sync") as run:
        for step in run.steps(range(1)):
            _train_phases(step, counting)
    assert {s.attributes["train.device.timing"] for s in run_spans(run)} == {"sync"}
    with start_in_process_run(tmp_path / "off", device_sync="off") as run:
        for step in run.steps(range(1)):
            _train_phases(step, counting)
    assert {s.attributes["train.device.timing"] for s in run_spans(run)} == {"host"}


def test_the_banner_says_monitor_sync_and_why(tmp_path, counting):
    timing = resolve_device_timing("auto", accelerator=counting)
    text = timing.describe()
    assert text.startswith("cuda: monitor_sync (device_sync=auto): training phases "
                           "unsynchronized, device time from events")
    assert "monitoring synchronized at its start and end" in text
    with start_in_process_run(tmp_path, device_events_every_steps=10) as run:
        assert "device time from events 1 step in 10" in run.device.describe()


def test_monitor_sync_waits_for_the_processs_first_device_use_too():
    fake = FakeAccelerator(initialized=False)
    timing = resolve_device_timing("auto", accelerator=fake)
    assert timing.pending_first_use
    timing.monitor_synchronize()
    assert timing.make_event() is None  # no event: it would create the device context
    assert (fake.synchronize_calls, fake.initialized) == (0, False)
    fake.launch(0.0)
    timing.monitor_synchronize()
    assert fake.synchronize_calls == 1 and timing.make_event() is not None


def test_every_span_of_a_monitor_sync_run_says_its_timing_once(tmp_path, counting):
    with start_in_process_run(tmp_path, startup_span=True) as run:
        for step in run.steps(range(2)):
            _train_phases(step, counting)
            with step.monitor("val_loss"):
                pass
    spans = run_spans(run)
    assert "train.startup" in {s.name for s in spans}
    for span in spans:
        assert span.attributes["train.device.timing"] in ("sync", "events", "host"), span.name
        assert isinstance(span.attributes["train.device.synced"], bool), span.name
        assert (span.attributes["train.device.timing"] == "sync") \
            == span.attributes["train.device.synced"], span.name


def test_phases_recorded_by_timestamps_inside_a_monitoring_phase_are_not_marked_sync(
        tmp_path, counting):
    with start_in_process_run(tmp_path) as run:
        for step in run.steps(range(1)):
            step.open_phase("evaluate", kind="monitor")
            t0 = run.timestamp_ns()
            step.record_phase("data", t0, run.timestamp_ns(), kind="monitor", loader="eval")
            step.close_phase()
    spans = run_spans(run)
    assert one(spans, "evaluate").attributes["train.device.timing"] == "sync"
    fetched = [s for s in spans if s.name == "data"
               and s.attributes.get("train.dataloader") == "eval"]
    assert fetched and fetched[0].attributes["train.device.timing"] in ("host", "events")
    assert fetched[0].attributes["train.device.synced"] is False
