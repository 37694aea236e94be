"""Queue ETA against slow workers whose engine waiting gate is closed (docs/benchmarks.md §9.5).

Starts ``--workers`` slow ``agentd sim-backend`` processes (``--time-scale``, ``--max-num-seqs``:
the engine runs few requests and queues the rest, so its waiting count closes agentd's waiting
gate, docs/program-scheduling.md §3) and ``agentd start`` in front of them, then sends
``--requests`` concurrent streaming requests (``--kind program``: each its own Program;
``identity-free``: no agentic context) with ``[limits] sse_keepalive_seconds`` small, and records
per request the first ``: queued ... eta=E`` comment (the first ETA as told), the time the
comments switched to ``: keep-alive`` or the answer began (admitted: the queue wait), and the
daemon's own ``queue_eta`` accuracy (``/scheduling/diagnostics``).  Socket timing: numbers from a
loaded machine are labelled with the load average.

    python -m bench.eta_gate --workers 2 --requests 16
    python -m bench.eta_gate --workers 1 --requests 8 --data-plane-processes 2
    python -m bench.eta_gate --kind identity-free --requests 8
    python -m bench.eta_gate --workers 1 --free-first 6 --delay 3 --requests 1   # one Program behind identity-free load
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import trio

from bench.interrupt import run_interruptible, run_main
from bench.procs import agentd_cmd, running

QUEUED = re.compile(rb"^: queued position=(\d+) eta=([0-9.]+)s")


def worker_cmd(args: argparse.Namespace) -> list[str]:
    return [
        sys.executable,
        "-m",
        "daemon",
        "sim-backend",
        "--port",
        "0",
        "--model",
        "sim-model",
        "--time-scale",
        str(args.time_scale),
        "--max-num-seqs",
        str(args.max_num_seqs),
    ]


def config_text(args: argparse.Namespace, workers: list[str], state: Path) -> str:
    urls = ", ".join(f'"{w}"' for w in workers)
    return (
        "enable_program_scheduling = true\n"
        f'[server]\nport = 0\ndata_plane_processes = {args.data_plane_processes}\nlog_level = "warning"\n'
        f'[routing]\nworker_urls = [{urls}]\npolicy = "round_robin"\n'
        f"[limits]\nsse_keepalive_seconds = {args.keepalive}\n"
        f'[batch_api]\ndatabase_path = "{state / "batches.sqlite3"}"\n'
        f"[program_scheduling]\nmetrics_interval_seconds = {args.interval}\n"
        f"global_queue = {str(args.global_queue).lower()}\n"
    )


def body(args: argparse.Namespace, i: int) -> dict[str, Any]:
    b: dict[str, Any] = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": f"request {i}: " + "word " * args.prompt_words}],
        "max_tokens": args.max_tokens,
        "stream": True,
    }
    if args.kind == "program":
        b["vllm_xargs"] = {"agentic_context": {"program_id": f"gate-{i}", "step_id": 0}}
    return b


async def one(client: httpx.AsyncClient, args: argparse.Namespace, i: int, out: list[dict[str, Any]]) -> None:
    await trio.sleep(i * args.spacing)
    t0 = trio.current_time()
    rec: dict[str, Any] = {"i": i, "first_eta": None, "first_position": None, "wait": None, "status": None}
    headers = {} if args.bound is None else {"x-agentd-max-queue-seconds": str(args.bound)}
    async with client.stream("POST", "/v1/chat/completions", json=body(args, i), headers=headers) as r:
        rec["status"] = r.status_code
        if r.status_code != 200:
            rec["retry_after"] = r.headers.get("retry-after")
            rec["error"] = (await r.aread()).decode()[:200]
            out.append(rec)
            return
        queued_seen = False
        async for line in r.aiter_lines():
            now = trio.current_time() - t0
            m = QUEUED.match(line.encode())
            if m:
                queued_seen = True
                rec["last_queued_at"] = now
                if rec["first_eta"] is None:
                    rec["first_eta"] = float(m.group(2))
                    rec["first_position"] = int(m.group(1))
                continue
            if line.startswith(":") or not line:
                if queued_seen and rec["wait"] is None and line.startswith(": keep-alive"):
                    rec["wait"] = now
                continue
            if rec["wait"] is None and queued_seen:
                rec["wait"] = now
            if rec.get("first_byte") is None:
                rec["first_byte"] = now
    rec["total"] = trio.current_time() - t0
    out.append(rec)


async def background(client: httpx.AsyncClient, args: argparse.Namespace, j: int) -> None:
    """One identity-free request of the engine's background load (not measured)."""
    await trio.sleep(j * args.spacing)
    b = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": f"background {j}: " + "word " * args.prompt_words}],
        "max_tokens": args.max_tokens,
    }
    await client.post("/v1/chat/completions", json=b)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix="eta-gate-"))
    try:
        return await _run(args, state)
    finally:
        shutil.rmtree(state, ignore_errors=True)


