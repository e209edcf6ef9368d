"""SlowStepSpanProcessor: judged on training time against a robust per-loader baseline,
warm-up left out, train.slow marking, breakdowns limited by count per window."""

from __future__ import annotations

import logging
import math
import random
from pathlib import Path

import pytest
from span_trees import feed, step_spans, train_step

import otel_train
from otel_train.common import attributes as A
from otel_train.derived.slow_steps import SlowStepSpanProcessor

pytestmark = pytest.mark.timeout(60)


def test_a_step_whose_training_time_is_over_factor_times_the_median_is_counted_and_marked(
) -> None:
    slow = SlowStepSpanProcessor(factor=3.0, window_steps=50, warmup_steps=0)
    for i in range(20):
        feed(slow, train_step(i, step_ms=100))
    planted = train_step(20, step_ms=400)  # 400 ms of training
    feed(slow, planted)
    feed(slow, train_step(21, step_ms=299))  # just under 3x: not slow
    assert slow.slow_steps == 1
    assert planted[-1].attributes[A.SLOW] is True
    assert slow.median_seconds() == pytest.approx(0.1)


def test_a_step_made_long_by_monitoring_is_not_a_slow_step() -> None:
    slow = SlowStepSpanProcessor(factor=3.0, warmup_steps=0)
    for i in range(20):
        feed(slow, train_step(i, step_ms=100))
    evaluation = train_step(20, step_ms=5100, monitor_ms=5000)  # 100 ms of training
    feed(slow, evaluation)
    assert slow.slow_steps == 0
    assert evaluation[-1].attributes[A.SLOW] is False


def test_warm_up_steps_are_neither_judged_nor_in_the_baseline() -> None:
    slow = SlowStepSpanProcessor(warmup_steps=3, min_history=5)
    for i in range(3):
        feed(slow, train_step(i, step_ms=30_000))  # compilation
    for i in range(3, 8):
        feed(slow, train_step(i, step_ms=100))
    assert slow.slow_steps == 0
    assert slow.median_seconds() == pytest.approx(0.1)  # the compile steps left out
    feed(slow, train_step(8, step_ms=400))
    assert slow.slow_steps == 1


def test_no_step_is_slow_by_ratio_before_min_history() -> None:
    slow = SlowStepSpanProcessor(min_history=5, warmup_steps=0)
    feed(slow, train_step(0, step_ms=100))
    feed(slow, train_step(1, step_ms=10_000))
    assert slow.slow_steps == 0
    assert slow.median_seconds() is None


def test_each_loader_has_its_own_baseline() -> None:
    slow = SlowStepSpanProcessor(factor=2.5, warmup_steps=0)
    phases = [("forward", "train", 0, 50)]
    for i in range(40):  # supervised steps of 100 ms, rollouts of 1 s, interleaved
        feed(slow, step_spans(2 * i, phases, 100, loader="sft"))
        feed(slow, step_spans(2 * i + 1, phases, 1000, loader="rollout"))
    assert slow.slow_steps == 0
    feed(slow, step_spans(80, phases, 300, loader="sft"))  # 3x its own loader
    assert slow.slow_steps == 1
    assert "of loader 'sft'" in (slow.last_slow or "")


def test_a_loop_that_varies_a_lot_by_nature_does_not_cry_wolf() -> None:
    # training time spread wide (lognormal, sigma 0.6): 2.5x the median is common here;
    # the MAD term keeps the threshold above the loop's own spread.
    rng = random.Random(7)
    slow = SlowStepSpanProcessor(factor=2.5)
    for i in range(2000):
        feed(slow, train_step(i, step_ms=100 * math.exp(rng.gauss(0, 0.6))))
    share = slow.slow_steps / 2000
    print(f"wide-spread loop: {slow.slow_steps} of 2000 steps flagged ({share:.2%})")
    assert share < 0.01  # without the spread term: ~6% (P(lognormal(0, 0.6) > 2.5))


