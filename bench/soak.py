"""Soak run (issue 14): agentd under steady load with injected faults for a long time.

``python -m bench.soak [--minutes 30] [--fault-rate 0.01] [--concurrency 32] [--out DIR]``
starts the fast fake worker (:mod:`bench.fakeworker`, injecting worker faults - resets mid-stream,
500s, garbage heads - at ``fault-rate``) and ``agentd start`` with Program scheduling on, then
runs ``concurrency`` client loops for the whole duration: streaming and non-streaming chat
requests, half of them with Program identity (a pool of Programs), and client faults at the same
rate (a client that disconnects after the first byte).  Every ``--sample-seconds`` it records
agentd's resident memory.

Verdict (exit 0 when both hold, 1 otherwise; ``report.json`` in ``--out``, beside the run's
``agentd.toml`` and ``agentd.stderr.log``, which are written in a temporary directory while it runs
and moved there only when it finishes: Ctrl-C leaves ``--out`` as it was):

* **memory growth under 5 %**: RSS at the end versus RSS after the warm-up (the first 10 % of
  the run, at least one sample), so that caches and pools that fill once are not counted;
* **counters at zero when idle**: after the load stops and a few scheduler ticks have passed,
  every in-flight/queued counter agentd reports is zero - the edge (``proxy.edge``), the native
  dispatcher's per-target in-flight counts, Program scheduling's in-flight and retained
  requests and per-rank router in-flight, and the ``agentd_proxy_in_flight_requests`` gauges.

The machine may be shared: the report records the load average at start and end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from bench.interrupt import run_interruptible, run_main
from bench.output import write_atomic
from bench.procs import agentd_cmd, fakeworker_cmd, host_port, percentile, rss_bytes, running
from bench.rawhttp import post
from daemon.commands.argtypes import fraction, int_at_least, positive_float, positive_int
from daemon.commands.paths import output_dir_problem

CONFIG = """
enable_program_scheduling = true

[server]
host = "127.0.0.1"
port = 0
log_level = "warning"

[routing]
worker_urls = ["{worker}"]
intra_node_data_parallel_size = 1
health_check_interval_seconds = 2.0

[program_scheduling]
global_queue = true
token_capacity_per_dp_rank = 200000