async def _run(args: argparse.Namespace, state: Path) -> dict[str, Any]:
    out: list[dict[str, Any]] = []
    async with running(worker_cmd(args)) as (_w0, url0):
        workers = [url0]
        async with running(worker_cmd(args)) if args.workers > 1 else _none() as second:
            if second is not None:
                workers.append(second[1])
            config = state / "agentd.toml"
            config.write_text(config_text(args, workers, state))
            async with running(agentd_cmd(config)) as (_a, base):
                async with httpx.AsyncClient(base_url=base, timeout=600) as client:
                    async with trio.open_nursery() as nursery:
                        for j in range(args.free_first):  # engine load agentd does not queue
                            nursery.start_soon(background, client, args, j)
                        await trio.sleep(args.delay)
                        for i in range(args.requests):
                            nursery.start_soon(one, client, args, i, out)
                    diag = (await client.get("/scheduling/diagnostics")).json()
    out.sort(key=lambda r: r["i"])
    queued = [r for r in out if r["first_eta"] is not None and r["wait"] is not None and r["wait"] > 0]
    errors = [abs(r["first_eta"] - r["wait"]) / r["wait"] for r in queued]
    qe = diag.get("queue_eta", {}) if isinstance(diag, dict) else {}
    return {
        "args": vars(args),
        "load_average": os.getloadavg(),
        "requests": out,
        "queued": len(queued),
        "client_median_relative_error": statistics.median(errors) if errors else None,
        "daemon_queue_eta": {k: v for k, v in qe.items() if k != "lines"},
    }


class _none:
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.eta_gate", description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--kind", choices=("program", "identity-free"), default="program")
    p.add_argument("--time-scale", type=float, default=0.1)
    p.add_argument("--max-num-seqs", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prompt-words", type=int, default=200)
    p.add_argument("--spacing", type=float, default=0.05, help="seconds between request starts")
    p.add_argument("--interval", type=float, default=1.0, help="metrics_interval_seconds")
    p.add_argument("--keepalive", type=float, default=0.1, help="sse_keepalive_seconds")
    p.add_argument("--data-plane-processes", type=int, default=1)
    p.add_argument("--global-queue", action="store_true")
    p.add_argument("--bound", type=float, default=None, help="x-agentd-max-queue-seconds on every request")
    p.add_argument("--free-first", type=int, default=0, help="identity-free requests sent first (engine load)")
    p.add_argument("--delay", type=float, default=0.0, help="seconds before the measured requests start")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    result = run_interruptible(lambda: run(args))
    for r in result["requests"]:
        print(
            f"#{r['i']:3d} status={r['status']} pos={r['first_position']} first_eta={r['first_eta']} "
            f"wait={None if r['wait'] is None else round(r['wait'], 2)} total={round(r.get('total') or 0, 2)}"
            + (f" retry_after={r.get('retry_after')}" if r["status"] != 200 else "")
        )
    print(
        json.dumps(
            {k: result[k] for k in ("queued", "client_median_relative_error", "daemon_queue_eta", "load_average")}
        )
    )
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m bench.eta_gate"))