def test_a_jittery_healthy_loop_with_evals_flags_well_under_1_percent_and_every_planted_step(
        caplog: pytest.LogCaptureFixture) -> None:
    """3000 steps, 8% lognormal jitter, an eval every 50 steps (40x a step), 10 planted
    steps whose training takes 3x: under 1% flagged in all, every planted step caught and
    explained with its breakdown."""
    rng = random.Random(1234)
    slow = SlowStepSpanProcessor()  # the defaults: factor 2.5, warm-up 5, window 100
    planted = set(range(137, 3000, 300))
    flagged: list[int] = []
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for i in range(3000):
            data_ms = 10 * math.exp(rng.gauss(0, 0.08))
            compute_ms = 90 * math.exp(rng.gauss(0, 0.08))
            if i in planted:
                data_ms, compute_ms = 30.0, 270.0  # 3x on the training side
            phases = [("data", "train", 0, data_ms),
                      ("forward", "train", data_ms, data_ms + compute_ms * 0.4),
                      ("backward", "train", data_ms + compute_ms * 0.4, data_ms + compute_ms)]
            total = data_ms + compute_ms
            if i % 50 == 0:  # the eval step: inference + validation loss, 4 s
                phases += [("inference", "monitor", total, total + 3000),
                           ("val_loss", "monitor", total + 3000, total + 4000)]
                total += 4000
            spans = step_spans(i, phases, total + 0.5)
            feed(slow, spans)
            if spans[-1].attributes[A.SLOW]:
                flagged.append(i)
    false_positives = [i for i in flagged if i not in planted]
    print(f"jittery loop: {len(flagged)} of 3000 flagged ({len(flagged) / 3000:.2%}), "
          f"{len(false_positives)} not planted; {len(planted)} planted")
    assert planted <= set(flagged)
    assert len(flagged) / 3000 < 0.01
    assert len(false_positives) <= 3
    explained = [r.getMessage() for r in caplog.records if "slow step" in r.getMessage()]
    for i in planted:
        text = next(t for t in explained if t.startswith(f"otel-train: slow step {i}:"))
        assert "training 0.300 s" in text and "forward" in text and "backward" in text


def test_an_absolute_limit_flags_training_time_after_warm_up() -> None:
    slow = SlowStepSpanProcessor(absolute_seconds=0.15, warmup_steps=1)
    feed(slow, train_step(0, step_ms=200))  # warm-up
    assert slow.slow_steps == 0
    spans = train_step(1, step_ms=200)
    feed(slow, spans)
    assert slow.slow_steps == 1 and spans[-1].attributes[A.SLOW] is True
    feed(slow, train_step(2, step_ms=1100, monitor_ms=1000))  # 100 ms of training
    assert slow.slow_steps == 1


def test_the_slow_step_warning_shows_the_phase_breakdown(
        caplog: pytest.LogCaptureFixture) -> None:
    slow = SlowStepSpanProcessor(warmup_steps=0)
    for i in range(10):
        feed(slow, train_step(i, step_ms=100))
    phases = [("generation", "train", 0, 452), ("test_gen", "train", 452, 573),
              ("inference", "monitor", 573, 640)]
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        feed(slow, step_spans(10, phases, 653))
    text = caplog.text
    assert ("slow step 10: training 0.586 s (5.9x the median 0.100 s of loader 'train'); "
            "step 0.653 s") in text
    assert "generation" in text and "69.2%" in text
    assert "inference" in text and "[monitor]" in text
    assert "other" in text and "(not in any phase)" in text
    lines = slow.last_slow.splitlines() if slow.last_slow else []
    assert [ln.split()[0] for ln in lines[1:]] == ["generation", "test_gen", "inference", "other"]


