"""Two gloo ranks under DDP (CPU): every step's root carries its collectives, and each rank's
/metrics counts them per op, with the time waited and the rank's own work. The default route:
the derived metrics run in the exporter process, whose state the rank's /metrics serves."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest
from ddp_support import DdpRanks, child_env
from otlp_receivers import HttpOtlpReceiver

from otel_train.common import attributes as A

pytestmark = pytest.mark.timeout(120)

STEPS = 12
# The child's model: Linear(32, 64) + Linear(64, 1), float32 gradients, one DDP bucket.
GRADIENT_BYTES = (32 * 64 + 64 + 64 * 1 + 1) * 4


def _samples(text: str, name: str) -> dict[str, float]:
    """``name``'s samples by their label text."""
    return {m.group(1): float(m.group(2))
            for m in re.finditer(rf"^{name}\{{(.*)\}} (\S+)$", text, re.MULTILINE)}


def test_each_step_root_carries_its_gradient_all_reduce_and_each_rank_serves_the_counters(
        tmp_path) -> None:
    with HttpOtlpReceiver() as recv:
        env = child_env({
            "OTEL_TRAIN_EXPORTER": "otlp", "OTEL_TRAIN_OTLP_ENDPOINT": recv.endpoint,
            "OTEL_TRAIN_OTLP_PROTOCOL": "http/protobuf", "OTEL_TRAIN_CONSOLE": "false",
            "OTEL_TRAIN_RUN_ID": "comm-test", "OTEL_TRAIN_STATUS_DIR": str(tmp_path / "status"),
            "OTEL_TRAIN_SHUTDOWN_TIMEOUT_SECONDS": "10"})
        with DdpRanks(tmp_path, env, ["--steps", str(STEPS), "--work", "2", "--explicit",
                                      "--metrics-file", str(tmp_path / "rank{rank}.prom")]
                      ) as ranks:
            codes = ranks.wait(timeout=100)
            assert codes == [0, 0], ranks.stderr(0) + ranks.stderr(1)
        roots = recv.spans(A.STEP_SPAN_NAME)

    by_rank: dict[int, dict[int, dict]] = defaultdict(dict)
    for root in roots:
        by_rank[root.attributes[A.RANK]][root.attributes[A.STEP]] = root
    assert sorted(by_rank) == [0, 1] and all(len(s) == STEPS for s in by_rank.values())
    for rank, steps in by_rank.items():
        for index, root in steps.items():
            attrs = root.attributes
            # one DDP bucket + one explicit all_reduce of the loss, nothing counted twice
            assert attrs[A.COMM_COUNT] == 2, (rank, index, attrs)
            assert attrs[A.COMM_BYTES] == GRADIENT_BYTES + 4
            duration = (root.end_time_unix_nano - root.start_time_unix_nano) / 1e9
            assert 0 < attrs[A.COMM_EXPOSED_SECONDS] < duration
            assert attrs[A.OWN_WORK_SECONDS] > 0
            assert attrs[A.OWN_WORK_SECONDS] == pytest.approx(
                duration - attrs[A.COMM_EXPOSED_SECONDS], abs=1e-6)
            (event,) = [ev for name, ev in root.events if name == A.COMM_EVENT]
            assert event[A.COMM_OP] == "all_reduce" and event[A.COMM_COUNT] == 2

    for rank in (0, 1):
        text = (tmp_path / f"rank{rank}.prom").read_text()
        labels = f'op="all_reduce",rank="{rank}"'
        assert _samples(text, A.METRIC_COLLECTIVES)[labels] == 2 * STEPS
        assert _samples(text, A.METRIC_COLLECTIVE_BYTES)[labels] == STEPS * (GRADIENT_BYTES + 4)
        steps = by_rank[rank].values()
        assert _samples(text, A.METRIC_COLLECTIVE_SECONDS)[labels] == pytest.approx(
            sum(r.attributes[A.COMM_SECONDS] for r in steps))
        assert _samples(text, A.METRIC_COLLECTIVE_EXPOSED_SECONDS)[f'rank="{rank}"'] == (
            pytest.approx(sum(r.attributes[A.COMM_EXPOSED_SECONDS] for r in steps)))
        assert _samples(text, A.METRIC_OWN_WORK_SECONDS)[f'rank="{rank}"'] == pytest.approx(
            sum(r.attributes[A.OWN_WORK_SECONDS] for r in steps))


def test_fsdp_s_all_gathers_and_reduce_scatters_are_counted_per_op(tmp_path) -> None:
    env = child_env({"OTEL_TRAIN_EXPORTER": "none", "OTEL_TRAIN_CONSOLE": "false",
                     "OTEL_TRAIN_EXPORT_PROCESS": "false", "OTEL_TRAIN_RUN_ID": "comm-fsdp",
                     "OTEL_TRAIN_STATUS_DIR": str(tmp_path / "status")})
    with DdpRanks(tmp_path, env, ["--steps", "4", "--work", "1", "--fsdp",
                                  "--metrics-file", str(tmp_path / "rank{rank}.prom")]) as ranks:
        assert ranks.wait(timeout=100) == [0, 0], ranks.stderr(0) + ranks.stderr(1)
    text = (tmp_path / "rank0.prom").read_text()
    count = _samples(text, A.METRIC_COLLECTIVES)
    nbytes = _samples(text, A.METRIC_COLLECTIVE_BYTES)
    # Two sharded layers: each gathered before forward and again before backward, its
    # gradients reduce-scattered once; what rank 0 sends is its shard and the full gradients.
    assert count['op="all_gather_single",rank="0"'] == 4 * 4
    assert count['op="reduce_scatter_single",rank="0"'] == 4 * 2
    assert nbytes['op="reduce_scatter_single",rank="0"'] >= 4 * GRADIENT_BYTES
    assert _samples(text, A.METRIC_COLLECTIVE_EXPOSED_SECONDS)['rank="0"'] > 0
