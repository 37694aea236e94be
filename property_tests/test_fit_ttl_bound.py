"""``fit_ttl`` skips a grid point's second ``erfc`` when an upper bound of its utility is already
below the best: the fitted TTL must be exactly the full evaluation's (docs/program-scheduling.md §4).

``full_fit_ttl`` is the fast path of ``fit_ttl`` as it was before the bound (every grid point in
full), restated here as the reference; the overflow-safe slow path is shared and not restated.
"""

from __future__ import annotations

import math
import struct

from hypothesis import example, given
from hypothesis import strategies as st

from actors.core.stats import (
    _ERFC_TWO_BELOW,
    _LOG_MEAN_FAST_LIMIT,
    _SQRT2,
    TTL_MIN_CANDIDATE_SECONDS,
    _grid,
    fit_ttl,
)


def full_fit_ttl(mu: float, sigma: float, c: float, max_acting_ttl_seconds: float) -> float:
    d_max = min(max_acting_ttl_seconds, c)
    if d_max <= 0 or c <= 0:
        return 0.0
    d_min = min(TTL_MIN_CANDIDATE_SECONDS, d_max)
    ds, lns = _grid(d_min, d_max)
    log_m = mu + sigma * sigma / 2.0
    if log_m >= _LOG_MEAN_FAST_LIMIT:
        return fit_ttl(mu, sigma, c, max_acting_ttl_seconds)  # the slow path is not changed
    m = math.exp(log_m)
    k_z = 1.0 / (sigma * _SQRT2)
    k_s = sigma / _SQRT2
    half_m = m * 0.5
    best_d, best_u = 0.0, 0.0
    for d, ln_d in zip(ds, lns, strict=True):
        x = (ln_d - mu) * k_z
        phi = 0.5 * math.erfc(-x)
        v = c * phi - half_m * math.erfc(k_s - x) - d * (1.0 - phi)
        if v >= best_u:
            best_d, best_u = d, v
    return best_d


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


@given(
    mu=st.one_of(st.floats(min_value=-8.0, max_value=8.0), st.floats(min_value=-700.0, max_value=700.0)),
    sigma=st.one_of(st.floats(min_value=1e-6, max_value=4.0), st.floats(min_value=1e-6, max_value=37.0)),
    c=st.one_of(
        st.floats(min_value=-1.0, max_value=60.0),
        st.floats(min_value=0.0, max_value=1e308),
        st.sampled_from([math.inf, math.nan, 1e300, 0.05]),
    ),
    max_ttl=st.one_of(st.floats(min_value=0.0, max_value=600.0), st.sampled_from([0.05, 10.0, 1e308])),
)
@example(mu=math.log(5.0), sigma=0.5, c=8.0, max_ttl=10.0)
# narrow intervals (a closed loop at c=1): the grid saturates (phi = 1) early; the saturated point
# wins (c > m), loses (c < m), or its bound is below the best already
@example(mu=math.log(0.001), sigma=1e-6, c=0.1, max_ttl=10.0)
@example(mu=math.log(0.2), sigma=1e-6, c=0.1, max_ttl=10.0)
@example(mu=math.log(0.06), sigma=0.01, c=0.07, max_ttl=10.0)
@example(mu=math.log(0.06), sigma=0.05, c=3.0, max_ttl=10.0)
@example(mu=math.log(0.2), sigma=1.0, c=3.0, max_ttl=10.0)
def test_fit_ttl_with_the_bound_is_the_full_evaluation(mu: float, sigma: float, c: float, max_ttl: float) -> None:
    got, ref = fit_ttl(mu, sigma, c, max_ttl), full_fit_ttl(mu, sigma, c, max_ttl)
    assert bits(got) == bits(ref) or (math.isnan(got) and math.isnan(ref))


@given(
    mu=st.floats(min_value=math.log(1e-4), max_value=math.log(30.0)),
    sigma=st.one_of(st.floats(min_value=1e-6, max_value=0.5), st.sampled_from([1e-6, 1e-3])),
    c=st.floats(min_value=0.0, max_value=60.0),
    max_ttl=st.one_of(st.floats(min_value=0.0, max_value=600.0), st.sampled_from([0.05, 10.0])),
)
def test_fit_ttl_saturated_grid_is_the_full_evaluation(mu: float, sigma: float, c: float, max_ttl: float) -> None:
    """Narrow interval distributions, where ``fit_ttl`` stops at the first saturated grid point
    (phi = 1 from there on): the same TTL as every point evaluated."""
    got, ref = fit_ttl(mu, sigma, c, max_ttl), full_fit_ttl(mu, sigma, c, max_ttl)
    assert bits(got) == bits(ref)


@given(st.floats(min_value=-1e308, max_value=_ERFC_TWO_BELOW))
@example(_ERFC_TWO_BELOW)
@example(-math.inf)
def test_erfc_is_two_below_the_saturation_argument(t: float) -> None:
    """What ``fit_ttl``'s early stop assumes of this platform's ``math.erfc``."""
    assert math.erfc(t) == 2.0