def test_the_first_slow_steps_are_explained_then_summed_up_in_a_calm_rhythm(
        caplog: pytest.LogCaptureFixture) -> None:
    # The demo shape: 10 ms steps, slow ones (50-90 ms) now and then, for 5000
    # steps (50 s): 3 explained, then one summary per 30 s of steps, the rest at shutdown.
    slow = SlowStepSpanProcessor(absolute_seconds=0.04, warmup_steps=0, max_explanations=3,
                                 explain_window_steps=100)
    slow_at = {25, 59, 70, 95, 140, 188, 261, 294, 299, *range(1000, 5000, 250)}
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for i in range(5000):
            ms = (90 if i == 188 else 50) if i in slow_at else 10
            feed(slow, paced_step(i, ms, every_ms=10.0))
        slow.shutdown()
    lines = [r.getMessage() for r in caplog.records]
    assert slow.slow_steps == len(slow_at) == 25
    heads = [ln.splitlines()[0] for ln in lines]
    assert [h.split(":")[1].strip() for h in heads[:3]] == [
        "slow step 25", "slow step 59", "slow step 70"]  # explained, with their breakdown
    assert all("backward" not in ln for ln in lines[3:])  # then one line each
    # 30 s (of steps) after the third explanation (step 70 ends at 0.75 s): step 3075 sums
    # up the 15 slow steps since step 95 in one line.
    assert heads[3].startswith("otel-train: 15 more slow steps since step 95 (the worst: "
                               "step 188, 0.090 s of training, 9.0x the median 0.010 s); ")
    assert "counted in otel_train_slow_steps_total" in heads[3]  # where they are: said once
    # The rest at shutdown, without the explanation again.
    assert heads[4] == ("otel-train: 7 more slow steps since step 3250 (the worst: step 3250, "
                        "0.050 s of training, 5.0x the median 0.010 s)")
    assert len(lines) == 5 and slow.unexplained == 22


def test_a_lone_slow_step_after_a_quiet_spell_is_explained_in_full(
        caplog: pytest.LogCaptureFixture) -> None:
    slow = SlowStepSpanProcessor(absolute_seconds=0.05, warmup_steps=0, max_explanations=1)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for i in range(4000):  # 10 ms steps; slow ones at 10 and 11, then alone at 3500
            feed(slow, paced_step(i, 100 if i in (10, 11, 3500) else 10, every_ms=10.0))
        slow.shutdown()
    heads = [r.getMessage().splitlines()[0] for r in caplog.records]
    assert heads[0].startswith("otel-train: slow step 10:")
    assert heads[1].startswith("otel-train: 1 more slow step: step 11 (0.100 s of training, "
                               "10.0x the median 0.010 s); after the first 1, slow steps")
    assert heads[2].startswith("otel-train: slow step 3500:")
    assert len(heads) == 3


def test_with_several_ranks_the_explanation_names_its_rank() -> None:
    slow = SlowStepSpanProcessor(absolute_seconds=0.05, warmup_steps=0, world_size=4)
    feed(slow, step_spans(3, [("forward", "train", 0, 90)], 100, rank=2))
    assert (slow.last_slow or "").startswith("otel-train: slow step 3 (rank 2): training")


def test_a_step_of_0_2_ms_among_10_us_steps_is_not_slow() -> None:
    slow = SlowStepSpanProcessor(warmup_steps=0)
    for i in range(50):  # an empty loop body: the baseline is scheduler jitter
        feed(slow, train_step(i, step_ms=0.01))
    jitter = train_step(50, step_ms=0.2)  # 20x the median, but 0.19 ms over it
    feed(slow, jitter)
    assert slow.slow_steps == 0 and jitter[-1].attributes[A.SLOW] is False


def test_a_50_ms_step_among_5_ms_steps_is_slow_and_counted() -> None:
    slow = SlowStepSpanProcessor(warmup_steps=0)
    for i in range(50):
        feed(slow, train_step(i, step_ms=5))
    planted = train_step(50, step_ms=50)
    feed(slow, planted)
    assert slow.slow_steps == 1 and planted[-1].attributes[A.SLOW] is True
    assert (slow.last_slow or "").startswith(
        "otel-train: slow step 50: training 0.050 s (10.0x the median 0.005 s")


