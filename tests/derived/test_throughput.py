"""Throughput and MFU: tokens/s on a real /metrics scrape within 2% of tokens over the loop's
measured wall time (an MLP with an int option, the demo's tiny GPT counted from its batches);
the tiny GPT's counted FLOPs within 10% of the exact layer sum; MFU per basis; the console
line; the processor's window, fill-ins and state."""

from __future__ import annotations

import io
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from train_helpers import clean_env, start_test_run  # noqa: F401

from otel_train.cli.demo import _batches, build_model
from otel_train.common import attributes as A
from otel_train.derived.console import ConsoleReportSpanProcessor
from otel_train.derived.throughput import ThroughputSpanProcessor
from otel_train.records.span_rows import RowRoot
from otel_train.records.steps_view import StepView

pytestmark = pytest.mark.timeout(120)


def _scrape(run: Any, expected_tokens: float) -> dict[str, float]:
    """The run's /metrics samples once its tokens counter reached ``expected_tokens``."""
    return _scrape_samples(run, 'otel_train_tokens_total{rank="0"}', expected_tokens)


def _scrape_samples(run: Any, series: str, expected: float, timeout_seconds: float = 10.0
                    ) -> dict[str, float]:
    """The run's /metrics samples once ``series`` reached ``expected``."""
    run.flush()
    deadline = time.monotonic() + timeout_seconds
    while True:
        text = urllib.request.urlopen(run.prometheus_url + "/metrics", timeout=5).read().decode()
        samples = {m.group(1): float(m.group(2)) for m in re.finditer(
            r"^(otel_train_\S+?(?:\{[^}]*\})?) (\S+)$", text, re.MULTILINE)}
        if samples.get(series) == expected:
            return samples
        assert time.monotonic() < deadline, f"{series} never reached {expected}"
        time.sleep(0.2)


