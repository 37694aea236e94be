"""Benchmarks of the simulated vLLM backend.

``virtual``: N ranks under ``trio.testing.MockClock`` (virtual time) driven by a synthetic
multi-turn agent load for a simulated duration; reports wall time, simulated requests and tokens,
cache hit ratio and preemptions.  ``--driver direct`` runs the same load through the engines in a
plain discrete-event loop without Trio, which isolates the engine model's own cost.  Sessions are
pinned to a rank (sticky routing, as a Program-aware router would do) and submit token ids straight
to the cluster (the HTTP layer is measured by ``server``).

Agent load (after the ``coding-long`` trace profile, docs/traces.md "Profiles", scaled down): each
session starts from a shared system prefix, appends a log-normal tool result per turn (median
``--append-median`` tokens, capped at 16k), generates a log-normal output (median 300 tokens,
capped at 2k), waits a tool gap (60% <= 50 ms, else log-normal median 0.3 s, sigma 2.9, cap 300 s)
and restarts as a fresh session once its context would exceed ``--max-context`` tokens.

``server``: starts ``agentd sim-backend --time-scale 1e9`` (every simulated duration ~0) in a
subprocess and measures completed requests per second with concurrent clients.

    python -m bench.sim_bench virtual --ranks 16 --hours 1
    python -m bench.sim_bench server --seconds 10 --concurrency 32
"""

from __future__ import annotations

import argparse
import heapq
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

from bench.interrupt import run_interruptible, run_main
from daemon.commands.argtypes import int_at_least, positive_float, positive_int
from sim.cluster import SimCluster, SimConfig
from sim.config import SCHEDULING_POLICIES
from sim.engine import Engine, EngineConfig, EngineOutput, Request
from sim.kv import extend_block_hashes

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


class _Session:
    """One synthetic agent: builds its next request and grows its context when a turn finishes."""

    def __init__(self, sid: int, rank: int, args: argparse.Namespace, block_size: int, root: int) -> None:
        self.sid = sid
        self.rank = rank
        self.args = args
        self.rng = random.Random(args.seed * 1_000_003 + sid)
        self.bs = block_size
        self.root = root
        self.shared = _fresh_tokens(random.Random(args.seed), args.shared_prefix)
        self.generation = 0
        self.turn = 0
        self.tokens: list[int] = []
        self.hashes: list[int] = []
        self.output: list[int] = []
        self._restart()

    def _restart(self) -> None:
        self.generation += 1
        self.turn = 0
        self.tokens = list(self.shared)
        self.hashes = []

    def next_request(self) -> Request:
        rng, bs = self.rng, self.bs
        append = min(16_000, max(20, int(_lognormal(rng, self.args.append_median, 1.0))))
        n_out = min(2000, max(5, int(_lognormal(rng, 300.0, 0.7))))
        if len(self.tokens) + append + n_out > self.args.max_context:
            self._restart()  # context compaction: a fresh session from the shared prefix
            append = max(1, min(append, self.args.max_context - len(self.tokens) - n_out))
        self.tokens.extend(_fresh_tokens(rng, append))
        n_full = len(self.tokens) // bs
        have = len(self.hashes)
        extend_block_hashes(self.hashes, self.tokens[have * bs : n_full * bs], n_full, bs, self.root, None, offset=None)
        self.output = _fresh_tokens(rng, n_out)
        rid = f"s{self.sid}-g{self.generation}-t{self.turn}"
        # no copies of the context: the session appends to ``tokens`` only once the request has
        # finished, and the engine appends only output-block hashes to ``hashes`` (adopted below)
        hashes = self.hashes if len(self.hashes) == n_full else self.hashes[:n_full]
        return Request(rid, self.tokens, self.output, prompt_block_hashes=hashes)

    def finished(self, req: Request) -> float:
        """Record the finished turn; returns the tool gap before the next request."""
        self.tokens.extend(self.output)
        # the engine extended the request's hash chain over the full blocks it computed (prompt
        # and output): reuse it instead of hashing the output again next turn
        if len(req.block_hashes) > len(self.hashes):
            self.hashes = req.block_hashes
        self.turn += 1
        return _tool_gap(self.rng)


