"""Cost formulas (docs/program-scheduling.md §11), checked by hand."""

from __future__ import annotations

import pytest

from actors.core.config import DecodeThroughputModel, PrefillCostModel
from actors.core.costs import (
    cache_miss_impact_seconds,
    decode_step_seconds,
    decode_throughput_tokens_per_second,
    prefill_seconds,
    reference_calibration_estimates,
)

SIMPLE_PREFILL = PrefillCostModel(
    intercept_seconds=0.5,
    linear_seconds_per_1k_tokens=0.25,
    quadratic_seconds_per_1k_tokens_squared=0.01,
    decode_throughput_alpha=0.5,
)
SIMPLE_DECODE = DecodeThroughputModel(
    fixed_step_seconds=0.01, batch_step_seconds_per_request=0.002, context_step_seconds_per_token=1e-7
)


def test_prefill_seconds_hand_computed() -> None:
    # x = 4: 0.5 + 0.25*4 + 0.01*16 = 1.66
    assert prefill_seconds(4000, SIMPLE_PREFILL) == pytest.approx(1.66)
    # x = 0.5: 0.5 + 0.125 + 0.0025 = 0.6275
    assert prefill_seconds(500, SIMPLE_PREFILL) == pytest.approx(0.6275)


def test_prefill_of_zero_tokens_costs_nothing() -> None:
    assert prefill_seconds(0, SIMPLE_PREFILL) == 0.0
    assert cache_miss_impact_seconds(0, SIMPLE_PREFILL) == 0.0
    # One token already pays the intercept.
    assert prefill_seconds(1, SIMPLE_PREFILL) == pytest.approx(0.5 + 0.25e-3 + 0.01e-6)


def test_cache_miss_impact_scales_by_two_minus_alpha() -> None:
    # 1.66 * (2 - 0.5) = 2.49
    assert cache_miss_impact_seconds(4000, SIMPLE_PREFILL) == pytest.approx(2.49)
    # Default alpha 0.15: 13.9313496 * 1.85 = 25.7730
    assert cache_miss_impact_seconds(50_000, PrefillCostModel()) == pytest.approx(25.773, rel=1e-4)


def test_decode_step_and_throughput_hand_computed() -> None:
    # step(8, 100000) = 0.01 + 0.016 + 0.01 = 0.036; throughput = 8 / 0.036 = 222.22
    assert decode_step_seconds(8, 100_000, SIMPLE_DECODE) == pytest.approx(0.036)
    assert decode_throughput_tokens_per_second(8, 100_000, SIMPLE_DECODE) == pytest.approx(222.2222, rel=1e-6)
    assert decode_throughput_tokens_per_second(0, 0, SIMPLE_DECODE) == 0.0


def test_reference_calibration_estimates_with_defaults() -> None:
    est = reference_calibration_estimates(PrefillCostModel(), DecodeThroughputModel())
    # 0.06600 + 0.05702*50 + 0.0044057*2500 = 0.0660 + 2.8510 + 11.0143 = 13.931
    assert est.reference_prefill_seconds == pytest.approx(13.93, rel=0.01)
    assert est.reference_prefill_seconds == pytest.approx(13.9313, abs=1e-3)
    # 4 / (0.0106352 + 0.0016771 + 0.0284092) = 4 / 0.0407215 = 98.228
    assert est.reference_decode_throughput_tokens_per_second == pytest.approx(98.23, rel=0.01)
    assert est.reference_decode_throughput_tokens_per_second == pytest.approx(98.228, abs=1e-2)
    assert (est.reference_prefill_tokens, est.reference_decode_batch_size) == (50_000, 4)
    assert est.reference_decode_context_tokens_per_request == 50_000
    assert est.reference_decode_context_tokens == 200_000


def test_reference_calibration_estimates_use_effective_values() -> None:
    est = reference_calibration_estimates(SIMPLE_PREFILL, SIMPLE_DECODE)
    # 0.5 + 0.25*50 + 0.01*2500 = 38.0 ; 4 / (0.01 + 0.008 + 0.02) = 105.263
    assert est.reference_prefill_seconds == pytest.approx(38.0)
    assert est.reference_decode_throughput_tokens_per_second == pytest.approx(105.263158, rel=1e-6)


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf")])
def test_costs_reject_negative_or_non_finite_inputs(bad: float) -> None:
    with pytest.raises(ValueError, match="uncached_tokens"):
        prefill_seconds(bad, SIMPLE_PREFILL)
    with pytest.raises(ValueError, match="batch_size"):
        decode_step_seconds(bad, 0, SIMPLE_DECODE)
    with pytest.raises(ValueError, match="context_tokens"):
        decode_throughput_tokens_per_second(1, bad, SIMPLE_DECODE)