def test_a_median_under_a_millisecond_is_said_in_microseconds() -> None:
    slow = SlowStepSpanProcessor(warmup_steps=0)
    for i in range(50):
        feed(slow, train_step(i, step_ms=0.02))
    feed(slow, train_step(50, step_ms=3))
    assert (slow.last_slow or "").startswith(
        "otel-train: slow step 50: training 0.003 s (150x the median 20 us")


def paced_step(index: int, step_ms: float, every_ms: float) -> list:
    """A step of ``step_ms`` starting ``index x every_ms`` after the first."""
    return step_spans(index, [("forward", "train", 0, step_ms)], step_ms,
                      start_ms=index * every_ms)


def test_with_the_console_off_slow_steps_are_counted_and_said_in_summary_lines(
        caplog: pytest.LogCaptureFixture) -> None:
    slow = SlowStepSpanProcessor(warmup_steps=0, explain=False)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for i in range(3000):  # 10 ms steps, every 100th one 50 ms: 29 slow steps
            feed(slow, paced_step(i, 50 if i % 100 == 99 else 10, every_ms=10.0))
        said_while_running = [r.getMessage() for r in caplog.records]
        slow.shutdown()
    assert slow.slow_steps == 30
    assert len(said_while_running) == 1  # the first one; the run lasted under 15 minutes
    assert said_while_running[0].startswith("otel-train: slow step 99: training 0.050 s")
    assert "the console is off: further slow steps are counted" in said_while_running[0]
    final = caplog.records[-1].getMessage()
    assert final.startswith("otel-train: 30 slow step(s) so far (the slowest: step 99, "
                            "0.050 s of training, 5.0x the median 0.010 s)")
    assert "otel_train_slow_steps_total" in final
    assert len(caplog.records) == 2


def test_with_the_console_off_a_long_run_gets_one_summary_per_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    slow = SlowStepSpanProcessor(warmup_steps=0, explain=False)
    with caplog.at_level(logging.WARNING, logger="otel_train"):
        for i in range(400):  # 10 s steps for 4000 s, every 10th one 50 s
            feed(slow, paced_step(i, 50_000 if i % 10 == 9 else 10_000, every_ms=10_000.0))
    lines = [r.getMessage() for r in caplog.records]
    assert slow.slow_steps == 40
    assert 3 <= len(lines) <= 6  # one per 15 minutes of steps
    assert all(ln.startswith("otel-train: ") and "slow step" in ln for ln in lines)


def test_an_empty_loop_with_the_console_off_logs_a_handful_of_lines_at_most(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        capsys: pytest.CaptureFixture[str]) -> None:
    import time

    with caplog.at_level(logging.INFO, logger="otel_train"):
        run = otel_train.start_run(exporter="none", prometheus_port=None, console=False,
                                   status_dir=str(tmp_path))
        for step in run.steps(range(13_000)):
            if step.index % 2000 == 1999:
                # A real slow step now and then, long enough for the span worker to make room
                # in the queue the empty steps fill, on a loaded machine too.
                time.sleep(0.2)
        slow_steps = run._telemetry.derived.slow.slow_steps
        run.shutdown(timeout=10)
    lines = [r.getMessage() for r in caplog.records if "slow step" in r.getMessage()]
    # Counted (the ones the bounded queue did not drop: an empty loop outruns it).
    assert slow_steps >= 1
    assert 1 <= len(lines) <= 3, lines
    assert len(capsys.readouterr().err.splitlines()) <= 5


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="slow_step_factor"):
        SlowStepSpanProcessor(factor=1.0)
    with pytest.raises(ValueError, match="slow_step_seconds"):
        SlowStepSpanProcessor(absolute_seconds=0)
    with pytest.raises(ValueError, match="warmup_steps"):
        SlowStepSpanProcessor(warmup_steps=-1)
    with pytest.raises(ValueError, match="min_excess_seconds"):
        SlowStepSpanProcessor(min_excess_seconds=-0.001)


