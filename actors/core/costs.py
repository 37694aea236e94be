"""Offline-calibrated cost models used by Progress-TTL and batch-gain admission (pure).

Two fitted surfaces, with coefficients from ``actors.core.config`` (docs/program-scheduling.md §11; the impact
prices the Progress-TTL fit and batch-gain admission, §3 and §4):

- cold prefill of ``u`` uncached prompt tokens, with ``x = u / 1000``::

      prefill_seconds(u)            = intercept + linear * x + quadratic * x**2   (0 when u == 0)
      cache_miss_impact_seconds(u)  = prefill_seconds(u) * (2 - decode_throughput_alpha)

  The impact adds the decode throughput lost while the prefill is mixed into the batch
  (alpha is the retained fraction), which is what a Program pays when its KV was evicted.

- aggregate decode throughput of ``B`` requests whose full contexts sum to ``C`` tokens::

      decode_step_seconds(B, C)                 = fixed + per_request * B + per_token * C
      decode_throughput_tokens_per_second(B, C) = B / decode_step_seconds(B, C)

  Full contexts are used even when Programs share a prefix: the surface models execution
  cost, not physical KV occupancy.

``reference_calibration_estimates`` reports the two reference points of the startup
warning: a 50,000-token cold prefill (about 13.93 s with the defaults) and batch 4 with
4 x 50,000 context tokens (about 98.23 tok/s).

The model objects are ``PrefillCostModel`` / ``DecodeThroughputModel`` from ``actors.core.config``
(the simulated backend reads the same fields).
"""

from __future__ import annotations

import math

import attrs

from actors.core.config import DecodeThroughputModel, PrefillCostModel

__all__ = [
    "REFERENCE_DECODE_BATCH_SIZE",
    "REFERENCE_DECODE_CONTEXT_TOKENS_PER_REQUEST",
    "REFERENCE_PREFILL_TOKENS",
    "ReferenceCalibrationEstimates",
    "cache_miss_impact_seconds",
    "decode_step_seconds",
    "decode_throughput_tokens_per_second",
    "prefill_seconds",
    "reference_calibration_estimates",
]

REFERENCE_PREFILL_TOKENS = 50_000
REFERENCE_DECODE_BATCH_SIZE = 4
REFERENCE_DECODE_CONTEXT_TOKENS_PER_REQUEST = 50_000


def _check_count(name: str, value: float) -> None:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be finite and >= 0, got {value!r}")


def prefill_seconds(uncached_tokens: float, model: PrefillCostModel) -> float:
    """Cold-prefill seconds for ``uncached_tokens`` (0 tokens cost nothing, not the intercept)."""
    _check_count("uncached_tokens", uncached_tokens)
    if uncached_tokens == 0:
        return 0.0
    x = uncached_tokens / 1000.0
    return (
        model.intercept_seconds
        + model.linear_seconds_per_1k_tokens * x
        + model.quadratic_seconds_per_1k_tokens_squared * x * x
    )


def cache_miss_impact_seconds(uncached_tokens: float, model: PrefillCostModel) -> float:
    """Recompute cost of a cache miss: prefill plus the decode throughput it displaces."""
    return prefill_seconds(uncached_tokens, model) * (2.0 - model.decode_throughput_alpha)


def decode_step_seconds(batch_size: float, context_tokens: float, model: DecodeThroughputModel) -> float:
    """Seconds of one decode step for ``batch_size`` requests with ``context_tokens`` in total."""
    _check_count("batch_size", batch_size)
    _check_count("context_tokens", context_tokens)
    return (
        model.fixed_step_seconds
        + model.batch_step_seconds_per_request * batch_size
        + model.context_step_seconds_per_token * context_tokens
    )


def decode_throughput_tokens_per_second(
    batch_size: float, context_tokens: float, model: DecodeThroughputModel
) -> float:
    """Aggregate decode tokens per second of the batch (0 for an empty batch)."""
    step = decode_step_seconds(batch_size, context_tokens, model)
    if batch_size == 0:
        return 0.0
    return batch_size / step


@attrs.frozen
class ReferenceCalibrationEstimates:
    """The reference points reported by ``program_scheduling_reference_calibration``."""

    reference_prefill_tokens: int
    reference_prefill_seconds: float
    reference_decode_batch_size: int
    reference_decode_context_tokens_per_request: int
    reference_decode_context_tokens: int
    reference_decode_throughput_tokens_per_second: float


def reference_calibration_estimates(
    prefill_model: PrefillCostModel, decode_model: DecodeThroughputModel
) -> ReferenceCalibrationEstimates:
    """Effective estimates for the startup calibration warning (uses whatever values are configured)."""
    context_tokens = REFERENCE_DECODE_BATCH_SIZE * REFERENCE_DECODE_CONTEXT_TOKENS_PER_REQUEST
    return ReferenceCalibrationEstimates(
        reference_prefill_tokens=REFERENCE_PREFILL_TOKENS,
        reference_prefill_seconds=prefill_seconds(REFERENCE_PREFILL_TOKENS, prefill_model),
        reference_decode_batch_size=REFERENCE_DECODE_BATCH_SIZE,
        reference_decode_context_tokens_per_request=REFERENCE_DECODE_CONTEXT_TOKENS_PER_REQUEST,
        reference_decode_context_tokens=context_tokens,
        reference_decode_throughput_tokens_per_second=decode_throughput_tokens_per_second(
            REFERENCE_DECODE_BATCH_SIZE, context_tokens, decode_model
        ),
    )
