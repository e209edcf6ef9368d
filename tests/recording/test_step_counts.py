"""Tokens and samples per step: the batch's shape where it is unambiguous (a tensor, a dict
with ``input_ids``, a tuple), an int or callable option, ``step.count`` winning over both;
ambiguous batches give one hint and no count; only shapes are read (meta tensors, which have
no data, and a fake accelerator that counts synchronize calls); the FLOP-counted step."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import torch
from train_helpers import FakeAccelerator, clean_env, run_spans  # noqa: F401
from train_helpers import start_test_run as _start

import otel_train
from otel_train.common import attributes as A
from otel_train.recording.device import resolve_device_timing
from otel_train.pipeline.settings import count_settings
from otel_train.recording.step_counts import BatchCounter, shape_counts

IDS = torch.zeros((4, 16), dtype=torch.long)


def start_test_run(tmp_path: Any, **options: Any) -> otel_train.Run:
    """A test run whose spans are written by a thread (quicker to start and stop)."""
    return _start(tmp_path, export_process=False, **options)


def _roots(run: Any) -> dict[int, dict[str, Any]]:
    return {s.attributes[A.STEP]: s.attributes for s in run_spans(run) if s.parent_id is None
            and s.name == A.STEP_SPAN_NAME}


@pytest.mark.parametrize(("batch", "expected"), [
    (IDS, (64, 4)),  # token ids: 2-D integers
    (torch.zeros((8, 3, 32, 32)), (None, 8)),  # images: samples only
    ({"input_ids": IDS, "attention_mask": torch.ones_like(IDS)}, (64, 4)),  # padding counts
    ((IDS, IDS), (64, 4)),  # (x, y)
    ([torch.zeros((5, 7)), torch.zeros(5)], (None, 5)),
])
def test_an_unambiguous_batch_is_counted_from_its_shape(batch, expected):
    assert shape_counts(batch) == expected


@pytest.mark.parametrize("batch", [
    [1, 2, 3], "text", {"pixels": torch.zeros(4, 3)}, (torch.zeros(4, 2), torch.zeros(5)),
    torch.tensor(3.0), None,
])
def test_an_ambiguous_batch_gives_no_count(batch):
    assert shape_counts(batch) is None


def test_the_batch_shape_is_read_without_its_data():
    # Meta tensors have shapes and no data: reading a value (item, sum) would raise.
    ids = torch.empty((2, 128), dtype=torch.long, device="meta")
    assert shape_counts({"input_ids": ids}) == (256, 2)
    with pytest.raises(Exception):
        ids.sum().item()


def test_a_run_counts_each_batch_on_its_root_span_and_never_synchronizes(tmp_path, monkeypatch):
    fake = FakeAccelerator()
    real = resolve_device_timing
    monkeypatch.setattr(otel_train.pipeline.assembly, "resolve_device_timing",
                        lambda mode, *args, **kwargs: real(mode, accelerator=fake,
                                                         event_class=fake.Event))
    batches = [{"input_ids": torch.empty((2, 8 * (i + 1)), dtype=torch.long, device="meta")}
               for i in range(3)]
    with start_test_run(tmp_path, device_sync="events") as run:
        for step in run.steps(batches):
            with step.phase("forward"):
                fake.launch(0.001)
    assert fake.synchronize_calls == 0
    roots = _roots(run)
    assert [(roots[i][A.TOKENS], roots[i][A.SAMPLES]) for i in range(3)] == [
        (16, 2), (32, 2), (48, 2)]


def test_an_ambiguous_batch_gives_one_hint_and_no_count(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="otel_train")
    with start_test_run(tmp_path) as run:
        for _step in run.steps(range(5)):
            pass
    hints = [r for r in caplog.records if "not counted" in r.getMessage()]
    assert len(hints) == 1 and "tokens_per_step=" in hints[0].getMessage()
    assert all(A.TOKENS not in a and A.SAMPLES not in a for a in _roots(run).values())


def test_options_give_ints_or_call_a_callable_and_step_count_wins(tmp_path):
    with start_test_run(tmp_path, tokens_per_step=lambda b: int(b.shape[1]) * 10,
                        samples_per_step=3) as run:
        for step in run.steps([IDS, IDS, IDS]):
            if step.index == 2:
                step.count(tokens=7, samples=1)
    roots = _roots(run)
    assert [(roots[i][A.TOKENS], roots[i][A.SAMPLES]) for i in range(3)] == [
        (160, 3), (160, 3), (7, 1)]


def test_a_callable_that_raises_is_logged_and_counted_never_raised(tmp_path, caplog):
    def broken(batch: Any) -> int:
        raise KeyError("tokens")

    with start_test_run(tmp_path, tokens_per_step=broken) as run:
        for _step in run.steps([IDS, IDS]):
            pass
    assert run._counter.failures == 2
    assert any("tokens_per_step raised" in r.getMessage() for r in caplog.records)
    assert all(A.TOKENS not in a for a in _roots(run).values())


def test_run_step_counts_a_batch_given_to_step_count(tmp_path):
    with start_test_run(tmp_path) as run:
        for batch in (IDS, IDS[:2]):
            with run.step() as step:
                step.count(batch=batch)
        with run.step() as step:
            step.count(tokens=5)
    roots = _roots(run)
    assert [roots[i].get(A.TOKENS) for i in range(3)] == [64, 32, 5]
    assert roots[1][A.SAMPLES] == 2 and A.SAMPLES not in roots[2]


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_step_count_refuses_what_is_not_a_count(tmp_path, bad):
    with start_test_run(tmp_path) as run:
        with run.step() as step:
            with pytest.raises(ValueError, match="step.count"):
                step.count(tokens=bad)


@pytest.mark.parametrize(("name", "bad"), [("tokens_per_step", -2), ("samples_per_step", "x"),
                                           ("flops_per_step", 0), ("peak_flops_per_second", -1.0)])
def test_bad_throughput_options_are_refused_at_start_naming_the_option(tmp_path, name, bad):
    with pytest.raises(ValueError, match=name):
        start_test_run(tmp_path, **{name: bad})


def test_nothing_is_done_per_batch_when_the_options_are_ints():
    opts = otel_train.RunOptions.resolve(environ={}, tokens_per_step=8, samples_per_step=1)
    assert BatchCounter.for_run(count_settings(opts)) is None


def test_count_flops_counts_step_1_and_the_next_step_carries_the_count(tmp_path):
    model = torch.nn.Linear(32, 16, bias=False)
    with start_test_run(tmp_path, count_flops=True) as run:
        for step in run.steps([torch.randn(8, 32) for _ in range(4)]):
            model(step.batch).sum().backward()
    roots = _roots(run)
    assert roots[1][A.FLOPS_COUNTED] is True
    # forward 2*8*32*16; backward: the weight's gradient only (the input needs none)
    assert roots[2][A.FLOPS] == 2 * (2 * 8 * 32 * 16)
    assert roots[2][A.FLOPS_DTYPE] == "fp32"
    assert A.FLOPS_COUNTED not in roots[0] and A.FLOPS_COUNTED not in roots[2]


def test_leaving_the_loop_in_the_counted_step_ends_the_counting(tmp_path):
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    with start_test_run(tmp_path, count_flops=True) as run:
        for step in run.steps([torch.randn(2, 2) for _ in range(4)]):
            if step.index == 1:
                assert _get_current_dispatch_mode_stack()  # counting
                break
        assert not _get_current_dispatch_mode_stack()


def test_run_step_counts_flops_from_step_1_to_the_next_run_step(tmp_path):
    model = torch.nn.Linear(4, 4, bias=False)
    with start_test_run(tmp_path, count_flops=True) as run:
        for _ in range(3):
            with run.step():
                model(torch.randn(2, 4))
    roots = _roots(run)
    assert roots[1][A.FLOPS_COUNTED] is True and roots[2][A.FLOPS] == 2 * 2 * 4 * 4


def test_the_time_counting_batches_is_timed_on_the_training_thread_and_charged(tmp_path):
    slow = {"calls": 0}

    def tokens(batch: Any) -> int:  # a counting callable that takes 2 ms a batch
        slow["calls"] += 1
        time.sleep(0.002)
        return 10

    with start_test_run(tmp_path, tokens_per_step=tokens) as run:
        for _step in run.steps([IDS] * 5):
            pass
        with run.step() as step:
            step.count(batch=IDS)  # a batch counted by hand: timed too
        costs = run.costs()["own_cost"]
    assert slow["calls"] == 6 and run._counter.spent_ns >= 6 * 2_000_000
    assert costs["batch_counting_us_per_step"] >= 2_000  # 6 batches of 2 ms over 6 steps
    assert costs["lost_us_per_step"] >= costs["batch_counting_us_per_step"]


def test_the_data_phase_is_the_loaders_time_and_the_count_comes_after_it(tmp_path):
    def tokens(batch: Any) -> int:  # counting that takes 20 ms a batch
        time.sleep(0.02)
        return 10

    with start_test_run(tmp_path, tokens_per_step=tokens) as run:
        for _step in run.steps([IDS] * 3):
            pass
    spans = run_spans(run)
    data = [s for s in spans if s.name == "data"]
    roots = [s for s in spans if s.parent_id is None and s.name == A.STEP_SPAN_NAME]
    assert len(data) == 3 and all(r.attributes[A.TOKENS] == 10 for r in roots)
    assert all(d.duration_seconds < 0.015 for d in data)
    assert all(r.duration_seconds >= 0.02 for r in roots)


def test_a_run_that_counts_nothing_per_batch_reports_no_batch_counting(tmp_path):
    with start_test_run(tmp_path, tokens_per_step=100, samples_per_step=4) as run:
        for _step in run.steps([IDS] * 3):
            pass
        assert run._counter is None
        assert run.costs()["own_cost"]["batch_counting_us_per_step"] is None