def test_an_mlp_s_tokens_per_second_is_tokens_over_the_measured_wall_time(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batches = [torch.randn(32, 64) for _ in range(40)]
    with start_test_run(tmp_path, prometheus_port=0, tokens_per_step=1000) as run:
        t0 = time.perf_counter()
        for step in run.steps(batches):
            with step.phase("forward"):
                loss = model(step.batch).square().mean()
            with step.phase("backward"):
                loss.backward()
            opt.step()
            opt.zero_grad()
            time.sleep(0.002)  # steps of a few ms: the loop's own cost stays well under 2%
        wall = time.perf_counter() - t0
        got = _scrape(run, 40_000)
    truth = 40_000 / wall
    assert got['otel_train_tokens_per_second{rank="0"}'] == pytest.approx(truth, rel=0.02)
    assert got['otel_train_samples_total{rank="0"}'] == 40 * 32  # from the tensors' shape
    assert got['otel_train_samples_per_second{rank="0"}'] == pytest.approx(
        40 * 32 / wall, rel=0.02)


def _exact_gpt_flops(vocab: int, batch: int, block: int, width: int, layers: int) -> int:
    """The exact layer sum of the tiny GPT, forward + backward (3x forward), every matmul:
    per token and layer QKV 6d^2, output projection 2d^2, MLP 16d^2, attention scores and
    values 4Td (the causal mask still computes the full T x T); the head 2dV."""
    per_token = layers * (24 * width * width + 4 * block * width) + 2 * width * vocab
    return 3 * per_token * batch * block


def test_the_tiny_gpt_counts_its_batches_and_flops(tmp_path):
    torch.manual_seed(0)
    vocab, block, batch, width, layers = 40, 32, 8, 64, 2
    model = build_model(vocab, block_size=block, width=width, layers=layers)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.randint(vocab, (5000,))
    loader = [b for b, _ in zip(_batches(data, block, batch, 0), range(12))]
    with start_test_run(tmp_path, prometheus_port=0, count_flops=True,
                        peak_flops_per_second=1e12) as run:
        t0 = time.perf_counter()
        for step in run.steps(loader):
            x, y = step.batch
            with step.phase("forward"):
                _, loss = model(x, y)
            with step.phase("backward"):
                loss.backward()
            with step.phase("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        wall = time.perf_counter() - t0
        got = _scrape(run, 12 * batch * block)
    assert got['otel_train_tokens_per_second{rank="0"}'] == pytest.approx(
        12 * batch * block / wall, rel=0.02)
    exact = _exact_gpt_flops(vocab, batch, block, width, layers)
    counted = got['otel_train_flops_per_step{rank="0"}']
    assert counted == pytest.approx(exact, rel=0.10), (counted, exact)
    step_mfu = got['otel_train_mfu_ratio{basis="step",rank="0"}']
    no_data_mfu = got['otel_train_mfu_ratio{basis="exclude_data",rank="0"}']
    assert 0 < step_mfu <= no_data_mfu < 1
    achieved = got['otel_train_achieved_flops_per_second{rank="0"}']
    assert step_mfu == pytest.approx(achieved / 1e12)
    assert got['otel_train_peak_flops_per_second{rank="0"}'] == 1e12


# -- the processor, on views ------------------------------------------------------------------

def _view(step: int, start_s: float, seconds: float, data_s: float = 0.0,
          **attrs: Any) -> StepView:
    root = {A.STEP: step, **attrs}
    ns = int(1e9)
    phases = [(A.PHASE_DATA, A.KIND_TRAIN, "train", int(data_s * ns), 2, 1)] if data_s else []
    view = StepView(True, A.STEP_SPAN_NAME, RowRoot(root), (1, 1), root, int(start_s * ns),
                    int((start_s + seconds) * ns), phases)
    return view


def test_an_int_option_is_filled_in_on_each_root_and_rates_cover_the_window():
    tput = ThroughputSpanProcessor(rank=0, recent_window_steps=2, tokens_per_step=100)
    views = [_view(i, i * 1.0, 1.0) for i in range(4)]
    for v in views:
        tput.on_step(v)
    assert all(v.span._attributes[A.TOKENS] == 100 for v in views)
    snap = tput.snapshot()
    assert snap.tokens_total == 400
    assert snap.tokens_per_second == pytest.approx(100.0)  # the last 2 steps: 200 in 2 s
    assert snap.samples_per_second is None and snap.mfu is None


def test_mfu_over_the_step_and_without_the_data_wait():
    tput = ThroughputSpanProcessor(flops_per_step=4e9, peak_flops_per_second=1e10)
    for i in range(3):
        tput.on_step(_view(i, i * 1.0, 1.0, data_s=0.2))
    snap = tput.snapshot()
    assert snap.achieved_flops_per_second == pytest.approx(4e9)
    assert snap.mfu == pytest.approx(0.4)
    assert snap.mfu_exclude_data == pytest.approx(0.5)  # 4e9 FLOPs in 0.8 s of 1e10


def test_the_counted_step_s_time_is_left_out_of_flops_and_later_steps_scale_by_tokens():
    tput = ThroughputSpanProcessor(peak_flops_per_second=1e9)
    tput.on_step(_view(0, 0.0, 1.0, **{A.TOKENS: 10}))
    tput.on_step(_view(1, 1.0, 5.0, **{A.TOKENS: 10, A.FLOPS_COUNTED: True}))
    tput.on_step(_view(2, 6.0, 1.0, **{A.TOKENS: 10, A.FLOPS: 1e8}))
    late = _view(3, 7.0, 1.0, **{A.TOKENS: 20})
    tput.on_step(late)
    assert late.span._attributes[A.FLOPS] == pytest.approx(2e8)  # twice the tokens
    assert late.span._attributes[A.MFU] == pytest.approx(0.2)
    snap = tput.snapshot()
    assert snap.tokens_per_second == pytest.approx(50 / 8.0)  # every step's tokens and time
    # FLOPs of steps 2 and 3 over the wall time without the counted step (8 s - 5 s)
    assert snap.achieved_flops_per_second == pytest.approx(3e8 / 3.0)


def test_the_state_travels_to_a_copy():
    tput = ThroughputSpanProcessor(tokens_per_step=5, flops_per_step=10.0)
    for i in range(3):
        tput.on_step(_view(i, float(i), 1.0, **{A.PEAK_FLOPS: 100.0, A.FLOPS_DTYPE: "bf16"}))
    copy = ThroughputSpanProcessor(tokens_per_step=5, flops_per_step=10.0)
    copy.load_state(tput.export_state())
    assert copy.snapshot() == tput.snapshot()
    assert copy.snapshot().flops_dtype == "bf16" and copy.snapshot().mfu == pytest.approx(0.1)


def test_the_console_fast_line_shows_tokens_per_second_only_when_counted():
    out = io.StringIO()
    tput = ThroughputSpanProcessor()
    console = ConsoleReportSpanProcessor(log_every=1, stream=out, min_interval_seconds=0,
                                         throughput=tput)
    view = _view(0, 0.0, 1.0)
    tput.on_step(view)
    assert "tok/s" not in console.format_fast(view)
    counted = _view(1, 1.0, 0.5, **{A.TOKENS: 41_200})
    tput.on_step(counted)
    assert "27.5k tok/s" in console.format_fast(counted)  # 41.2k tokens over 1.5 s


def test_on_a_cpu_flops_per_second_are_served_and_mfu_only_with_a_given_peak(tmp_path):
    for peak in (None, 1e9):
        with start_test_run(tmp_path / str(peak), prometheus_port=0, flops_per_step=1e6,
                            peak_flops_per_second=peak) as run:
            for _step in run.steps([torch.zeros(2, 3)] * 5):
                time.sleep(0.001)
            got = _scrape_samples(run, 'otel_train_samples_total{rank="0"}', 10)
        assert got['otel_train_flops_per_step{rank="0"}'] == 1e6
        assert got['otel_train_achieved_flops_per_second{rank="0"}'] > 0
        has_mfu = any(k.startswith("otel_train_mfu_ratio") for k in got)
        assert has_mfu is (peak is not None)


def test_a_run_s_console_fast_line_carries_its_tokens_per_second(tmp_path, capsys):
    with start_test_run(tmp_path, console=True, log_every=5, tokens_per_step=100) as run:
        for _step in run.steps(range(10)):
            time.sleep(0.002)
        run.flush()
    fast = [line for line in capsys.readouterr().err.splitlines() if "⏱️  step" in line]
    assert fast and all(re.search(r"\) [\d.]+k? tok/s", line) for line in fast), fast


def test_the_documented_per_run_promql_sums_the_ranks_on_a_real_prometheus():
    from prometheus_server import PrometheusServer, require_binary

    from otel_train.derived.prometheus_metrics import PrometheusMetricsSpanProcessor
    from otel_train.derived.throughput import ThroughputCollector

    require_binary("prometheus")
    doc = (Path(__file__).resolve().parents[2] / "docs" / "telemetry.md").read_text()
    promql = re.search(r"```promql\n(.*?)```", doc, re.S).group(1)
    endpoints = []
    try:
        for rank, tokens in ((0, 100), (1, 300)):  # 100 and 300 tokens/s
            metrics = PrometheusMetricsSpanProcessor(rank=rank, run_id="two-ranks",
                                                     world_size=2)
            tput = ThroughputSpanProcessor(rank=rank, tokens_per_step=tokens)
            metrics.registry.register(ThroughputCollector(tput))
            for i in range(4):
                view = _view(i, float(i), 1.0)
                view.rank = rank
                metrics.on_step(view)
                tput.on_step(view)
            metrics.start_server("127.0.0.1", 0)
            endpoints.append(metrics)
        targets = ["%s:%d" % m.bound_address() for m in endpoints]
        with PrometheusServer(targets) as prom:
            got = prom.wait_for(promql, lambda r: len(r) == 1 and len(
                prom.query("otel_train_tokens_per_second")) == 2)
            assert got[0]["metric"] == {"run_id": "two-ranks"}
            assert float(got[0]["value"][1]) == pytest.approx(400.0)
    finally:
        for m in endpoints:
            m.stop_server()


def test_a_step_with_nothing_counted_adds_what_the_general_path_adds(monkeypatch):
    """Steps without counts take a short path: the window entries, the totals, the
    snapshot and the root attributes are those the general path (each count read) makes."""
    from otel_train.derived import throughput

    def fed() -> tuple[dict, Any, list[dict]]:
        tput = ThroughputSpanProcessor(rank=0, recent_window_steps=8)
        views = [_view(i, i * 0.5, 0.4, data_s=0.05 * (i % 3)) for i in range(12)]
        for v in views:
            tput.on_step(v)
        return tput.export_state(), tput.snapshot(), [dict(v.span._attributes) for v in views]

    reads = []
    real_number = throughput._number
    monkeypatch.setattr(throughput, "_number", lambda v: reads.append(v) or real_number(v))
    short = fed()
    assert reads == []  # no count read: the short path was taken
    # Every root names a count key (the step's own), so every step takes the general path.
    monkeypatch.setattr(throughput, "_COUNT_KEYS", frozenset({A.STEP}))
    general = fed()
    assert reads  # the general path read the counts
    assert short == general
    assert short[0]["_window"] and short[0]["_window"][0][:3] == (None, None, None)
