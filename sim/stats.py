"""Engine counters, histograms and the step cost model of the simulated vLLM engine (pure).

The cost model is the core's two calibrated surfaces (``actors.core.config.PrefillCostModel`` and
``DecodeThroughputModel``; their defaults are the reference calibration of docs/program-scheduling.md
§11, written only there) turned into a per-step model (docs/simulator.md §1, "Timing"):

* a prefill chunk of ``n`` new tokens on top of ``ctx`` tokens already in KV costs
  ``linear/1000 * n + 2*quadratic/1e6 * n * (ctx + n/2)``; summed over the chunks of a cold prompt
  of ``N`` tokens this is exactly ``linear * x + quadratic * x^2`` with ``x = N/1000``;
* a step that carries ``B`` decodes with ``C`` total context tokens adds
  ``actors.core.costs.decode_step_seconds(B, C)`` = ``fixed + per_request * B + per_token * C``
  (nothing when there is no decode);
* the prefill ``intercept`` is a per-request front-end delay before the request reaches the
  scheduler, so a lone cold prompt's time to first token is exactly
  ``intercept + linear*x + quadratic*x^2``, the core's ``actors.core.costs.prefill_seconds``.

Every duration is divided by ``time_scale``.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right

import attrs

from actors.core.config import DecodeThroughputModel, PrefillCostModel

# vLLM v1 bucket boundaries (docs/simulator.md §3, "Metrics").
TTFT_BUCKETS: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


@attrs.frozen
class CostModel:
    """The simulated engine's cost coefficients: the same two values agentd's ``[program_scheduling]``
    section configures, so ``CostModel(prefill=ps.prefill_cost_model, decode=ps.decode_throughput_model)``
    simulates a deployment calibrated for the daemon.  ``decode_throughput_alpha`` is not used: mixed
    prefill/decode interference emerges from the additive step model, unless ``simulate_alpha``:
    then a step that carries decodes caps its prefill chunks so that the decode batch keeps the share
    ``prefill.decode_throughput_alpha`` of its throughput while a prefill runs (docs/simulator.md §1)."""

    prefill: PrefillCostModel = attrs.field(factory=PrefillCostModel)
    decode: DecodeThroughputModel = attrs.field(factory=DecodeThroughputModel)
    simulate_alpha: bool = False


class Histogram:
    """Cumulative-bucket histogram with weighted observations (Prometheus semantics)."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # last slot is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, weight: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += weight
        self.sum += value * weight
        self.count += weight

    def observe_many(self, values: list[float], weight: int = 1) -> None:
        counts = self.counts
        bounds = self.bounds
        if len(values) > 2 * len(bounds):
            # long runs (a decode run's step gaps): count per bucket on a sorted copy.  Bucket i
            # holds bounds[i-1] < v <= bounds[i], exactly what bisect_left per value gives.
            ordered = sorted(values)
            below = 0
            for i, bound in enumerate(bounds):
                upto = bisect_right(ordered, bound)
                counts[i] += (upto - below) * weight
                below = upto
            counts[-1] += (len(ordered) - below) * weight
        else:
            for v in values:
                counts[bisect_left(bounds, v)] += weight
        self.sum += sum(values) * weight
        self.count += len(values) * weight

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, cumulative count)`` pairs including ``+Inf``."""
        out = []
        acc = 0
        for bound, c in zip(self.bounds, self.counts, strict=False):  # counts[-1] is +Inf's, added below
            acc += c
            out.append((repr(float(bound)), acc))
        out.append(("+Inf", acc + self.counts[-1]))
        return out


class EngineStats:
    """Monotonic counters and histograms of one engine, named after the vLLM metrics."""

    __slots__ = (
        "prompt_tokens",
        "prompt_tokens_cached",
        "prompt_tokens_recomputed",
        "prompt_tokens_local_compute",
        "prompt_tokens_local_cache_hit",
        "generation_tokens",
        "prefix_cache_queries",
        "prefix_cache_hits",
        "num_preemptions",
        "request_success",
        "num_steps",
        "ttft",
        "itl",
        "e2e",
        "queue",
    )

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.prompt_tokens_cached = 0
        self.prompt_tokens_recomputed = 0
        self.prompt_tokens_local_compute = 0
        self.prompt_tokens_local_cache_hit = 0
        self.generation_tokens = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.num_preemptions = 0
        self.request_success: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}
        self.num_steps = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue = Histogram(REQUEST_LATENCY_BUCKETS)

    def record_prompt(self, prompt_len: int, cached: int) -> None:
        """vLLM's PromptTokenStats for one request whose prefill completed (docs/simulator.md §3, "Metrics")."""
        recomputed = 1 if cached + 1 == prompt_len else 0
        self.prompt_tokens += prompt_len
        self.prompt_tokens_cached += cached
        self.prompt_tokens_recomputed += recomputed
        self.prompt_tokens_local_compute += prompt_len - cached
        self.prompt_tokens_local_cache_hit += cached + recomputed
