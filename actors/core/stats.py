"""Rolling ProgressTtlFactors per rank, and the Progress-TTL formulas (docs/program-scheduling.md §4, §5).

Three FIFO windows, each bounded by ``stats_window_size`` (the oldest sample is dropped once
the window is full; "complete" means ``limit > 0 and len >= limit``):

* ``requests``: one :class:`RequestSample` per successful, epoch-accepted completion;
* ``continuities``: ``(interval, previous cache-miss impact)`` per arrival of an idle Program;
* ``ttl_pause_rounds``: served rounds sampled at each TTL pause (diagnostics only).

Means are kept as running sums updated on push/drop (re-summed exactly every ``limit`` pushes
so float drift cannot accumulate), which keeps admission O(1) per rank.

Fitted acting TTL (``fitted_acting_ttl``) with ``C`` = this request's cache-miss impact::

    0 unless the continuity window is complete and C > 0
    mu, sigma = mean / population std of ln(interval) over intervals > 0  (sigma >= 1e-6)
    d_max = min(max_acting_ttl, C);  d_min = min(0.05, d_max);  m = exp(mu + sigma^2 / 2)
    U(d) = C*Phi(z) - m*Phi(z - sigma) - d*(1 - Phi(z)),  z = (ln d - mu) / sigma;  U(0) = 0
    candidates 0, d_min, d_max, then 32 log-spaced points in [d_min, d_max] (ties: later wins)
    result = argmax U, or 0 if max U < 0

The reference computes Phi with the Abramowitz-Stegun 7.1.26 erf approximation (``erf_as``,
kept for tests); ``fit_ttl`` uses ``math.erfc`` for speed (see its docstring).
"""

from __future__ import annotations

import math
from collections import deque
from operator import add, sub

from attrs import define

from actors.core.config import DecodeThroughputModel
from actors.core.costs import decode_throughput_tokens_per_second

_P = 0.3275911
_A1, _A2, _A3, _A4, _A5 = 0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429
_SQRT2 = math.sqrt(2.0)
TTL_MIN_CANDIDATE_SECONDS = 0.05
TTL_LOG_POINTS = 32
CACHE_CONTINUITY_HIT_RATIO = 0.9


def erf_as(x: float) -> float:
    """Abramowitz-Stegun 7.1.26 approximation of erf (max error 1.5e-7)."""
    sign = -1.0 if x < 0 else 1.0
    x = abs(x)
    t = 1.0 / (1.0 + _P * x)
    poly = ((((_A5 * t + _A4) * t + _A3) * t + _A2) * t + _A1) * t
    return sign * (1.0 - poly * math.exp(-x * x))


def normal_cdf(z: float) -> float:
    v = 0.5 * (1.0 + erf_as(z / _SQRT2))
    return 0.0 if v < 0.0 else 1.0 if v > 1.0 else v


# Above this, exp(mu + sigma^2/2) overflows a double: the partial expectation
# m * Phi(z - sigma) (always within [0, d * Phi(z)]) is then evaluated in log space.
_LOG_MEAN_FAST_LIMIT = 700.0


def _scaled_tail(log_m: float, tail: float) -> float:
    """``exp(log_m) * tail`` without overflowing (0 when ``tail`` underflowed to 0)."""
    if log_m < _LOG_MEAN_FAST_LIMIT:
        return math.exp(log_m) * tail
    return 0.0 if tail <= 0.0 else math.exp(log_m + math.log(tail))


def ttl_utility(d: float, c: float, mu: float, sigma: float) -> float:
    """Expected utility of holding KV for ``d`` seconds (0 for d == 0)."""
    if d <= 0:
        return 0.0
    z = (math.log(d) - mu) / sigma
    phi = normal_cdf(z)
    return c * phi - _scaled_tail(mu + sigma * sigma / 2.0, normal_cdf(z - sigma)) - d * (1.0 - phi)


