"""The hot path's cost per span, calibrated at start-up: warm (steps back to back) and cold
(a step's own work between the calls), and which one a step is charged."""

from __future__ import annotations

from otel_train.common.self_cost import COLD_STEP_NS_PER_SPAN
from otel_train.recording.hot_path_cost import HotPathCost, calibrate_hot_path


def test_the_calibration_measures_a_cold_span_at_least_as_dear_as_a_warm_one() -> None:
    cost = calibrate_hot_path(warm_rounds=50, cold_rounds=6)
    assert cost.warm_ns_per_span > 0
    assert cost.cold_ns_per_span >= cost.warm_ns_per_span
    # Sub-millisecond per span on any machine that trains: not a unit slip.
    assert cost.cold_ns_per_span < 1_000_000


def test_a_step_long_enough_to_evict_the_caches_costs_the_cold_figure() -> None:
    cost = HotPathCost(warm_ns_per_span=1_000.0, cold_ns_per_span=3_000.0)
    assert cost.ns_per_span(step_wall_ns=1_750_000, spans=5) == 3_000.0  # an MLP step
    assert cost.ns_per_span(step_wall_ns=5 * COLD_STEP_NS_PER_SPAN, spans=5) == 3_000.0
    assert cost.ns_per_span(step_wall_ns=5 * COLD_STEP_NS_PER_SPAN - 1, spans=5) == 1_000.0
    assert cost.ns_per_span(step_wall_ns=10_000, spans=5) == 1_000.0  # an empty step
