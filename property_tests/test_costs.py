"""Properties of the cost formulas (docs/program-scheduling.md §11)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from actors.core.config import DecodeThroughputModel, PrefillCostModel
from actors.core.costs import (
    cache_miss_impact_seconds,
    decode_step_seconds,
    decode_throughput_tokens_per_second,
    prefill_seconds,
    reference_calibration_estimates,
)

coefficient = st.floats(min_value=0.0, max_value=10.0, allow_nan=False, allow_infinity=False)
positive_coefficient = st.floats(min_value=1e-6, max_value=10.0, allow_nan=False, allow_infinity=False)
tokens = st.integers(min_value=0, max_value=2_000_000)
batch = st.integers(min_value=0, max_value=1024)

prefill_models = st.builds(
    PrefillCostModel,
    intercept_seconds=coefficient,
    linear_seconds_per_1k_tokens=coefficient,
    quadratic_seconds_per_1k_tokens_squared=coefficient,
    decode_throughput_alpha=st.floats(min_value=0.0, max_value=1.0),
)
decode_models = st.builds(
    DecodeThroughputModel,
    fixed_step_seconds=positive_coefficient,
    batch_step_seconds_per_request=st.floats(min_value=0.0, max_value=0.01),
    context_step_seconds_per_token=st.floats(min_value=0.0, max_value=1e-5),
)


@given(prefill_models, tokens, tokens)
def test_prefill_and_impact_monotone_in_uncached_tokens(model: PrefillCostModel, a: int, b: int) -> None:
    lo, hi = min(a, b), max(a, b)
    assert prefill_seconds(lo, model) <= prefill_seconds(hi, model)
    assert cache_miss_impact_seconds(lo, model) <= cache_miss_impact_seconds(hi, model)


@given(prefill_models, tokens)
def test_cache_miss_impact_between_one_and_two_prefills(model: PrefillCostModel, u: int) -> None:
    p = prefill_seconds(u, model)
    impact = cache_miss_impact_seconds(u, model)
    assert math.isfinite(impact) and impact >= 0.0
    assert p * (1.0 - 1e-12) <= impact <= 2.0 * p * (1.0 + 1e-12)
    if u == 0:
        assert p == 0.0 and impact == 0.0
    else:
        assert p >= model.intercept_seconds


@given(prefill_models, st.floats(min_value=0.0, max_value=1.0), tokens)
def test_lower_alpha_means_larger_impact(model: PrefillCostModel, alpha: float, u: int) -> None:
    other = PrefillCostModel(
        intercept_seconds=model.intercept_seconds,
        linear_seconds_per_1k_tokens=model.linear_seconds_per_1k_tokens,
        quadratic_seconds_per_1k_tokens_squared=model.quadratic_seconds_per_1k_tokens_squared,
        decode_throughput_alpha=alpha,
    )
    if alpha <= model.decode_throughput_alpha:
        assert cache_miss_impact_seconds(u, other) >= cache_miss_impact_seconds(u, model)
    else:
        assert cache_miss_impact_seconds(u, other) <= cache_miss_impact_seconds(u, model)


@given(decode_models, batch, tokens, tokens)
def test_decode_step_monotone_and_at_least_fixed(model: DecodeThroughputModel, b: int, c1: int, c2: int) -> None:
    lo, hi = min(c1, c2), max(c1, c2)
    step_lo = decode_step_seconds(b, lo, model)
    assert step_lo >= model.fixed_step_seconds
    assert step_lo <= decode_step_seconds(b, hi, model)
    assert step_lo <= decode_step_seconds(b + 1, lo, model)


@given(decode_models, batch, tokens, tokens)
def test_decode_throughput_bounds_and_context_monotonicity(
    model: DecodeThroughputModel, b: int, c1: int, c2: int
) -> None:
    lo, hi = min(c1, c2), max(c1, c2)
    thr_lo = decode_throughput_tokens_per_second(b, lo, model)
    thr_hi = decode_throughput_tokens_per_second(b, hi, model)
    assert 0.0 <= thr_hi <= thr_lo * (1.0 + 1e-12)
    # Never more than B tokens per fixed step, and exactly B tokens per modelled step.
    assert thr_lo <= b / model.fixed_step_seconds * (1.0 + 1e-12)
    if b > 0:
        assert math.isclose(thr_lo * decode_step_seconds(b, lo, model), b, rel_tol=1e-9)
    else:
        assert thr_lo == 0.0


@given(decode_models, st.integers(min_value=0, max_value=1023), tokens)
def test_decode_throughput_grows_with_batch_at_fixed_context(model: DecodeThroughputModel, b: int, c: int) -> None:
    # Adding a request without adding context never lowers aggregate throughput.
    assert decode_throughput_tokens_per_second(b + 1, c, model) >= decode_throughput_tokens_per_second(b, c, model)


@given(prefill_models, decode_models)
def test_reference_estimates_match_the_formulas(prefill: PrefillCostModel, decode: DecodeThroughputModel) -> None:
    est = reference_calibration_estimates(prefill, decode)
    expected_prefill = (
        prefill.intercept_seconds
        + prefill.linear_seconds_per_1k_tokens * 50
        + prefill.quadratic_seconds_per_1k_tokens_squared * 2500
    )
    expected_thr = 4 / (
        decode.fixed_step_seconds
        + decode.batch_step_seconds_per_request * 4
        + decode.context_step_seconds_per_token * 200_000
    )
    assert math.isclose(est.reference_prefill_seconds, expected_prefill, rel_tol=1e-12, abs_tol=1e-12)
    assert math.isclose(est.reference_decode_throughput_tokens_per_second, expected_thr, rel_tol=1e-12)