[batch_api]
enabled = false
"""
MAX_GROWTH = 0.05
IDLE_SETTLE_SECONDS = 5.0


@attrs.define
class Tally:
    requests: int = 0
    ok: int = 0
    by_outcome: dict[str, int] = attrs.field(factory=dict)
    latencies: list[float] = attrs.field(factory=list)

    def count(self, outcome: str) -> None:
        self.by_outcome[outcome] = self.by_outcome.get(outcome, 0) + 1


def request_body(rng: random.Random, programs: int) -> tuple[bytes, bool]:
    stream = rng.random() < 0.7
    body: dict[str, Any] = {
        "model": "fake",
        "messages": [{"role": "user", "content": "soak " + "x" * rng.randrange(10, 400)}],
        "max_tokens": 32,
        "stream": stream,
    }
    if rng.random() < 0.5:
        pid = rng.randrange(programs)
        body["vllm_xargs"] = {"agentic_context": {"program_id": f"soak-{pid}", "task_id": f"task-{pid % 8}"}}
    return json.dumps(body).encode(), stream


async def client_loop(
    host: str, port: int, rng: random.Random, stop_at: float, fault_rate: float, tally: Tally
) -> None:
    while trio.current_time() < stop_at:
        body, stream = request_body(rng, 64)
        abort = stream and rng.random() < fault_rate
        r = await post(host, port, "/v1/chat/completions", body, abort_after_first_byte=abort)
        tally.requests += 1
        if r.error is not None:
            tally.count(r.error.split(":")[0])
        elif r.status == 200 and (not stream or r.sse_done):
            tally.ok += 1
            tally.count("ok")
            if r.done_at is not None:
                tally.latencies.append(r.done_at - r.sent_at)
        else:
            tally.count(f"http_{r.status}")


def idle_violations(diag: dict[str, Any], metrics: str) -> list[str]:
    """Every counter that should be zero when agentd is idle and is not."""
    bad = []
    proxy = diag.get("proxy", {})
    edge = proxy.get("edge", {})
    for key in ("in_flight", "queued"):
        if edge.get(key, 0) != 0:
            bad.append(f"proxy.edge.{key}={edge[key]}")
    for target in proxy.get("targets", []):
        if target.get("native_in_flight_requests", 0) != 0:
            bad.append(f"{target['target_id']}.native_in_flight_requests={target['native_in_flight_requests']}")
    for key in ("in_flight_requests", "retained_requests"):
        if diag.get(key, 0) != 0:
            bad.append(f"{key}={diag[key]}")
    for rank in diag.get("ranks", []):
        if rank.get("router_in_flight_requests", 0) != 0:
            bad.append(f"{rank['target_id']}.router_in_flight_requests={rank['router_in_flight_requests']}")
    for line in metrics.splitlines():
        if line.startswith("agentd_proxy_in_flight_requests{") and float(line.rsplit(" ", 1)[1]) != 0:
            bad.append(line)
    return bad


async def soak(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The run; agentd's config and log go to ``work`` (a temporary directory)."""
    duration = args.minutes * 60.0
    shape = {"tokens": 32, "first_token_seconds": 0.05, "token_interval": 0.01, "fault_rate": args.fault_rate}
    load_start = os.getloadavg()
    async with running(fakeworker_cmd(**shape, seed=args.seed)) as (_, worker_url):
        config = work / "agentd.toml"
        config.write_text(CONFIG.format(worker=worker_url))
        with (work / "agentd.stderr.log").open("wb") as log:
            async with running(agentd_cmd(config), stderr=log) as (proc, url):
                host, port = host_port(url)
                tally = Tally()
                samples: list[tuple[float, int]] = []
                started = trio.current_time()
                stop_at = started + duration

                async def sample() -> None:
                    while trio.current_time() < stop_at:
                        samples.append((trio.current_time() - started, rss_bytes(proc.pid)))
                        print(
                            f"soak t={samples[-1][0]:7.0f}s rss={samples[-1][1] / 2**20:7.1f} MiB "
                            f"requests={tally.requests} ok={tally.ok}",
                            file=sys.stderr,
                            flush=True,
                        )
                        await trio.sleep(args.sample_seconds)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(sample)
                    for i in range(args.concurrency):
                        nursery.start_soon(
                            client_loop,
                            host,
                            port,
                            random.Random(args.seed * 1000 + i),
                            stop_at,
                            args.fault_rate,
                            tally,
                        )
                samples.append((trio.current_time() - started, rss_bytes(proc.pid)))
                await trio.sleep(IDLE_SETTLE_SECONDS)
                async with httpx.AsyncClient(timeout=30) as client:
                    diag = (await client.get(f"{url}/scheduling/diagnostics")).json()
                    metrics = (await client.get(f"{url}/metrics")).text
    warm_index = max(0, min(len(samples) - 1, int(len(samples) * 0.1)))
    warm_rss = samples[warm_index][1]
    end_rss = samples[-1][1]
    growth = (end_rss - warm_rss) / warm_rss
    violations = idle_violations(diag, metrics)
    report = {
        "minutes": args.minutes,
        "fault_rate": args.fault_rate,
        "concurrency": args.concurrency,
        "requests": tally.requests,
        "outcomes": tally.by_outcome,
        "latency_p50_seconds": percentile(tally.latencies, 0.5),
        "latency_p99_seconds": percentile(tally.latencies, 0.99),
        "rss_warm_bytes": warm_rss,
        "rss_end_bytes": end_rss,
        "rss_max_bytes": max(r for _, r in samples),
        "rss_growth": growth,
        "rss_samples": samples,
        "idle_violations": violations,
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "pass": growth < MAX_GROWTH and not violations,
    }
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=positive_float, default=30.0, help="length of the load (default 30)")
    parser.add_argument(
        "--fault-rate",
        type=fraction,
        default=0.01,
        help="share of worker answers broken and of streams the client drops, in [0, 1] (default 0.01)",
    )
    parser.add_argument("--concurrency", type=positive_int, default=32, help="client loops (default 32)")
    parser.add_argument(
        "--sample-seconds", type=positive_float, default=10.0, help="agentd RSS sampling period (default 10)"
    )
    parser.add_argument("--seed", type=int_at_least(0), default=1, help="seed of the clients and faults (default 1)")
    parser.add_argument(
        "--out",
        default="bench-out/soak",
        help="directory of report.json, agentd.toml and agentd.stderr.log, written when the run ends "
        "(default bench-out/soak)",
    )
    args = parser.parse_args(argv)
    problem = output_dir_problem(args.out, "--out")
    if problem:
        parser.error(problem)
    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="agentd-soak-") as work:
        report = run_interruptible(lambda: soak(args, Path(work)))
        # only a finished run touches --out (an interrupted one leaves it as it was)
        out.mkdir(parents=True, exist_ok=True)
        for name in ("agentd.toml", "agentd.stderr.log"):
            shutil.move(Path(work) / name, out / name)
    write_atomic(out / "report.json", json.dumps(report, indent=2))
    summary = {k: v for k, v in report.items() if k != "rss_samples"}
    print(json.dumps(summary, indent=2))
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m bench.soak"))