async def _session_loop(cluster: SimCluster, session: _Session, end: float, totals: dict[str, int]) -> None:
    while trio.current_time() < end:
        req = session.next_request()
        outs = await cluster.submit(req, dp_rank=session.rank, order_key=(session.sid, req.request_id), final_only=True)
        async with outs:
            async for out in outs:
                if out.finish_reason is not None:
                    _count(totals, req)
        await trio.sleep(session.finished(req))


def _count(totals: dict[str, int], req: Request) -> None:
    totals["requests"] += 1
    totals["output_tokens"] += len(req.output)
    totals["prompt_tokens"] += len(req.prompt)


def _run_direct(engines: list[Engine], sessions: list[_Session], end: float, totals: dict[str, int]) -> None:
    """The same load without Trio: a plain discrete-event loop over the engines (engine cost only)."""
    wake = [(0.0, s.sid) for s in sessions]
    heapq.heapify(wake)
    owner: dict[str, tuple[_Session, Request]] = {}
    while True:
        t_eng = min([t for e in engines if (t := e.next_event_time()) is not None], default=math.inf)
        t_sess = wake[0][0] if wake else math.inf
        if t_eng == math.inf and t_sess == math.inf:
            return
        outputs: list[EngineOutput] = []
        if t_sess <= t_eng:
            while wake and wake[0][0] == t_sess:
                session = sessions[heapq.heappop(wake)[1]]
                req = session.next_request()
                owner[req.request_id] = (session, req)
                outputs += engines[session.rank].add_request(req, t_sess)
            now = t_sess
        else:
            now = t_eng
            for engine in engines:
                t = engine.next_event_time()
                if t is not None and t <= now:
                    outputs += engine.advance_to(now)
        for out in outputs:
            if out.finish_reason is not None:
                session, req = owner.pop(out.request_id)
                _count(totals, req)
                t_next = out.time + session.finished(req)
                if t_next < end:
                    heapq.heappush(wake, (t_next, session.sid))


def calibration_ms() -> float:
    """CPU ms of a fixed pure-Python loop: compare runs across machines and load levels."""
    t0 = time.process_time()
    ref = [0] * 16384
    acc = 0
    for i in range(2_000_000):
        b = (i * 7919) & 16383
        r = ref[b] + 1
        ref[b] = r
        acc += r
    return round((time.process_time() - t0) * 1000.0, 1)


def bench_virtual(args: argparse.Namespace) -> dict[str, Any]:
    engine = EngineConfig(
        num_gpu_blocks=args.num_gpu_blocks,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=8192,
        seed=args.seed,
        scheduling_policy=args.scheduling_policy,
    )
    config = SimConfig(dp_size=args.ranks, engine=engine, seed=args.seed, per_step_wakeups=False, deterministic=True)
    totals = {"requests": 0, "output_tokens": 0, "prompt_tokens": 0}
    duration = args.hours * 3600.0

    def sessions_for(engines: list[Engine]) -> list[_Session]:
        return [
            _Session(sid, sid % args.ranks, args, engine.block_size, engines[sid % args.ranks].root)
            for sid in range(args.ranks * args.sessions_per_rank)
        ]

    async def main() -> list[Engine]:
        async with trio.open_nursery() as nursery:
            cluster: SimCluster = await nursery.start(SimCluster(config).run)
            end = trio.current_time() + duration
            async with trio.open_nursery() as tasks:
                for session in sessions_for(cluster.engines):
                    tasks.start_soon(_session_loop, cluster, session, end, totals)
            nursery.cancel_scope.cancel()
        return cluster.engines

    t0 = time.perf_counter()
    cpu0 = time.process_time()
    if args.driver == "trio":
        engines = run_interruptible(main, clock=trio.testing.MockClock(autojump_threshold=0))
    else:
        engines = SimCluster(config).engines
        _run_direct(engines, sessions_for(engines), duration, totals)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    stats = [e.stats for e in engines]
    queries = sum(s.prefix_cache_queries for s in stats)
    return {
        "bench": "virtual",
        "driver": args.driver,
        "ranks": args.ranks,
        "block_size": args.block_size,
        "sessions": args.ranks * args.sessions_per_rank,
        "simulated_seconds": duration,
        "wall_seconds": round(wall, 2),
        "cpu_seconds": round(cpu, 2),
        "speedup_vs_real_time": round(duration / wall, 1),
        "requests": totals["requests"],
        "prompt_tokens": totals["prompt_tokens"],
        "output_tokens": totals["output_tokens"],
        "engine_steps": sum(s.num_steps for s in stats),
        "prefix_hit_ratio": round(sum(s.prefix_cache_hits for s in stats) / queries, 4) if queries else 0.0,
        "preemptions": sum(s.num_preemptions for s in stats),
        "fingerprint": fingerprint(engines, totals),
    }


