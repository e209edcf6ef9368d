"""transport.py's PendingSend: a request in flight waited on in slices, finished from the
sender's thread, given up on and told its late outcome."""

from __future__ import annotations

import threading
import time

from otel_train.export.otlp.transport import ExportOutcome, PendingSend


def test_a_wait_returns_none_in_flight_and_the_outcome_as_soon_as_it_is_known():
    pending = PendingSend()
    t0 = time.monotonic()
    assert pending.wait(0.05) is None and time.monotonic() - t0 >= 0.04
    assert pending.wait(0.0) is None
    threading.Timer(0.05, pending.finish, (ExportOutcome.SENT,)).start()
    t0 = time.monotonic()
    assert pending.wait(5.0) is ExportOutcome.SENT
    assert time.monotonic() - t0 < 2.0  # woken by the finish, not the timeout
    for _ in range(3):  # known: every later wait returns it at once
        t0 = time.monotonic()
        assert pending.wait(5.0) is ExportOutcome.SENT and time.monotonic() - t0 < 1.0


def test_the_first_outcome_stands_and_a_given_up_send_reports_its_late_one_once():
    pending = PendingSend()
    pending.finish(ExportOutcome.RETRY, "refused")
    pending.finish(ExportOutcome.SENT)
    assert pending.wait(1.0) is ExportOutcome.RETRY and pending.detail == "refused"

    late: list[ExportOutcome] = []
    cancelled: list[bool] = []
    slow = PendingSend(cancel=lambda: cancelled.append(True))
    slow.give_up(late.append, cancel=True)
    assert cancelled == [True] and late == []
    slow.finish(ExportOutcome.SENT)
    slow.finish(ExportOutcome.UNKNOWN)
    assert late == [ExportOutcome.SENT] and slow.wait(0.0) is ExportOutcome.SENT
    done = PendingSend()
    done.finish(ExportOutcome.UNKNOWN)
    done.give_up(late.append, cancel=True)  # already known: told at once
    assert late == [ExportOutcome.SENT, ExportOutcome.UNKNOWN]


def test_waiters_on_two_threads_both_learn_the_outcome():
    pending = PendingSend()
    seen: list[ExportOutcome | None] = []
    waiters = [threading.Thread(target=lambda: seen.append(pending.wait(5.0)))
               for _ in range(2)]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.05)
    pending.finish(ExportOutcome.REJECTED)
    for waiter in waiters:
        waiter.join(5)
    assert seen == [ExportOutcome.REJECTED] * 2
