"""Golden counters of a small seeded agent load: speed-ups of the simulator must not change results.

The load (``bench/sim_bench.py virtual``) is small but exercises prefix-cache hits, evictions and
preemptions on two ranks.  The expected values were recorded before the performance work on the
engine, the block pool and the cluster shell; both drivers (Trio shell under ``MockClock`` and the
plain event loop over the engines) must reproduce them exactly.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

_BENCH = Path(__file__).resolve().parents[2] / "bench" / "sim_bench.py"

GOLDEN = {
    "finished_requests": 152,
    "prompt_tokens": 673527,
    "prompt_tokens_cached": 168656,
    "prompt_tokens_recomputed": 0,
    "generation_tokens": 56874,
    "prefix_cache_queries": 104593611,
    "prefix_cache_hits": 19627504,
    "num_preemptions": 35,
    "num_steps": 378,
    "evictions": 33994,
    "ttft_sum_seconds": 1224.76778,
    "e2e_sum_seconds": 2039.402865,
    "itl_count": 56722,
}


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sim_bench", _BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("driver", ["trio", "direct"])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_small_seeded_load_matches_golden(driver: str, policy: str) -> None:
    bench = _bench()
    args = bench.build_parser().parse_args(
        [
            "virtual",
            "--ranks",
            "2",
            "--hours",
            "0.05",
            "--sessions-per-rank",
            "6",
            "--shared-prefix",
            "1000",
            "--append-median",
            "400",
            "--max-context",
            "9000",
            "--num-gpu-blocks",
            "700",
            "--scheduling-policy",
            policy,
            "--driver",
            driver,
        ]
    )
    result = bench.bench_virtual(args)
    assert result["fingerprint"] == GOLDEN
