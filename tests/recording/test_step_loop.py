"""``run.steps`` as loops are written: ``max_steps``, one loop per epoch, and leaving a loop.

Run against both twins of the loop (the C ``StepLoop`` here where it was built, the generator
``pure_twin.step_loop`` in ``test_recorder_c.py``'s pure-Python run of this file).
"""

from __future__ import annotations

import gc
import itertools
import time
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from train_helpers import (  # noqa: F401  (clean_env: autouse fixture)
    clean_env,
    one,
    run_spans,
    start_in_process_run,
)

from otel_train.common.drop_counter import DropCounter
from otel_train.recording.recorder import MonitorRecord, Recorder

pytestmark = pytest.mark.timeout(60)


class CountingLoader:
    """A loader that counts its fetches and its iterators; ``start_seconds`` per ``iter()``
    (a DataLoader starting its workers), ``None`` items for ever when ``items`` is None."""

    def __init__(self, items: int | None, start_seconds: float = 0.0) -> None:
        self.items = items
        self.start_seconds = start_seconds
        self.fetches = 0
        self.iterators = 0
        self.last_iterator: Any = None

    def __iter__(self) -> Iterator[int]:
        self.iterators += 1
        time.sleep(self.start_seconds)
        it = _CountingIterator(self)
        self.last_iterator = weakref.ref(it)
        return it


class _CountingIterator:
    def __init__(self, owner: CountingLoader) -> None:
        self._owner = owner
        self._i = 0

    def __iter__(self) -> _CountingIterator:
        return self

    def __next__(self) -> int:
        owner = self._owner
        if owner.items is not None and self._i >= owner.items:
            raise StopIteration
        owner.fetches += 1
        self._i += 1
        return self._i - 1


def _roots(spans: list[Any]) -> list[Any]:
    return sorted((s for s in spans if s.name == "train.step"),
                  key=lambda s: s.attributes["train.step"])


# -- max_steps ------------------------------------------------------------------------------

def test_max_steps_ends_the_loop_without_fetching_another_item(tmp_path):
    endless = CountingLoader(None)
    with start_in_process_run(tmp_path) as run:
        steps = [step.index for step in run.steps(endless, max_steps=3)]
        assert run._recorder.current is None and run._recorder.held is None
    assert steps == [0, 1, 2]
    assert endless.fetches == 3  # not a fourth: the loader may be endless or costly
    roots = _roots(run_spans(run))
    assert [r.attributes["train.step"] for r in roots] == [0, 1, 2]
    assert all(r.status_code == "UNSET" for r in roots)


def test_max_steps_larger_than_the_loader_ends_with_the_loader():
    rec = Recorder(10, DropCounter(), None)
    assert [s.index for s in rec.steps(CountingLoader(2), "train", max_steps=5)] == [0, 1]
    assert [s.index for s in rec.queue] == [0, 1] and rec.next_index == 2


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "3"])
def test_max_steps_must_be_a_positive_int_or_none(tmp_path, bad):
    with start_in_process_run(tmp_path) as run:
        with pytest.raises(ValueError, match="max_steps must be a positive int or None"):
            run.steps([1, 2], max_steps=bad)
        assert [s.index for s in run.steps([1, 2], max_steps=None)] == [0, 1]


def test_a_loop_over_something_not_iterable_is_refused_at_the_call():
    rec = Recorder(10, DropCounter(), None)
    with pytest.raises(TypeError, match="'int' object is not iterable"):
        rec.steps(3, "train")  # type: ignore[arg-type]
    assert rec.next_index == 0 and rec.current is None


# -- epochs -----------------------------------------------------------------------------------

def test_one_loop_per_epoch_continues_one_step_index(tmp_path):
    loader = CountingLoader(3)
    with start_in_process_run(tmp_path) as run:
        seen = []
        for epoch in range(3):
            for step in run.steps(loader, loader="train"):
                seen.append((epoch, step.index))
    assert seen == [(e, e * 3 + i) for e in range(3) for i in range(3)]
    roots = _roots(run_spans(run))
    assert [r.attributes["train.step"] for r in roots] == list(range(9))
    assert len({r.trace_id for r in roots}) == 9  # one trace per step, none reused


def test_max_steps_counts_the_steps_of_its_own_call():
    rec = Recorder(100, DropCounter(), None)
    loader = CountingLoader(10)
    per_epoch = [[s.index for s in rec.steps(loader, "train", max_steps=2)] for _ in range(3)]
    assert per_epoch == [[0, 1], [2, 3], [4, 5]]
    assert loader.fetches == 6 and loader.iterators == 3


def test_a_run_wide_total_over_epochs_is_one_loop_over_the_epochs(tmp_path):
    # docs/api.md's pattern: the epochs chained in one iterable, max_steps the run's total.
    loader = CountingLoader(4)
    epochs_started = []

    def epochs(n: int) -> Iterator[int]:
        for epoch in range(n):
            epochs_started.append(epoch)  # e.g. sampler.set_epoch(epoch)
            yield from loader

    with start_in_process_run(tmp_path) as run:
        indices = [step.index for step in run.steps(epochs(10), max_steps=6)]
    assert indices == list(range(6))
    assert epochs_started == [0, 1] and loader.fetches == 6


