"""``otel-train compare`` on real runs the library wrote: sleeps as phases, one run with a
forward 20% slower, an A/A pair, a two-rank pair; the verdict names what changed, the exit
status follows ``--fail-if-slower``, json and markdown come out whole, and what cannot be
compared is said plainly."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from sleep_runs import sleep_steps, start_sleep_runs
from train_helpers import clean_env, read_file_spans, start_in_process_run  # noqa: F401

from otel_train.cli.main import main
from otel_train.rundir.compare import (
    Comparison,
    CompareSettings,
    Row,
    RunSide,
    failures,
    throughput_note,
    verdict,
)
from otel_train.rundir.compare_format import format_comparison

FORWARD_SLEEPS = 20  # B: 24, forward 20% slower; the step (23 sleeps in A) ~17% slower
STEPS = 150
RANK_STEPS = 60
EVAL_EVERY = 40  # sleep_steps' default


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A, its twin A2, B (forward 20% slower, one phase of its own), and a two-rank pair
    (ranks-a, ranks-b: the same forwards), each rank a process, all run at the same time."""
    root = tmp_path_factory.mktemp("compare")
    slower = FORWARD_SLEEPS * 6 // 5
    procs = start_sleep_runs(
        [(root / "a", FORWARD_SLEEPS, STEPS), (root / "b", slower, STEPS, "log"),
         (root / "a2", FORWARD_SLEEPS, STEPS)]
        + [(root / name, forward, RANK_STEPS, "-", rank)
           for name, forward in (("ranks-a", FORWARD_SLEEPS), ("ranks-b", slower))
           for rank in (0, 1)])
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    return {p.name: p for p in root.iterdir()}


