"""Benchmarks of the simulated vLLM backend.

``virtual``: N ranks under ``trio.testing.MockClock`` (virtual time) driven by a synthetic
multi-turn agent load for a simulated duration; reports wall time, simulated requests and tokens,
cache hit ratio and preemptions.  Sessions are pinned to a rank (sticky routing, as a
Program-aware router would do) and submit token ids straight to the cluster (the HTTP layer is
measured by ``server``).

Agent load (after spec/peers-workloads-and-beyond.md §d.4, "coding-long", scaled down): each
session starts from a shared system prefix, appends a log-normal tool result per turn (median
``--append-median`` tokens, capped at 16k), generates a log-normal output (median 300 tokens,
capped at 2k), waits a tool gap (60% <= 50 ms, else log-normal median 0.3 s, sigma 2.9, cap 300 s)
and restarts as a fresh session once its context would exceed ``--max-context`` tokens.

``server``: starts ``agentd sim-backend --time-scale 1e9`` (every simulated duration ~0) in a
subprocess and measures completed requests per second with concurrent clients.

    python bench/sim_bench.py virtual --ranks 16 --hours 1
    python bench/sim_bench.py server --seconds 10 --concurrency 32
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import time
from typing import Any

import httpx
import trio
import trio.testing

from actors.sim.cluster import SimCluster, SimConfig
from actors.sim.engine import EngineConfig, Request
from actors.sim.kv import extend_block_hashes

VOCAB = 131072


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma))


def _fresh_tokens(rng: random.Random, n: int) -> list[int]:
    """``n`` token ids unlikely to repeat elsewhere (a run of ids from a random start)."""
    start = rng.randrange(32, 1 << 40)
    return list(range(start, start + n))


def _tool_gap(rng: random.Random) -> float:
    if rng.random() < 0.6:
        return rng.uniform(0.0, 0.05)
    return min(300.0, _lognormal(rng, 0.3, 2.9))


async def _session_loop(
    cluster: SimCluster, rank: int, sid: int, args: argparse.Namespace, end: float, totals: dict[str, int]
) -> None:
    rng = random.Random(args.seed * 1_000_003 + sid)
    bs = cluster.config.engine.block_size
    root = cluster.engines[rank].root
    shared = _fresh_tokens(random.Random(args.seed), args.shared_prefix)
    generation = 0
    while trio.current_time() < end:
        tokens = list(shared)
        hashes: list[int] = []
        generation += 1
        turn = 0
        while trio.current_time() < end:
            append = min(16_000, max(20, int(_lognormal(rng, args.append_median, 1.0))))
            n_out = min(2000, max(5, int(_lognormal(rng, 300.0, 0.7))))
            if len(tokens) + append + n_out > args.max_context:
                break
            tokens.extend(_fresh_tokens(rng, append))
            n_full = len(tokens) // bs
            have = len(hashes)
            extend_block_hashes(hashes, tokens[have * bs : n_full * bs], n_full, bs, root, None, offset=None)
            output = _fresh_tokens(rng, n_out)
            req = Request(f"s{sid}-g{generation}-t{turn}", list(tokens), output, prompt_block_hashes=hashes[:n_full])
            outs = await cluster.submit(req, dp_rank=rank, order_key=(sid, generation, turn),
                                       final_only=True)
            async with outs:
                async for out in outs:
                    if out.finish_reason is not None:
                        totals["requests"] += 1
                        totals["output_tokens"] += n_out
                        totals["prompt_tokens"] += len(req.prompt)
            tokens.extend(output)
            turn += 1
            await trio.sleep(_tool_gap(rng))


def bench_virtual(args: argparse.Namespace) -> dict[str, Any]:
    engine = EngineConfig(num_gpu_blocks=args.num_gpu_blocks, max_num_seqs=args.max_num_seqs,
                          max_num_batched_tokens=8192, seed=args.seed)
    config = SimConfig(dp_size=args.ranks, engine=engine, seed=args.seed, per_step_wakeups=False, deterministic=True)
    totals = {"requests": 0, "output_tokens": 0, "prompt_tokens": 0}
    duration = args.hours * 3600.0

    async def main() -> SimCluster:
        async with trio.open_nursery() as nursery:
            cluster: SimCluster = await nursery.start(SimCluster(config).run)
            end = trio.current_time() + duration
            async with trio.open_nursery() as sessions:
                for sid in range(args.ranks * args.sessions_per_rank):
                    sessions.start_soon(_session_loop, cluster, sid % args.ranks, sid, args, end, totals)
            nursery.cancel_scope.cancel()
        return cluster

    t0 = time.perf_counter()
    cpu0 = time.process_time()
    cluster = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    stats = [e.stats for e in cluster.engines]
    queries = sum(s.prefix_cache_queries for s in stats)
    return {
        "bench": "virtual", "ranks": args.ranks, "sessions": args.ranks * args.sessions_per_rank,
        "simulated_seconds": duration, "wall_seconds": round(wall, 2), "cpu_seconds": round(cpu, 2),
        "speedup_vs_real_time": round(duration / wall, 1),
        "requests": totals["requests"], "prompt_tokens": totals["prompt_tokens"],
        "output_tokens": totals["output_tokens"], "engine_steps": sum(s.num_steps for s in stats),
        "prefix_hit_ratio": round(sum(s.prefix_cache_hits for s in stats) / queries, 4) if queries else 0.0,
        "preemptions": sum(s.num_preemptions for s in stats),
    }


def bench_server(args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "daemon", "sim-backend", "--port", "0", "--time-scale", "1e9",
           "--dp-size", str(args.dp_size)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.strip().rsplit(" ", 1)[-1]
        if not url.startswith("http://"):
            raise RuntimeError(f"sim-backend did not start: {line!r}")
        return trio.run(_drive_server, url, args)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def _drive_server(url: str, args: argparse.Namespace) -> dict[str, Any]:
    done = {"requests": 0, "errors": 0}
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "say something"}], "max_tokens": args.max_tokens,
                            "stream": args.stream}
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30.0) as client:
        deadline = trio.current_time() + args.seconds

        async def worker() -> None:
            while trio.current_time() < deadline:
                if args.stream:
                    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        async for _ in r.aiter_bytes():
                            pass
                        ok = r.status_code == 200
                else:
                    ok = (await client.post("/v1/chat/completions", json=body)).status_code == 200
                done["requests" if ok else "errors"] += 1

        t0 = trio.current_time()
        async with trio.open_nursery() as nursery:
            for _ in range(args.concurrency):
                nursery.start_soon(worker)
        elapsed = trio.current_time() - t0
    return {"bench": "server", "stream": args.stream, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
            "seconds": round(elapsed, 2), "requests": done["requests"], "errors": done["errors"],
            "requests_per_second": round(done["requests"] / elapsed, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="which", required=True)
    v = sub.add_parser("virtual", help="N ranks, synthetic agent load, virtual time")
    v.add_argument("--ranks", type=int, default=16)
    v.add_argument("--hours", type=float, default=1.0)
    v.add_argument("--sessions-per-rank", type=int, default=4)
    v.add_argument("--shared-prefix", type=int, default=4000)
    v.add_argument("--append-median", type=float, default=1000.0)
    v.add_argument("--max-context", type=int, default=32_000)
    v.add_argument("--num-gpu-blocks", type=int, default=16_384)
    v.add_argument("--max-num-seqs", type=int, default=256)
    v.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("server", help="standalone sim-backend request throughput at zero time cost")
    s.add_argument("--seconds", type=float, default=10.0)
    s.add_argument("--concurrency", type=int, default=32)
    s.add_argument("--max-tokens", type=int, default=16)
    s.add_argument("--dp-size", type=int, default=2)
    s.add_argument("--stream", action="store_true")
    args = parser.parse_args(argv)
    result = bench_virtual(args) if args.which == "virtual" else bench_server(args)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
