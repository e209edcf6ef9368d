"""When this process started (common/process_start.py): /proc read without psutil."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from otel_train.common.process_start import process_age_seconds, process_start


def test_the_age_is_uptime_less_the_start_ticks_even_with_parentheses_in_the_name() -> None:
    # field 22 (starttime) = 12345 ticks; the command name holds a space and a ')'
    stat = "4242 (my (odd) cmd) S " + " ".join(str(n) for n in range(4, 22)) + " 12345 99 98"
    assert process_age_seconds(stat, "200.50 1000.00\n", 100) == pytest.approx(200.50 - 123.45)


def test_a_new_process_reads_its_own_start_between_its_launch_and_its_first_line() -> None:
    code = ("import time; t = time.time()\n"
            "from otel_train.common.process_start import process_start\n"
            "print(t, process_start().epoch_ns / 1e9)")
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    first_line, start = float(out[0]), float(out[1])
    # /proc counts in 10 ms ticks: 30 ms either side.
    assert before - 0.03 <= start <= first_line + 0.03
    found = process_start()
    assert found is not None and found.source == "process"
    assert found.epoch_ns < time.time_ns()
