"""CPU of agentd's request edge per request, in one process: parsing and validating the body, Program
identity, and the body that leaves for the worker (``ProxyEngine.build_request`` + the forwarding
edits), for the agent bodies of :mod:`bench.proxy_overhead`.

Usage (from the repository root)::

    python -m bench.edge_cpu [--bodies 1,64,256] [--repeat 7]

Thread CPU time (best of ``--repeat`` batches), so a loaded machine inflates it far less than wall-clock
latency.  Rows: identity-free bodies (forwarded unchanged, round robin: the prompt size and routing text
are never worked out), and Program bodies that stream without ``stream_options.include_usage``
under Program scheduling - the case that strips ``vllm_xargs.agentic_context`` and injects
``include_usage`` (docs/operations.md §13, Large bodies), with the prompt size the Program
dispatcher reads.
docs/benchmarks.md §10.2 records runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from actors.core.config import BackendTarget
from bench.proxy_overhead import agent_body, program_context
from daemon.commands.argtypes import positive_int, positive_int_list
from daemon.dispatch import NativeDispatcher
from daemon.http.proxy import ProgramRoute, ProxyEngine
from daemon.metrics import ProxyMetrics

TARGET = BackendTarget(worker_url="http://127.0.0.1:1", dp_rank=0, target_id="http://127.0.0.1:1@0", index=0)


class _Lease:
    target = TARGET
    wants_usage = True
    attempt = 0


class _Health:
    def healthy_targets(self) -> tuple[BackendTarget, ...]:
        return (TARGET,)


def engine(program: bool) -> ProxyEngine:
    import random

    native = NativeDispatcher([TARGET], "round_robin", _Health(), random.Random(0))  # type: ignore[arg-type]
    route = ProgramRoute("vllm_xargs.agentic_context", native) if program else None
    return ProxyEngine(
        client=httpx.AsyncClient(),
        native=native,
        metrics=ProxyMetrics(CollectorRegistry(), [TARGET.target_id]),
        agentic_context_forwarding="strip",
        program=route,
    )


def streaming(raw: bytes) -> bytes:
    """The same body with ``"stream": true`` (appended as the last member)."""
    return raw[:-1] + b',"stream":true}'


def per_request_us(eng: ProxyEngine, raw: bytes, repeat: int, texts: bool = False) -> float:
    """``texts``: also read the request's prompt size and routing text, as the Program dispatcher
    does (a native round-robin lease reads neither: they are worked out on first read)."""
    headers = {"content-type": "application/json", "content-length": str(len(raw)), "host": "bench"}
    lease: Any = _Lease()
    n = max(3, int(2_000_000 / max(len(raw), 1000)) // 10)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.thread_time()
        for _ in range(n):
            req = eng.build_request("chat", raw, headers)
            if texts:
                req.prompt  # noqa: B018 - what the Program dispatcher reads (worked out here)
            eng._outgoing_body(req, lease, raw)
        best = min(best, (time.thread_time() - t0) / n)
    return best * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.edge_cpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bodies", type=positive_int_list, default=[1, 64, 256], help="body sizes in KiB")
    parser.add_argument("--repeat", type=positive_int, default=7)
    args = parser.parse_args()
    sizes = args.bodies
    print(f"{'body':>6} {'identity-free us/req':>21} {'Program, streamed us/req':>25}")
    for kb in sizes:
        free = per_request_us(engine(False), agent_body(kb, None), args.repeat)
        prog = per_request_us(engine(True), streaming(agent_body(kb, program_context(0))), args.repeat, texts=True)
        print(f"{kb:>4} KB {free:21.0f} {prog:25.0f}", flush=True)
    print(json.dumps({"note": "thread CPU per build_request + forwarding edits, best of batches"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
