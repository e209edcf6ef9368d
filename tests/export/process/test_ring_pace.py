"""The exporter process's ring reader sleeps long when the ring fills slowly, short when fast."""

from __future__ import annotations

import pytest

from otel_train.export.process import ring_pace
from otel_train.export.process.ring_pace import (
    BoundedWait,
    FILL_PER_SLEEP,
    MIN_POLL_SECONDS,
    POLL_SECONDS,
    RingPace,
)

MIB = 1 << 20


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_idle_or_slow_ring_is_read_every_poll_interval():
    clock = _Clock()
    pace = RingPace(MIB, 0, clock)
    clock.now += 0.25
    assert pace.next_sleep(0) == POLL_SECONDS  # nothing written
    clock.now += 0.25
    assert pace.next_sleep(208 * 550) == POLL_SECONDS  # a 0.45 ms MLP step: 550 a wake


def test_a_ring_filling_fast_is_read_before_a_quarter_of_it_fills():
    clock = _Clock()
    pace = RingPace(MIB, 0, clock)
    clock.now += 0.25
    # 2 MiB a second (a 7-phase step every ~100 us): a quarter of the ring in 0.125 s
    sleep = pace.next_sleep(MIB // 2)
    assert sleep == pytest.approx(FILL_PER_SLEEP * MIB / (2 * MIB))
    assert sleep * 2 * MIB <= FILL_PER_SLEEP * MIB * 1.0001


def test_the_fastest_loops_are_read_at_the_shortest_sleep_and_the_rate_follows_the_loop():
    clock = _Clock()
    pace = RingPace(64 * 1024, 4096, clock)
    clock.now += 0.01
    read = 4096 + 4 * 64 * 1024  # the ring's size four times over in 10 ms
    assert pace.next_sleep(read) == MIN_POLL_SECONDS
    clock.now += 1.0
    assert pace.next_sleep(read + 208) == POLL_SECONDS  # the loop slowed down


def test_a_ring_without_room_is_refused():
    with pytest.raises(ValueError, match="capacity_bytes"):
        RingPace(0, 0)


def test_a_bounded_wait_holds_back_until_its_bound_then_starts_over(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(ring_pace.time, "monotonic", lambda: now[0])
    wait = BoundedWait()
    assert wait.waiting(2.0)  # the first call starts the wait
    now[0] = 101.9
    assert wait.waiting(2.0)
    now[0] = 102.0
    assert not wait.waiting(2.0)  # the bound passed: given up once
    now[0] = 102.5
    assert wait.waiting(2.0)  # a new wait, from 102.5
    now[0] = 104.4
    assert wait.waiting(2.0)
    wait.reset()  # what was awaited came
    now[0] = 110.0
    assert wait.waiting(2.0)
    now[0] = 111.99
    assert wait.waiting(2.0)