def _compare(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["compare", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_verdict_names_forward_when_forward_is_20_percent_slower(runs, capsys):
    code, out, _ = _compare(capsys, str(runs["a"]), str(runs["b"]))
    assert code == 0
    print(out)
    last = out.splitlines()[-1]
    # ~17% by the sleeps' count; a loaded machine's sleep overshoot moves it (20.8% seen).
    # A phase of a few us (data) can come out slower beyond noise on a loaded machine: the
    # table says so, and so does the verdict, as under 1% of the step.
    assert re.fullmatch(r"verdict: B is (1\d|2[0-4])\.\d% slower per step \[95% CI [\d.]+, "
                        r"[\d.]+\]; "
                        r"forward \+(1[2-9]|2[0-8])%"
                        r"(, \w+ [+-][\d.]+% \([+-][\d.]+ [mun]?s, under 1% of the step\))*"
                        r", others within noise", last), last
    forward = next(line for line in out.splitlines() if line.strip().startswith("forward"))
    assert forward.rstrip().endswith("slower")


def test_fail_if_slower_5_exits_1_and_says_what_was_slower(runs, capsys):
    # B's step is ~17% slower by its sleeps; a loaded machine's overshoot has put the
    # interval's low end under 10%, never under 5.
    code, _, err = _compare(capsys, str(runs["a"]), str(runs["b"]), "--fail-if-slower", "5")
    assert code == 1
    assert "otel-train compare: slower than allowed: step: +" in err


def test_fail_if_slower_30_exits_0_even_per_phase(runs, capsys):
    code, _, err = _compare(capsys, str(runs["a"]), str(runs["b"]), "--fail-if-slower", "30",
                            "--per-phase")
    assert code == 0 and "slower than allowed" not in err


def _row(name: str, a_median: float, ratio: float, low: float, high: float) -> Row:
    return Row(name, a_median, a_median * ratio, 100, 100, ratio, low, high, "slower")


def test_per_phase_fails_on_a_phase_but_not_on_one_too_small_to_move_the_step():
    step = _row("step", 0.010, 1.08, 1.06, 1.10)
    forward = _row("forward", 0.008, 1.25, 1.20, 1.30)
    tiny = _row("data", 0.000002, 2.0, 1.8, 2.2)  # +2 us: under 1% of the step
    side = RunSide("A", "a", [0], 100, [], {}, [], None, None, None)
    result = Comparison(side, side, CompareSettings(), step, None, [tiny, forward], [], [])
    assert failures(result, 10.0, per_phase=False) == []
    assert failures(result, 10.0, per_phase=True) == ["forward: +25.0% [95% CI 20.0, 30.0] > 10%"]
    assert failures(result, 5.0, per_phase=False) == ["step: +8.0% [95% CI 6.0, 10.0] > 5%"]
    # Named in the verdict all the same: the table marks it slower.
    assert verdict(result) == ("B is 8.0% slower per step [95% CI 6.0, 10.0]; forward +25%, "
                               "data +100.0% (+2 us, under 1% of the step)")


def _side(tokens_per_second: float | None = None, mean_seconds: float = 0.010) -> RunSide:
    from otel_train.rundir.compare_read import StepTimes

    steady = [StepTimes(0, i, i, mean_seconds) for i in range(10)]
    return RunSide("A", "a", [0], 10, steady, {}, [], None, tokens_per_second, None)


def test_a_phase_outside_noise_is_named_and_never_every_phase_within_noise():
    # The table's row: optimizer 1.023 [1.005, 1.043] slower, a 23 us change on a 10 ms step.
    step = Row("step", 0.010, 0.0101, 100, 100, 1.01, 0.995, 1.02, "within noise")
    optimizer = Row("optimizer", 0.001, 0.001023, 100, 100, 1.023, 1.005, 1.043, "slower")
    forward = Row("forward", 0.006, 0.006, 100, 100, 1.0, 0.99, 1.01, "within noise")
    result = Comparison(_side(), _side(), CompareSettings(), step, None, [forward, optimizer],
                        [], [])
    text = verdict(result)
    assert "every phase within noise" not in text
    assert text == ("B and A take the same time per step within noise (+1.0% [95% CI -0.5, "
                    "2.0]); optimizer +2.3% (+23 us, under 1% of the step), others within "
                    "noise")
    optimizer.status = "within noise"
    assert verdict(result).endswith("; every phase within noise")


def test_wall_per_step_is_named_when_it_says_other_than_the_step():
    step = Row("step", 0.010, 0.0101, 100, 100, 1.01, 0.995, 1.02, "within noise")
    wall = Row("wall per step", 0.012, 0.0132, 100, 100, 1.10, 1.08, 1.12, "slower")
    result = Comparison(_side(), _side(), CompareSettings(), step, wall, [], [], [])
    assert "; wall per step +10.0% slower (between steps too); no phase in both" in verdict(
        result)


def test_throughput_against_the_step_median_says_which_definition_when_they_disagree():
    # B/A 1.062 in tokens/s (B faster) beside a step median B/A 1.013 (B slower).
    step = Row("step", 0.010, 0.01013, 100, 100, 1.013, 1.004, 1.022, "within noise")
    a, b = _side(100000.0, 0.0100), _side(106200.0, 0.0095)
    result = Comparison(a, b, CompareSettings(), step, None, [], [], [])
    note = throughput_note(result)
    assert note is not None and note.startswith(
        "throughput (tokens/s, B/A 1.062) and the step median (B/A 1.013) point different "
        "ways: throughput is tokens over the steady steps' summed time, so it follows their "
        "mean (B/A 0.950) and the tokens per step (B/A 1.009)")
    assert "point different ways" in format_comparison(result, "text")
    assert json.loads(format_comparison(result, "json"))["throughput_note"] == note
    result.b = _side(95000.0, 0.0100)  # B slower by both: nothing to explain
    assert throughput_note(result) is None


def test_an_a_a_pair_does_not_fail_at_5_percent(runs, capsys):
    code, out, err = _compare(capsys, str(runs["a"]), str(runs["a2"]), "--fail-if-slower", "5",
                              "--per-phase")
    print(out)
    assert code == 0, err


def test_warm_up_and_eval_steps_are_left_out_and_counted(runs, capsys):
    _, out, _ = _compare(capsys, str(runs["a"]), str(runs["b"]))
    evals = sum(1 for i in range(5, STEPS) if i % EVAL_EVERY == EVAL_EVERY - 1)
    assert (f"A: {runs['a']} (1 rank, {STEPS} steps; {STEPS - 5 - evals} steady, left out: "
            f"5 warm-up, {evals} with monitoring)") in out
    assert "phases in B only (not compared): log" in out
    assert "monitoring overhead (monitoring / training time, every step): A " in out


def test_json_output_parses_and_holds_the_rows_and_the_verdict(runs, capsys):
    code, out, _ = _compare(capsys, str(runs["a"]), str(runs["b"]), "--format", "json",
                            "--seed", "7")
    doc = json.loads(out)
    assert code == 0
    assert doc["step"]["ratio"] > 1.05 and doc["step"]["status"] == "slower"
    assert [p["name"] for p in doc["phases"]] == ["data", "forward", "backward", "optimizer"]
    assert doc["phases_only_in_b"] == ["log"] and doc["bootstrap"]["seed"] == 7
    assert doc["a"]["excluded"]["warm-up"] == 5 and doc["verdict"].startswith("B is ")
    # The same seed gives the same output.
    assert json.loads(_compare(capsys, str(runs["a"]), str(runs["b"]), "--format", "json",
                               "--seed", "7")[1]) == doc


def test_markdown_output_is_a_verdict_and_a_table(runs, capsys):
    code, out, _ = _compare(capsys, str(runs["a"]), str(runs["b"]), "--format", "markdown")
    lines = out.splitlines()
    assert code == 0
    assert lines[0].startswith("**otel-train compare**: B is ")
    header = lines.index("| | A median | B median | B/A | 95% CI | |")
    assert lines[header + 1] == "|---|---:|---:|---:|---:|---|"
    table = lines[header + 2:lines.index("", header)]
    assert [row.count("|") for row in table] == [7] * len(table)
    assert table[0].startswith("| step |") and any("forward" in row for row in table)


def test_two_ranks_are_pooled_with_a_line_per_rank(runs, capsys):
    code, out, _ = _compare(capsys, str(runs["ranks-a"]), str(runs["ranks-b"]))
    assert code == 0
    assert f"A: {runs['ranks-a']} (2 ranks, {2 * RANK_STEPS} steps; " in out
    per_rank = next(line for line in out.splitlines() if line.startswith("step per rank"))
    assert "rank 0 +" in per_rank and "; rank 1 +" in per_rank
    assert "; forward +" in out.splitlines()[-1]


def test_one_rank_is_compared_alone_and_a_rank_absent_is_refused(runs, capsys):
    code, out, _ = _compare(capsys, str(runs["ranks-a"]), str(runs["ranks-b"]), "--rank", "1")
    assert code == 0 and f"(1 rank, {RANK_STEPS} steps; " in out and "step per rank" not in out
    code, _, err = _compare(capsys, str(runs["ranks-a"]), str(runs["ranks-b"]), "--rank", "3")
    assert code == 2 and "has no steps of rank 3 (its ranks: [0, 1])" in err


def test_a_missing_directory_and_a_run_without_span_files_are_refused(runs, tmp_path, capsys):
    code, out, err = _compare(capsys, str(tmp_path / "nowhere"), str(runs["a"]))
    assert code == 2 and out == "" and "does not exist" in err
    (tmp_path / "empty").mkdir()
    code, out, err = _compare(capsys, str(runs["a"]), str(tmp_path / "empty"))
    assert code == 2 and out == "" and "no span files" in err


def test_a_run_compared_with_itself_is_flagged_by_directory_run_id_or_identical_steps(
        runs, tmp_path, capsys):
    import shutil

    code, out, err = _compare(capsys, str(runs["a"]), str(runs["a"]))
    assert code == 0
    assert "warning: A and B are one run (the same directory): compare two runs" in out
    assert out.splitlines()[-1].startswith(
        "verdict: A and B are one run (the same directory): a run compared with itself shows "
        "no change; B and A take the same time per step within noise (+0.0% ")
    copy = tmp_path / "copy-of-a"
    shutil.copytree(runs["a"], copy)
    code, out, err = _compare(capsys, str(runs["a"]), str(copy), "--format", "json")
    # The copy keeps the costs file, so the run id says it first; without it, the steps do.
    assert json.loads(out)["same_run"] == "the same run id a" and "one run" in err
    for costs in copy.glob("monitoring_costs*.json"):
        costs.unlink()
    doc = json.loads(_compare(capsys, str(runs["a"]), str(copy), "--format", "json")[1])
    assert doc["same_run"] == "identical steps: one run's spans in both"
    # Two runs of the same code are two runs.
    doc = json.loads(_compare(capsys, str(runs["a"]), str(runs["a2"]), "--format", "json")[1])
    assert doc["same_run"] is None and not doc["verdict"].startswith("A and B are one run")


def test_a_run_with_only_warm_up_steps_is_refused_with_what_was_left_out(tmp_path, capsys):
    short = tmp_path / "short"
    with start_in_process_run(short, spans_path=None) as run:
        sleep_steps(run, 0, 3)
    code, _, err = _compare(capsys, str(short), str(short))
    assert code == 2 and "none of its 3 steps is steady (3 warm-up)" in err
    code, out, _ = _compare(capsys, str(short), str(short), "--warmup-steps", "0")
    assert code == 0 and "3 steady, left out: none left out" in out


def _summary_run(run_dir: Path, step_seconds: float, forward_seconds: float) -> Path:
    """A run directory holding two train.summary spans of 100 steps each, as summary mode
    writes them (docs/telemetry.md's attributes)."""
    def attr(key: str, value: float) -> dict:
        kind = "intValue" if isinstance(value, int) else "doubleValue"
        return {"key": key, "value": {kind: str(value) if kind == "intValue" else value}}

    lines = []
    for n in range(2):
        summary = {"traceId": f"{n + 1:032x}", "spanId": f"{n + 1:016x}", "flags": 1,
                   "name": "train.summary", "kind": 1, "startTimeUnixNano": "1",
                   "endTimeUnixNano": "2", "attributes": [
                       attr("train.rank", 0), attr("train.summary.steps", 100),
                       attr("train.summary.step.count", 100),
                       attr("train.summary.step.sum_seconds", 100 * step_seconds),
                       attr("train.summary.phase.forward.count", 100),
                       attr("train.summary.phase.forward.sum_seconds", 100 * forward_seconds)]}
        lines.append(json.dumps({"resourceSpans": [
            {"resource": {}, "scopeSpans": [{"spans": [summary]}]}]}) + "\n")
    run_dir.mkdir()
    (run_dir / "spans.jsonl").write_text("".join(lines))
    return run_dir


def test_runs_in_summary_mode_are_compared_by_their_means_and_say_so(tmp_path, capsys):
    a = _summary_run(tmp_path / "sa", 0.010, 0.008)
    b = _summary_run(tmp_path / "sb", 0.012, 0.010)
    code, out, _ = _compare(capsys, str(a), str(b))
    assert code == 0
    assert f"B: {b} (2 train.summary spans (summary mode))" in out
    assert "no per-step times in a summary-mode run: means over every summarized step" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[4:]}
    assert rows["step"][1:] == ["10.000", "ms", "12.000", "ms", "1.200"]
    assert rows["forward"][-1] == "1.250"
    doc = json.loads(_compare(capsys, str(a), str(b), "--format", "json")[1])
    assert doc["summary_mode"] and doc["rows"][0]["ratio"] == pytest.approx(1.2)
    code, _, err = _compare(capsys, str(a), str(b), "--fail-if-slower", "10")
    assert code == 2 and "--fail-if-slower needs per-step spans in both runs" in err


def test_a_per_step_run_against_a_summary_run_is_compared_by_means_too(runs, tmp_path, capsys):
    b = _summary_run(tmp_path / "sb", 0.5, 0.4)
    code, out, _ = _compare(capsys, str(runs["a"]), str(b))
    assert code == 0 and f"A: {runs['a']} ({STEPS} per-step spans)" in out
    assert "forward" in out and "backward" not in out  # only what both runs have


def test_throughput_is_tokens_over_the_steady_steps_time_when_steps_count_tokens(tmp_path,
                                                                                capsys):
    for name, sleep_seconds in (("t1", 0.002), ("t2", 0.004)):
        with start_in_process_run(tmp_path / name, spans_path=None) as run:
            for step in run.steps(range(20), loader="train"):
                with step.phase("forward"):
                    time.sleep(sleep_seconds)
                step.set_attribute("train.tokens", 512)
    code, out, _ = _compare(capsys, str(tmp_path / "t1"), str(tmp_path / "t2"), "--format",
                            "json")
    doc = json.loads(out)
    assert code == 0 and doc["a"]["samples_per_second"] is None
    for side, name in (("a", "t1"), ("b", "t2")):
        roots = sorted((s for s in read_file_spans(tmp_path / name) if s.name == "train.step"),
                       key=lambda s: s.attributes["train.step"])[5:]  # warm-up apart
        expected = 512 * len(roots) / sum(s.duration_seconds for s in roots)
        assert doc[side]["tokens_per_second"] == pytest.approx(expected, rel=1e-6)
    text = _compare(capsys, str(tmp_path / "t1"), str(tmp_path / "t2"))[1]
    assert ("throughput, tokens per second of steady steps (their tokens over their summed "
            "time, evaluation steps left out): A ") in text
    assert "samples per second" not in text  # not recorded: no line


def test_a_sampled_run_leaves_out_the_steps_kept_only_for_being_slow(tmp_path, capsys):
    with start_in_process_run(tmp_path / "sampled", spans_path=None, sample_ratio=0.2) as run:
        for step in run.steps(range(60), loader="train"):
            with step.phase("forward"):
                time.sleep(0.04 if step.index == 40 else 0.001)
    roots = [s for s in read_file_spans(tmp_path / "sampled") if s.name == "train.step"]
    unusual = [s for s in roots
               if s.attributes.get("train.sample.reason") not in ("ratio", "first", "monitor")]
    assert 40 in [s.attributes["train.step"] for s in unusual]  # (a loaded machine adds more)
    code, out, _ = _compare(capsys, str(tmp_path / "sampled"), str(tmp_path / "sampled"),
                            "--format", "json")
    excluded = json.loads(out)["a"]["excluded"]
    assert code == 0 and excluded["kept by sampling as unusual"] == len(unusual)
    assert json.loads(out)["a"]["steady_steps"] == len(roots) - sum(excluded.values())


def test_monitoring_between_steps_counts_in_the_overhead_and_not_in_wall_per_step(tmp_path,
                                                                                 capsys):
    with start_in_process_run(tmp_path / "m", spans_path=None) as run:
        for _ in range(3):  # ten steps, then a checkpoint between steps
            for step in run.steps(range(10), loader="train"):
                with step.phase("forward"):
                    time.sleep(0.002)
            with run.monitor("checkpoint"):
                time.sleep(0.01)
    spans = read_file_spans(tmp_path / "m")
    roots = [s for s in spans if s.name == "train.step"]
    between = [s for s in spans if s.name == "train.checkpoint" and s.is_root]
    assert len(between) == 3 and len({s.attributes["train.step"] for s in roots}) == 30
    expected = sum(s.duration_seconds for s in between) / sum(
        s.duration_seconds for s in roots)
    code, out, _ = _compare(capsys, str(tmp_path / "m"), str(tmp_path / "m"), "--format",
                            "json")
    doc = json.loads(out)
    assert code == 0
    assert doc["a"]["monitoring_overhead_ratio"] == pytest.approx(expected, rel=1e-6)
    # 25 steady steps (5 warm-up); the last has no next step, 2 more have a checkpoint after.
    assert doc["wall_per_step"]["a_steps"] == 25 - 1 - 2