def ttl_candidates(d_max: float) -> list[float]:
    d_min = min(TTL_MIN_CANDIDATE_SECONDS, d_max)
    out = [0.0, d_min, d_max]
    if d_max > d_min:
        lo, hi = math.log(d_min), math.log(d_max)
        n = TTL_LOG_POINTS - 1
        out.extend(math.exp(lo + (hi - lo) * k / n) for k in range(TTL_LOG_POINTS))
    return out


_GRID_CACHE: dict[tuple[float, float], tuple[tuple[float, ...], tuple[float, ...]]] = {}
_GRID_CACHE_LIMIT = 256  # distinct (d_min, d_max) grids kept; cleared when full (bounded memory)


def _grid(d_min: float, d_max: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The candidate points ``(d...), (ln d...)`` of ``fit_ttl`` for one (d_min, d_max), memoised.

    ``d_max`` is ``min(max_acting_ttl, C)``, so it repeats across completions; the cached
    values are exactly the ones computed on a miss (deterministic, no behaviour change).
    The log grid's ``ln d`` is computed without ``log``; the duplicated endpoints of the
    grid are listed once (they would re-win their own tie with the same ``d``).
    """
    key = (d_min, d_max)
    grid = _GRID_CACHE.get(key)
    if grid is None:
        lo, hi = math.log(d_min), math.log(d_max)
        if d_max > d_min:
            n = TTL_LOG_POINTS - 1
            step = (hi - lo) / n
            lns = (lo, *(lo + step * k for k in range(1, n)), hi)
            ds = (d_min, *(math.exp(x) for x in lns[1:-1]), d_max)
        else:
            ds, lns = (d_min,), (lo,)
        if len(_GRID_CACHE) >= _GRID_CACHE_LIMIT:
            _GRID_CACHE.clear()
        grid = _GRID_CACHE[key] = (ds, lns)
    return grid


def fit_ttl(mu: float, sigma: float, c: float, max_acting_ttl_seconds: float) -> float:
    """The TTL maximising the utility over the candidate grid (see module docstring).

    Runs once per idle completion, so it is tuned: Phi comes from ``math.erfc`` (exact to double
    precision; the reference's A-S approximation differs by < 1.5e-7, which can only matter
    for two grid points whose utilities tie within ~1e-6 seconds) and the grid is memoised
    (``_grid``).  A plain loop over floats beats ``map`` chains of ``operator`` functions here
    (CPython 3.11 specialises float arithmetic in the loop; measured 19 vs 38 us).
    """
    d_max = min(max_acting_ttl_seconds, c)
    if d_max <= 0 or c <= 0:
        return 0.0
    d_min = min(TTL_MIN_CANDIDATE_SECONDS, d_max)
    ds, lns = _grid(d_min, d_max)
    log_m = mu + sigma * sigma / 2.0
    if log_m >= _LOG_MEAN_FAST_LIMIT:  # extremely spread intervals: overflow-safe slow path
        best_d, best_u = 0.0, 0.0
        for d in ds:
            v = ttl_utility(d, c, mu, sigma)
            if v >= best_u:
                best_d, best_u = d, v
        return best_d
    m = math.exp(log_m)
    erfc = math.erfc
    k_z = 1.0 / (sigma * _SQRT2)
    k_s = sigma / _SQRT2
    half_m = m * 0.5  # m * 0.5 * erfc(.) evaluates (m * 0.5) first: same value
    best_d, best_u = 0.0, 0.0  # candidate d = 0 has utility 0
    if not c < _BOUND_SAFE:  # (c infinite or NaN: no bound, every point in full)
        for d, ln_d in zip(ds, lns, strict=True):
            x = (ln_d - mu) * k_z
            phi = 0.5 * erfc(-x)
            v = c * phi - half_m * erfc(k_s - x) - d * (1.0 - phi)
            if v >= best_u:
                best_d, best_u = d, v
        return best_d
    for d, ln_d in zip(ds, lns, strict=True):
        x = (ln_d - mu) * k_z  # z / sqrt(2)
        phi = 0.5 * erfc(-x)
        cp = c * phi
        hold = d * (1.0 - phi)
        # v = (cp - half_m * erfc(.)) - hold <= cp - hold in floats too (the subtracted term is
        # >= 0 and rounding is monotone): a point whose bound is below the best is skipped
        # without its second erfc, exactly as the full comparison would skip it
        if cp - hold < best_u:
            if k_s - x <= _ERFC_TWO_BELOW:
                return best_d  # saturated (below): every later point has this same bound
            continue
        v = cp - half_m * erfc(k_s - x) - hold
        if v >= best_u:
            best_d, best_u = d, v
            if k_s - x <= _ERFC_TWO_BELOW:
                return ds[-1]  # saturated (below): every later point ties with this one, the last wins
        elif k_s - x <= _ERFC_TWO_BELOW:
            return best_d
    return best_d


# ``erfc`` is exactly 2.0 at and below this argument (glibc and musl return ``2 - tiny`` there:
# erfc(-6) = 2 - 2.2e-17, under half an ulp of 2).  Once the second erfc's argument ``k_s - x``
# is this low, so is the first's (``-x``, k_s > 0), and the grid's later points (``x`` grows with
# ``ln d``) all have phi = 1, hold = d * 0.0 = 0.0 and v = (c - half_m * 2.0) - 0.0: the same
# value as this point, so the full scan's answer is known here (ties: the later point wins).
_ERFC_TWO_BELOW = -6.0


_BOUND_SAFE = 1e300  # c below this: c * phi and the utility stay finite (fit_ttl's bound is exact)


@define(slots=True, eq=False)
class RequestSample:
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    context_growth_tokens: int | None
    e2e_seconds: float
    decode_seconds: float | None
    queue_seconds: float
    rounds_since_ttl_pause: int
    finished_at: float


def _contrib(s: RequestSample) -> tuple[float, ...]:
    growth = s.context_growth_tokens
    dec = s.decode_seconds
    if dec is not None and math.isfinite(dec) and dec >= 0:
        decode, decoded = dec, 1
    else:
        decode, decoded = 0.0, 0
    return (
        s.prompt_tokens,
        s.completion_tokens,
        s.cached_prompt_tokens,
        s.prompt_tokens - s.cached_prompt_tokens,
        growth if growth is not None else 0,
        1 if growth is not None else 0,
        s.e2e_seconds,
        decode,
        decoded,
        s.queue_seconds,
        s.rounds_since_ttl_pause,
    )


class ProgressTtlFactors:
    """The rolling statistics of one rank."""

    __slots__ = (
        "limit",
        "requests",
        "_contribs",
        "continuities",
        "ttl_pause_rounds",
        "_rsum",
        "_pushes",
        "_ln_sum",
        "_ln2_sum",
        "_ln_n",
        "_impact_sum",
        "_cpushes",
        "version",
        "_ttl_cache",
    )

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.requests: deque[RequestSample] = deque()
        self._contribs: deque[tuple[float, ...]] = deque()
        self.continuities: deque[tuple[float, float]] = deque()
        self.ttl_pause_rounds: deque[int] = deque()
        self._rsum = [0.0] * 11
        self._pushes = 0
        self._ln_sum = self._ln2_sum = self._impact_sum = 0.0
        self._ln_n = 0
        self._cpushes = 0
        self.version = 0
        self._ttl_cache: tuple[int, float, float] | None = None

    # ---- windows -------------------------------------------------------------------------
    def push_request(self, sample: RequestSample) -> None:
        if self.limit <= 0:
            return
        rsum = self._rsum
        new = _contrib(sample)
        if len(self.requests) >= self.limit:
            self.requests.popleft()
            old = self._contribs.popleft()
            self._rsum = list(map(sub, map(add, rsum, new), old))  # (sum + new) - old, per column
        else:
            self._rsum = list(map(add, rsum, new))
        self.requests.append(sample)
        self._contribs.append(new)
        self._pushes += 1
        if self._pushes >= self.limit:
            self._pushes = 0
            cols = list(zip(*self._contribs, strict=True))
            self._rsum = [math.fsum(c) for c in cols] if cols else [0.0] * 11

    def push_continuity(self, interval_seconds: float, impact_seconds: float) -> None:
        if self.limit <= 0:
            return
        if len(self.continuities) >= self.limit:
            self._drop_continuity(*self.continuities.popleft())
        self.continuities.append((interval_seconds, impact_seconds))
        self._impact_sum += impact_seconds
        if interval_seconds > 0 and math.isfinite(interval_seconds):
            ln = math.log(interval_seconds)
            self._ln_sum += ln
            self._ln2_sum += ln * ln
            self._ln_n += 1
        self.version += 1
        self._cpushes += 1
        if self._cpushes >= self.limit:
            self._cpushes = 0
            lns = [math.log(t) for t, _ in self.continuities if t > 0 and math.isfinite(t)]
            self._ln_sum = math.fsum(lns)
            self._ln2_sum = math.fsum(x * x for x in lns)
            self._ln_n = len(lns)
            self._impact_sum = math.fsum(i for _, i in self.continuities)

    def _drop_continuity(self, interval_seconds: float, impact_seconds: float) -> None:
        self._impact_sum -= impact_seconds
        if interval_seconds > 0 and math.isfinite(interval_seconds):
            ln = math.log(interval_seconds)
            self._ln_sum -= ln
            self._ln2_sum -= ln * ln
            self._ln_n -= 1

    def push_ttl_pause_rounds(self, rounds: int) -> None:
        if self.limit <= 0:
            return
        if len(self.ttl_pause_rounds) >= self.limit:
            self.ttl_pause_rounds.popleft()
        self.ttl_pause_rounds.append(rounds)

    @property
    def request_window_complete(self) -> bool:
        return self.limit > 0 and len(self.requests) >= self.limit

    @property
    def continuity_window_complete(self) -> bool:
        return self.limit > 0 and len(self.continuities) >= self.limit

    # ---- derived values --------------------------------------------------------------------
    def _mean(self, i: int) -> float:
        n = len(self.requests)
        return self._rsum[i] / n if n else 0.0

    def mean_prompt_tokens(self) -> float:
        return self._mean(0)

    def mean_completion_tokens(self) -> float:
        return self._mean(1)

    def mean_cached_prompt_tokens(self) -> float:
        return self._mean(2)

    def mean_uncached_prompt_tokens(self) -> float:
        return self._mean(3)

    def mean_context_growth_tokens(self) -> float:
        n = self._rsum[5]
        return self._rsum[4] / n if n > 0 else 0.0

    def mean_e2e_seconds(self) -> float:
        return self._mean(6)

    def mean_decode_seconds(self) -> float | None:
        n = self._rsum[8]
        return self._rsum[7] / n if n > 0 else None

    def mean_queue_seconds(self) -> float:
        return self._mean(9)

    def mean_rounds_since_ttl_pause(self) -> float:
        return self._mean(10)

    def cached_prompt_ratio(self) -> float:
        """Token-weighted cached ratio: sum(cached) / sum(prompt)."""
        return self._rsum[2] / self._rsum[0] if self._rsum[0] > 0 else 0.0

    def request_throughput_per_second(self) -> float:
        n = len(self.requests)
        if n < 2:
            return 0.0
        elapsed = self.requests[-1].finished_at - self.requests[0].finished_at
        return (n - 1) / elapsed if elapsed > 0 else 0.0

    def mean_ttl_pause_rounds(self) -> float:
        n = len(self.ttl_pause_rounds)
        return sum(self.ttl_pause_rounds) / n if n else 0.0

    def mean_continuity_impact_seconds(self) -> float:
        n = len(self.continuities)
        return self._impact_sum / n if n else 0.0

    def log_interval_fit(self) -> tuple[float, float] | None:
        """(mu, sigma) of ln(interval) over the positive intervals, or None if there are none."""
        n = self._ln_n
        if n <= 0:
            return None
        mu = self._ln_sum / n
        var = max(0.0, self._ln2_sum / n - mu * mu)
        return mu, max(1e-6, math.sqrt(var))

    def fitted_acting_ttl(self, impact_seconds: float, max_acting_ttl_seconds: float) -> float:
        if not self.continuity_window_complete:
            return 0.0
        fit = self.log_interval_fit()
        if fit is None:
            return 0.0
        cache = self._ttl_cache
        if cache is not None and cache[0] == self.version and cache[1] == impact_seconds:
            return cache[2]
        ttl = fit_ttl(fit[0], fit[1], impact_seconds, max_acting_ttl_seconds)
        self._ttl_cache = (self.version, impact_seconds, ttl)
        return ttl

    def target_rounds(self, max_segment_rounds: int) -> int:
        """0 while the request window is incomplete, else clamp(ceil(2*mean), 1, max)."""
        if not self.request_window_complete:
            return 0
        r = math.ceil(2.0 * self.mean_rounds_since_ttl_pause())
        return max(1, min(max_segment_rounds, r))


class ResumeHitWindow:
    """How much of a paused Program's context the engine still had when the Program came back.

    One sample per placement start of a Program that ran before: ``(cached, reusable)`` with
    ``reusable`` = its previous context and ``cached`` the backend-reported cached tokens (capped at
    ``reusable``).  ``miss_ratio`` = ``1 - sum(cached) / sum(reusable)`` over the last ``limit``
    samples, and 1.0 (the reference's assumption: a pause loses the whole cache) until the window
    is full.  agentd scales the cache-miss impact in the TTL fit by it (docs/program-scheduling.md
    §4): where paused Programs keep most of their KV in the engine's cache (light pressure), holding
    capacity for them buys little.
    """

    __slots__ = ("limit", "samples", "_cached", "_reusable", "_pushes")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.samples: deque[tuple[int, int]] = deque()
        self._cached = 0
        self._reusable = 0
        self._pushes = 0

    def push(self, cached: int, reusable: int) -> None:
        if self.limit <= 0 or reusable <= 0:
            return
        cached = max(0, min(cached, reusable))
        if len(self.samples) >= self.limit:
            c, r = self.samples.popleft()
            self._cached -= c
            self._reusable -= r
        self.samples.append((cached, reusable))
        self._cached += cached
        self._reusable += reusable

    @property
    def complete(self) -> bool:
        return self.limit > 0 and len(self.samples) >= self.limit

    def miss_ratio(self) -> float:
        if not self.complete or self._reusable <= 0:
            return 1.0
        return 1.0 - self._cached / self._reusable


def acting_ttl_factors(own: ProgressTtlFactors, warm: ProgressTtlFactors | None) -> ProgressTtlFactors:
    """The window a rank's fitted TTL comes from: its own once complete, else the cluster-wide one.

    agentd difference (docs/program-scheduling.md §10): the reference arms a TTL of 0 until the
    rank's own window holds ``stats_window_size`` request intervals, so during warm-up every
    Program pauses at each completion.  Request intervals are a property of the agents, not of the
    rank, so until then agentd fits on the last ``stats_window_size`` intervals of all ranks
    (still 0 until that window is full).
    """
    if warm is None or own.continuity_window_complete:
        return own
    return warm


def peek_acting_ttl(
    own: ProgressTtlFactors, warm: ProgressTtlFactors | None, miss_ratio: float, max_acting_ttl_seconds: float
) -> float:
    """The TTL a Program with the window's mean cache-miss impact would be armed with now.

    What ``/scheduling/diagnostics`` and the fitted-TTL gauge report: the same window, impact
    weighting and fit as a real completion (``on_complete``), with the window's mean impact in
    place of one Program's.
    """
    f = acting_ttl_factors(own, warm)
    return f.fitted_acting_ttl(f.mean_continuity_impact_seconds() * miss_ratio, max_acting_ttl_seconds)


def continuous_growth_reserve(factors: ProgressTtlFactors | None, target_rounds: int, remaining: list[int]) -> float:
    """``g * (R + sum(remaining))`` with g = mean context growth; 0 if R <= 0 or g <= 0."""
    if factors is None or target_rounds <= 0:
        return 0.0
    g = factors.mean_context_growth_tokens()
    if g <= 0:
        return 0.0
    return g * (target_rounds + sum(remaining))


def decode_throughput(batch: float, context_tokens: float, model: DecodeThroughputModel) -> float:
    return decode_throughput_tokens_per_second(batch, context_tokens, model)