def fingerprint(engines: list[Engine], totals: dict[str, int]) -> dict[str, Any]:
    """Counters that must not change when the simulator only gets faster (same seed, same load)."""
    stats = [e.stats for e in engines]
    fp: dict[str, Any] = {"finished_requests": totals["requests"]}
    for name in (
        "prompt_tokens",
        "prompt_tokens_cached",
        "prompt_tokens_recomputed",
        "generation_tokens",
        "prefix_cache_queries",
        "prefix_cache_hits",
        "num_preemptions",
        "num_steps",
    ):
        fp[name] = sum(getattr(s, name) for s in stats)
    fp["evictions"] = sum(e.pool.evictions for e in engines)
    fp["ttft_sum_seconds"] = round(sum(s.ttft.sum for s in stats), 6)
    fp["e2e_sum_seconds"] = round(sum(s.e2e.sum for s in stats), 6)
    fp["itl_count"] = sum(s.itl.count for s in stats)
    return fp


def bench_server(args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "daemon",
        "sim-backend",
        "--port",
        "0",
        "--time-scale",
        "1e9",
        "--dp-size",
        str(args.dp_size),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.strip().rsplit(" ", 1)[-1]
        if not url.startswith("http://"):
            raise RuntimeError(f"sim-backend did not start: {line!r}")
        return run_interruptible(lambda: _drive_server(url, args))
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def _drive_server(url: str, args: argparse.Namespace) -> dict[str, Any]:
    done = {"requests": 0, "errors": 0}
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "say something"}],
        "max_tokens": args.max_tokens,
        "stream": args.stream,
    }
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
    return {
        "bench": "server",
        "stream": args.stream,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "seconds": round(elapsed, 2),
        "requests": done["requests"],
        "errors": done["errors"],
        "requests_per_second": round(done["requests"] / elapsed, 1),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sim_bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="which", required=True)
    v = sub.add_parser("virtual", help="N ranks, synthetic agent load, virtual time")
    v.add_argument("--ranks", type=positive_int, default=16)
    v.add_argument("--hours", type=positive_float, default=1.0)
    v.add_argument("--sessions-per-rank", type=positive_int, default=4)
    v.add_argument("--shared-prefix", type=int_at_least(0), default=4000)
    v.add_argument("--append-median", type=positive_float, default=1000.0)
    v.add_argument("--max-context", type=positive_int, default=32_000)
    v.add_argument("--num-gpu-blocks", type=positive_int, default=16_384)
    v.add_argument("--block-size", type=positive_int, default=16)
    v.add_argument("--max-num-seqs", type=positive_int, default=256)
    v.add_argument("--seed", type=int_at_least(0), default=0)
    v.add_argument("--scheduling-policy", choices=SCHEDULING_POLICIES, default="fcfs")
    v.add_argument(
        "--driver",
        choices=("trio", "direct"),
        default="trio",
        help="trio: SimCluster under MockClock (default); direct: engines only, no Trio",
    )
    s = sub.add_parser("server", help="standalone sim-backend request throughput at zero time cost")
    s.add_argument("--seconds", type=positive_float, default=10.0)
    s.add_argument("--concurrency", type=positive_int, default=32)
    s.add_argument("--max-tokens", type=positive_int, default=16)
    s.add_argument("--dp-size", type=positive_int, default=2)
    s.add_argument("--stream", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    calibration = calibration_ms()
    result = bench_virtual(args) if args.which == "virtual" else bench_server(args)
    result["calibration_loop_cpu_ms"] = calibration
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m bench.sim_bench"))