def test_a_step_that_drains_the_device_backlog_before_its_monitoring_is_not_slow(
        tmp_path, monkeypatch):
    # monitor_sync (the default on an accelerator): the host runs ahead of the device, and
    # the synchronize at the start of monitoring waits for the backlog the steps before left.
    # That wait is theirs, said on the monitoring span, not this step's slowness.
    import time

    from train_helpers import read_file_spans, start_in_process_run, use_fake_accelerator

    acc = use_fake_accelerator(monkeypatch)
    with start_in_process_run(tmp_path) as run:
        for step in run.steps(range(30)):
            with step.phase("forward"):
                acc.launch(0.008)  # the device takes 8 ms a step
                time.sleep(0.002)  # the host 2 ms: it runs ahead
            if step.index % 10 == 9:
                with step.monitor("val_loss"):
                    acc.launch(0.001)
    roots = {s.attributes["train.step"]: s for s in read_file_spans(run.spans_path)
             if s.name == "train.step"}
    waits = [s.attributes["train.device.queued_wait_seconds"]
             for s in read_file_spans(run.spans_path) if s.name == "val_loss"]
    assert min(waits) >= 0.03  # ~6 ms of backlog a step, 10 steps
    assert not any(roots[i].attributes["train.slow"] for i in (19, 29))


@pytest.mark.parametrize("explain", [True, False])
def test_a_frame_of_steps_in_one_call_is_judged_as_step_by_step(explain, caplog) -> None:
    """on_steps (the chain's frames) against on_step per view: the same steps marked slow
    (on the view and the record's root), the same lines said, the same running figures,
    through the warm-up, two loaders, slow steps explained then summed up, steps counted
    under FLOP counting, monitor_sync's queued waits and a threshold in seconds."""
    from otel_train.records.span_rows import view_from_record

    def views(seed: int, absolute: bool):
        rng = random.Random(seed)
        out = []
        for i in range(400):
            dur = int(rng.choice([1e6, 1.1e6, 0.9e6, 8e6, 1e6]) * (1 + 10 * (i % 97 == 50)))
            attrs = {A.STEP: i, A.SLOW: False}
            if i % 31 == 7:
                attrs[A.FLOPS_COUNTED] = True
            extra = {A.DEVICE_QUEUED_WAIT: 0.0004} if i % 11 == 3 else None
            phases = [("forward", "train", None, dur // 2, 1, 7, 10, 20, None, (), None, None),
                      ("val", A.KIND_MONITOR, None, dur // 5, 2, 7, 20, 30, None, (), extra,
                       None)]
            rec = ("train.step", i + 1, 7, 1, 10**18 + i * 10**9, 10**18 + i * 10**9 + dur,
                   attrs, None, (), phases, None)
            view = view_from_record(rec, 0)
            view.loader = "train" if i % 3 else "other"
            out.append((rec, view))
        return out

    for absolute in (None, 0.012):
        outcomes = []
        for frame_at_a_time in (False, True):
            caplog.clear()
            slow = SlowStepSpanProcessor(warmup_steps=5, window_steps=40, max_explanations=2,
                                         explain_window_steps=20, explain=explain,
                                         absolute_seconds=absolute)
            pairs = views(3, absolute is not None)
            with caplog.at_level(logging.WARNING, logger="otel_train"):
                if frame_at_a_time:
                    failed = []
                    for k in range(0, len(pairs), 64):
                        slow.on_steps([v for _, v in pairs[k:k + 64]],
                                      lambda p, v, e: failed.append(e))
                    assert not failed
                else:
                    for _, view in pairs:
                        slow.on_step(view)
            outcomes.append(([v.slow for _, v in pairs], [r[6][A.SLOW] for r, _ in pairs],
                             [v.slow_explained for _, v in pairs], slow.export_state(),
                             slow.slow_steps, slow.unexplained, caplog.messages[:]))
        assert outcomes[0] == outcomes[1]
        assert sum(outcomes[0][0]) >= 3 and outcomes[0][6]  # slow steps, lines said
