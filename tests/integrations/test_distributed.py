"""Two ranks under torchrun (gloo, CPU): one trace per step across ranks, metrics per rank."""

from __future__ import annotations

import re
import subprocess
from collections import defaultdict

from integration_support import BIN, EXAMPLES, subprocess_env
from otlp_receivers import HttpOtlpReceiver

STEPS = 6
SLOW_SECONDS = 0.1
# What each rank prints; the URL ends at its port digits (see where it is matched).
_RANK_LINE = re.compile(
    r"rank (\d): run [^\s,]+, metrics (http://(?:\[[^\]\s]*\]|[^\s:/\[]+):\d+)")


def _metric(text: str, name: str, **labels: str) -> float:
    """The value of the one sample of ``name`` whose labels include ``labels``."""
    for line in text.splitlines():
        m = re.match(rf"{name}\{{(.*)\}} (\S+)$", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            return float(m.group(2))
    raise AssertionError(f"no sample {name}{labels}")


def test_two_ranks_share_step_traces_and_serve_their_own_metrics(tmp_path) -> None:
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    with HttpOtlpReceiver() as recv:
        env = subprocess_env(recv, tmp_path, protocol="http/protobuf",
                             OTEL_TRAIN_PROMETHEUS_PORT="0")
        proc = subprocess.run(
            [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2",
             str(EXAMPLES / "distributed.py"), "--steps", str(STEPS), "--slow-rank", "1",
             "--slow-seconds", str(SLOW_SECONDS), "--metrics-dir", str(metrics_dir)],
            env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        spans = recv.spans()

    roots = [s for s in spans if s.name == "train.step"]
    by_step: dict[int, list] = defaultdict(list)
    for r in roots:
        by_step[r.attributes["train.step"]].append(r)
    assert sorted(by_step) == list(range(STEPS))
    for index, pair in by_step.items():
        assert sorted(r.attributes["train.rank"] for r in pair) == [0, 1]
        assert all(r.attributes["train.world_size"] == 2 for r in pair)
        assert len({r.trace_id for r in pair}) == 1, f"step {index} split across traces"
    assert len({pair[0].trace_id for pair in by_step.values()}) == STEPS
    assert len({r.attributes["train.run.id"] for r in roots}) == 1

    # Two ranks print at once: print() writes the text and its newline separately, so one
    # rank's line can start right after the other's port. Match up to the port digits.
    urls = _RANK_LINE.findall(proc.stdout)
    assert sorted(rank for rank, _ in urls) == ["0", "1"]
    assert len({url for _, url in urls}) == 2  # each rank its own endpoint
    scrape = {rank: (metrics_dir / f"rank{rank}.prom").read_text() for rank in (0, 1)}
    for rank, text in scrape.items():
        assert _metric(text, "otel_train_steps_total", rank=str(rank)) == STEPS
    forward = {rank: _metric(text, "otel_train_phase_duration_seconds_sum", phase="forward",
                             rank=str(rank)) for rank, text in scrape.items()}
    # The straggler's forward holds STEPS sleeps; the fast rank's forward holds none. Its own
    # six forwards of the tiny model read 0.07 s on a loaded 2-core CI run: half the sleeps'
    # total leaves room for that and still fails if the sleeps were charged to rank 0 too.
    assert forward[1] >= STEPS * SLOW_SECONDS
    assert forward[0] < 0.5 * STEPS * SLOW_SECONDS
