"""``otel-train export --format chrome-trace``: valid Trace Event Format, one track per rank,
steps with their phases nested inside by time, monitoring marked as such."""

from __future__ import annotations

import json
import random

import pytest
from train_helpers import clean_env, start_in_process_run  # noqa: F401

from otel_train.cli.main import main


def _two_rank_run(tmp_path) -> None:
    """Two ranks of one run writing their per-rank span files into one directory."""
    for rank in (0, 1):
        with start_in_process_run(tmp_path, spans_path=None, rank=rank, world_size=2,
                            run_id="two-ranks") as run:
            for step in run.steps(range(4), loader="train"):
                with step.phase("forward"):
                    pass
                if step.index == 2:
                    with step.monitor("val_loss"):
                        for _ in step.iter_data([1, 2], loader="val"):
                            pass
            with run.monitor("checkpoint"):
                pass


def _check_trace_event_format(doc: dict) -> list[dict]:
    """The Trace Event Format rules Perfetto and chrome://tracing rely on."""
    assert isinstance(doc["traceEvents"], list)
    events = doc["traceEvents"]
    for e in events:
        assert e["ph"] in ("X", "M"), e
        assert isinstance(e["pid"], int) and isinstance(e["name"], str)
        if e["ph"] == "X":
            assert isinstance(e["tid"], int)
            assert isinstance(e["ts"], (int, float)) and e["ts"] > 1.6e15  # epoch µs
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0
    return [e for e in events if e["ph"] == "X"]


def test_the_export_is_trace_event_format_with_one_track_per_rank(tmp_path, capsys):
    _two_rank_run(tmp_path)
    assert main(["export", str(tmp_path), "--format", "chrome-trace"]) == 0
    path = tmp_path / "trace.json"
    assert capsys.readouterr().out.strip() == str(path)
    doc = json.loads(path.read_text())
    events = _check_trace_event_format(doc)
    tracks = {(e["pid"], e["tid"]) for e in events}
    assert tracks == {(0, 1), (1, 1)}  # one track per rank
    names = {e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    for rank in (0, 1):
        mine = [e for e in events if e["pid"] == rank]
        steps = [e for e in mine if e["cat"] == "step"]
        assert sorted(e["args"]["step"] for e in steps) == [0, 1, 2, 3]
        # Every phase lies inside its step on the same track (how the viewers nest them).
        by_step = {e["args"]["step"]: e for e in steps}
        for e in mine:
            if e["cat"] == "phase" or (e["cat"] == "monitoring" and e["name"] != "train.checkpoint"):
                s = by_step[e["args"]["step"]]
                assert s["ts"] <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"]
        monitoring = {e["name"] for e in mine if e["cat"] == "monitoring"}
        # Validation data read inside val_loss is monitoring work too.
        assert monitoring == {"val_loss", "data[val]", "train.checkpoint"}
        assert {e["name"] for e in mine if e["cat"] == "phase"} == {"data[train]", "forward"}


def test_phases_a_fraction_of_a_microsecond_inside_their_step_stay_inside_once_read():
    # Epoch microseconds near 1.8e15 hold only to 0.25 us in the reader's double: printed
    # from floats, a phase that ends 1 ns before its step could end after it once read.
    from otel_train.rundir.chrome_trace import _event, _grid_ns

    grid = _grid_ns(1_795_561_220_402_298_000)
    assert grid == 250
    rng = random.Random(7)
    for _ in range(2000):
        step_start = 1_795_561_220_402_298_000 + rng.randrange(10**9)
        a = step_start + rng.randrange(400)  # forward: starts within 0.4 us of the step
        b = a + rng.randrange(1, 400)  # ... and ends before the next phase starts
        c = b + rng.randrange(400)
        step_end = c + rng.randrange(1, 400)
        read = [json.loads(_event(name, start, end, {"train.step": 0}, grid)[1])
                for name, start, end
                in (("train.step", step_start, step_end), ("forward", a, b),
                    ("backward", c, step_end))]
        step, first, second = ((e["ts"], e["ts"] + e["dur"]) for e in read)
        assert step[0] <= first[0] <= first[1] <= second[0] <= second[1] <= step[1]


def test_an_unknown_export_format_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        main(["export", str(tmp_path), "--format", "svg"])
