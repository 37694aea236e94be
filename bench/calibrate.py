"""Find the pressure point: size per-rank KV so the native baseline lands near a target hit ratio.

The tuning workflow asks for a baseline with visible KV pressure (docs/operations.md, "2. Establish
a comparable pressure point": token cache hit around 0.8 for the eviction point; lower, with
preemptions, for the thrash point).  The hit ratio of a
fixed trace grows with the KV pool, so ``calibrate_kv_blocks`` brackets the target by doubling or
halving ``num_gpu_blocks`` and then bisects (geometrically) with virtual-time simulations of the
``native`` system (bench.simulate): each probe costs only simulation CPU.
``config_for`` builds the embedded-mode config of a bench system from a ``ClusterSpec``; the bench
and the tests use it to simulate exactly what the bench runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs

from bench.bench import ClusterSpec, scaled_program_config
from bench.replay import ReplayOptions
from bench.simulate import run_simulation
from bench.trace.format import Trace
from daemon.config import AgentdConfig
from daemon.config_loading import load_config


def config_for(cluster: ClusterSpec, system: str, overrides: dict[str, Any] | None = None) -> AgentdConfig:
    """Embedded-mode config equivalent to the bench's ``native`` or ``agentd`` system."""
    if system not in ("native", "agentd"):
        raise ValueError(f"system must be native or agentd for simulation, got {system!r}")
    raw: dict[str, Any] = {
        "server": {"log_level": "warning"},
        "routing": {"policy": "consistent_hash"},
        "embedded": {
            "num_workers": cluster.workers,
            "dp_size": cluster.dp_size,
            "num_gpu_blocks": cluster.num_gpu_blocks,
            "block_size": cluster.block_size,
            "max_num_seqs": cluster.max_num_seqs,
            "max_num_batched_tokens": cluster.max_num_batched_tokens,
            "time_scale": cluster.time_scale,
            "model": cluster.model,
            "scheduling_policy": cluster.scheduling_policy,
            "seed": cluster.seed,
        },
    }
    if system == "agentd":
        raw["enable_program_scheduling"] = True
        raw["program_scheduling"] = scaled_program_config(cluster, overrides)
    return load_config(None, raw)


def min_blocks(trace: Trace, block_size: int) -> int:
    """Blocks one rank needs to hold the largest single request (prompt, template, output).

    The chat template adds 2 tokens per message (role, end), 2 messages per turn, plus the system
    message and the generation prompt.
    """
    largest = max(r.input_length + r.output_length + 4 * (r.turn + 2) for r in trace.records)
    return math.ceil(largest / block_size) + 2


def calibrate_kv_blocks(
    trace: Trace,
    cluster: ClusterSpec,
    replay: ReplayOptions,
    target_hit: float,
    *,
    tolerance: float = 0.02,
    max_probes: int = 12,
    log: Callable[[str], None] = lambda _m: None,
) -> tuple[int, float]:
    """``(num_gpu_blocks, native_hit)`` closest to ``target_hit`` found within ``max_probes``."""
    floor = min_blocks(trace, cluster.block_size)
    probes: dict[int, float] = {}

    def hit_at(blocks: int) -> float:
        if blocks not in probes:
            cfg = config_for(attrs.evolve(cluster, num_gpu_blocks=blocks), "native")
            report = run_simulation(cfg, trace, replay)
            probes[blocks] = float(report["cache"]["token_hit_ratio"] or 0.0)
            log(
                f"{blocks} blocks/rank -> native hit {probes[blocks]:.3f} "
                f"(preemptions {report['preemptions']:.0f}, {report['simulation']['wall_seconds']:.1f} s)"
            )
        return probes[blocks]

    def best() -> tuple[int, float]:
        blocks = min(probes, key=lambda b: (abs(probes[b] - target_hit), b))
        return blocks, probes[blocks]

    b = max(cluster.num_gpu_blocks, floor)
    lo: int | None = None
    hi: int | None = None
    if hit_at(b) >= target_hit:
        hi = b
        while lo is None and len(probes) < max_probes:
            nb = max(floor, hi // 2)
            if nb == hi:
                break
            if hit_at(nb) >= target_hit:
                hi = nb
            else:
                lo = nb
    else:
        lo = b
        while hi is None and len(probes) < max_probes:
            nb = lo * 2
            if hit_at(nb) >= target_hit:
                hi = nb
            else:
                lo = nb
    while lo is not None and hi is not None and hi - lo > 1 and len(probes) < max_probes:
        if abs(best()[1] - target_hit) <= tolerance:
            break
        mid = int(round(math.sqrt(lo * hi)))
        mid = min(max(mid, lo + 1), hi - 1)
        if hit_at(mid) >= target_hit:
            hi = mid
        else:
            lo = mid
    return best()


if __name__ == "__main__":
    import sys

    from bench.interrupt import not_a_command

    sys.exit(not_a_command("bench.calibrate", "agentd bench"))