def test_starting_each_epochs_iterator_is_the_first_steps_data_phase(tmp_path):
    loader = CountingLoader(3, start_seconds=0.05)  # the workers' start-up, per epoch
    with start_in_process_run(tmp_path) as run:
        for _epoch in range(2):
            for _step in run.steps(loader):
                pass
    spans = run_spans(run)
    for index in range(6):
        data = one(spans, "data", **{"train.step": index})
        root = one(spans, "train.step", **{"train.step": index})
        seconds = (data.end_ns - data.start_ns) / 1e9
        if index in (0, 3):  # the first step of each epoch waited for its iterator
            assert seconds >= 0.05 and data.start_ns == root.start_ns
        else:
            assert seconds < 0.05


def test_an_iterator_that_fails_to_start_fails_the_first_steps_data_phase(tmp_path):
    class Broken:
        def __iter__(self) -> Iterator[int]:
            raise OSError("worker failed to start")

    with pytest.raises(OSError, match="worker failed"):
        with start_in_process_run(tmp_path) as run:
            for _step in run.steps(Broken()):
                pass
    spans = run_spans(run)
    assert one(spans, "data", **{"train.step": 0}).status_code == "ERROR"
    assert one(spans, "train.step", **{"train.step": 0}).status_code == "ERROR"


def test_the_loaders_iterator_is_let_go_when_the_loop_ends():
    rec = Recorder(10, DropCounter(), None)
    for limit in (None, 2):
        loader = CountingLoader(3)
        loop = rec.steps(loader, "train", max_steps=limit)
        assert len(list(loop)) == (limit or 3)
        assert loader.last_iterator() is None  # though the loop object is still kept
    loader = CountingLoader(3)
    loop = rec.steps(loader, "train")
    next(loop)
    loop.close()
    assert loader.last_iterator() is None
    rec.release_held()


# -- leaving the loop -------------------------------------------------------------------------

def test_break_ends_the_step_at_the_break_and_queues_it_before_what_follows():
    rec = Recorder(10, DropCounter(), None)
    for step in rec.steps(range(5), "train"):
        if step.index == 1:
            broke_ns = time.perf_counter_ns()
            break
    assert broke_ns <= step.end_ns <= time.perf_counter_ns()
    assert rec.held is step and rec.current is None  # held: not queued yet
    assert [s.index for s in rec.queue] == [0]
    with MonitorRecord(rec, "final_eval"):  # the next run event releases it first
        pass
    assert [r.name if isinstance(r, MonitorRecord) else r.index for r in rec.queue] == [
        0, 1, "final_eval"]
    assert step.error is None


def test_an_exception_leaving_the_run_marks_the_held_step_failed(tmp_path):
    with pytest.raises(KeyError):
        with start_in_process_run(tmp_path) as run:
            for step in run.steps(range(3)):
                if step.index == 1:
                    raise KeyError("body")
    roots = _roots(run_spans(run))
    assert [r.status_code for r in roots] == ["UNSET", "ERROR"]


def test_an_exception_caught_outside_the_loop_marks_the_step_only_from_a_phase(tmp_path):
    with start_in_process_run(tmp_path) as run:
        for failing_in_phase in (True, False):
            try:
                for _step in run.steps(range(3)):
                    if failing_in_phase:
                        with _step.phase("forward"):
                            raise ValueError("in a phase")
                    raise ValueError("between phases")
            except ValueError:
                pass  # caught outside the loop: the loop cannot tell this from a break
    roots = _roots(run_spans(run))
    assert [(r.attributes["train.step"], r.status_code) for r in roots] == [
        (0, "ERROR"), (1, "UNSET")]


def test_a_loop_collected_by_the_garbage_collector_ends_and_holds_its_step():
    rec = Recorder(10, DropCounter(), None)
    gc.disable()  # the collection happens where the test says, not at a random allocation
    try:
        loader = CountingLoader(3)
        loop = rec.steps(loader, "train")
        step = next(loop)
        loader.loop = loop  # type: ignore[attr-defined]  (loop -> iterator -> loader -> loop)
        del loop, loader
        assert not step.end_ns and rec.current is step  # running until collected
        gc.collect()
    finally:
        gc.enable()
    assert step.end_ns and rec.held is step and rec.current is None
    assert [s.index for s in rec.steps(range(1), "train")] == [1]  # the next loop goes on
    assert [s.index for s in rec.queue] == [0, 1]


def test_a_kept_loop_is_left_by_close():
    rec = Recorder(10, DropCounter(), None)
    loop = rec.steps(itertools.count(), "train")
    for step in loop:
        break
    assert not step.end_ns  # `loop` still holds it: the step runs on
    loop.close()  # type: ignore[attr-defined]
    assert step.end_ns and rec.held is step
    assert list(loop) == []


def test_two_held_steps_never_lose_one():
    rec = Recorder(10, DropCounter(), None)
    first = rec.begin_step("train")
    rec.finish_step(first, None, hold=True)
    second = rec.begin_step("train")
    rec.finish_step(second, None, hold=True)
    assert list(rec.queue) == [first] and rec.held is second
