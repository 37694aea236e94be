"""Load benchmarks L1-L3 of issue 14 (docs/benchmarks.md §8): agentd as separate processes.

``python -m bench.load l1|l2|l3 [--out DIR] [options]`` starts the fast fake worker
(:mod:`bench.fakeworker`) and ``agentd start`` (native routing, no Program scheduling, so the
numbers are the proxy's), drives them with raw-socket clients (:mod:`bench.rawhttp`) from this
process and prints one JSON report (also written to ``DIR/<case>.json``):

* **l1** - ``--clients`` (1,000) concurrent streaming clients, each ``--rounds`` requests one after
  another, first directly against the worker and then through agentd: zero errors, and the TTFT
  percentiles of both, whose p99 difference is agentd's *added TTFT p99*;
* **l2** - closed-loop overload at 1x, 2x and 4x of agentd's capacity (``max_in_flight_requests``
  + ``max_queued_requests``): every request beyond capacity must be a 429 or 503 with
  ``Retry-After`` and an OpenAI-shaped body, nothing else may fail, and agentd's peak RSS must
  not grow with the offered load (memory bounded);
* **l3** - ``--clients`` normal streaming clients throughout, and in every other window of
  ``--window-seconds`` as many slow senders (request bodies spread over seconds) and non-readers
  (long streams of ``--non-reader-event-bytes`` events at 100/s, never read, over a socket with a
  4 KiB receive buffer; agentd's writes block at once and it drops them after
  ``client_write_timeout_seconds``):
  the normal clients' TTFT and latency p99 in attack windows may be at most 10 % above those in
  quiet windows.  Windows cycle quiet, attack, control; a control window adds as many
  well-behaved clients as the attack has attackers, so ``*_vs_control`` separates what the
  misbehaviour costs from what the attackers' extra requests cost as ordinary load, and
  ``quiet_halves`` compares the quiet windows of odd and even cycles with each other (the spread
  of two p99s with no attack at all: the measurement's noise floor on this machine);
  ``agentd_cpu_seconds`` is agentd's CPU time spent in each kind of window.  Requests sent in the
  first ``--settle-seconds`` of every window (the change-over, when one window's extra clients
  are torn down and the next one's arrive at once) are left out of the steady-state comparison
  for all kinds of window alike and reported under ``with_transitions`` and per second.

These are benchmarks, not timed tests: on a shared machine the numbers carry its load (the
report records the load average).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from bench.interrupt import run_interruptible, run_main
from bench.output import write_atomic
from bench.procs import agentd_cmd, fakeworker_cmd, host_port, percentile, rss_bytes, running
from bench.rawhttp import RawResponse, post
from daemon.commands.argtypes import non_negative_float, positive_float, positive_int
from daemon.commands.paths import output_dir_problem

AGENTD = """
[server]
host = "127.0.0.1"
port = 0
log_level = "warning"

[routing]
worker_urls = ["{worker}"]
policy = "round_robin"

[limits]
{limits}

[batch_api]
enabled = false
"""
CHAT_PATH = "/v1/chat/completions"
L2_TOKENS = 250  # l2's streams last ~5 s, so a closed-loop client is almost always in flight


def chat(tokens: int, stream: bool = True, **extra: Any) -> bytes:
    body = {"model": "fake", "messages": [{"role": "user", "content": "load"}], "max_tokens": tokens, "stream": stream}
    return json.dumps({**body, **extra}).encode()


def ok(r: RawResponse, stream: bool = True) -> bool:
    return r.error is None and r.status == 200 and r.complete and (not stream or r.sse_done)


def ttfts(results: list[RawResponse]) -> list[float]:
    return [r.first_data_at - r.sent_at for r in results if r.first_data_at is not None]


def latencies(results: list[RawResponse]) -> list[float]:
    return [r.done_at - r.sent_at for r in results if r.done_at is not None]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(values: list[float]) -> dict[str, float]:
    return {"p50": percentile(values, 0.5), "p90": percentile(values, 0.9), "p99": percentile(values, 0.99)}


async def fan_out(count: int, ramp_seconds: float, one: Callable[[int], Awaitable[None]]) -> None:
    """Start ``count`` client tasks spread evenly over ``ramp_seconds``."""
    async with trio.open_nursery() as nursery:
        for i in range(count):
            nursery.start_soon(one, i)
            if ramp_seconds:
                await trio.sleep(ramp_seconds / count)


def write_agentd_config(out: Path, worker_url: str, limits: dict[str, Any]) -> Path:
    path = out / "agentd.toml"
    lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in limits.items())
    path.write_text(AGENTD.format(worker=worker_url, limits=lines))
    return path


# ------------------------------------------------------------------------------------------ L1


async def l1(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    shape = {"tokens": args.tokens, "first_token_seconds": 0.05, "token_interval": args.token_interval}
    async with running(fakeworker_cmd(**shape)) as (_, worker_url):
        config = write_agentd_config(out, worker_url, {"max_in_flight_requests": args.clients * 2})
        async with running(agentd_cmd(config)) as (proc, agentd_url):
            phases: dict[str, list[RawResponse]] = {}
            for name, url in (("direct", worker_url), ("agentd", agentd_url)):
                host, port = host_port(url)
                results: list[RawResponse] = []

                async def client(
                    i: int, host: str = host, port: int = port, results: list[RawResponse] = results
                ) -> None:
                    for _ in range(args.rounds):
                        results.append(await post(host, port, CHAT_PATH, chat(args.tokens)))

                await fan_out(args.clients, args.ramp_seconds, client)
                phases[name] = results
            rss = rss_bytes(proc.pid)
    report: dict[str, Any] = {"case": "l1", "clients": args.clients, "rounds": args.rounds}
    for name, results in phases.items():
        errors = [r for r in results if not ok(r)]
        report[name] = {
            "requests": len(results),
            "errors": len(errors),
            "error_kinds": sorted({r.error or f"http_{r.status}" for r in errors}),
            "ttft_seconds": summary(ttfts(results)),
            "latency_seconds": summary(latencies(results)),
        }
    report["added_ttft_p99_seconds"] = report["agentd"]["ttft_seconds"]["p99"] - report["direct"]["ttft_seconds"]["p99"]
    report["added_ttft_p50_seconds"] = report["agentd"]["ttft_seconds"]["p50"] - report["direct"]["ttft_seconds"]["p50"]
    whole = {phase: report[phase]["with_transitions"] for phase in phases}
    report["with_transitions"] = {
        "ttft_p99_degradation": whole["attacked"]["ttft_seconds"]["p99"] / whole["alone"]["ttft_seconds"]["p99"] - 1,
        "latency_p99_degradation": whole["attacked"]["latency_seconds"]["p99"]
        / whole["alone"]["latency_seconds"]["p99"]
        - 1,
    }
    report["agentd_rss_bytes"] = rss
    report["pass"] = report["agentd"]["errors"] == 0
    return report


# ------------------------------------------------------------------------------------------ L2


def refusal_ok(r: RawResponse) -> bool:
    if r.error is not None or r.status not in (429, 503) or "retry-after" not in r.headers:
        return False
    try:
        return isinstance(r.json()["error"]["code"], str)
    except (ValueError, KeyError, TypeError):
        return False


async def l2(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    capacity = args.in_flight + args.queued
    tokens = args.tokens if args.tokens_given else L2_TOKENS  # long streams: clients stay in flight
    shape = {"tokens": tokens, "first_token_seconds": 0.05, "token_interval": args.token_interval}
    limits = {
        "max_in_flight_requests": args.in_flight,
        "max_queued_requests": args.queued,
        "queue_timeout_seconds": args.queue_timeout,
    }
    levels: list[dict[str, Any]] = []
    async with running(fakeworker_cmd(**shape)) as (_, worker_url):
        config = write_agentd_config(out, worker_url, limits)
        async with running(agentd_cmd(config)) as (proc, agentd_url):
            host, port = host_port(agentd_url)
            for factor in (1, 2, 4):
                results: list[RawResponse] = []
                peak = rss_bytes(proc.pid)
                stop_at = trio.current_time() + args.seconds

                async def client(i: int, results: list[RawResponse] = results, stop_at: float = stop_at) -> None:
                    while trio.current_time() < stop_at:
                        r = await post(host, port, CHAT_PATH, chat(tokens))
                        results.append(r)
                        if r.status in (429, 503):
                            await trio.sleep(args.retry_pause)

                async def sampler(stop_at: float = stop_at) -> None:
                    nonlocal peak
                    while trio.current_time() < stop_at:
                        peak = max(peak, rss_bytes(proc.pid))
                        await trio.sleep(0.5)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(sampler)
                    await fan_out(capacity * factor, 1.0, client)
                served = [r for r in results if ok(r)]
                refused = [r for r in results if refusal_ok(r)]
                other = [r for r in results if not ok(r) and not refusal_ok(r)]
                codes: dict[str, int] = {}
                for r in refused:
                    key = f"{r.status} {r.json()['error']['code']}"
                    codes[key] = codes.get(key, 0) + 1
                levels.append(
                    {
                        "offered_clients": capacity * factor,
                        "factor": factor,
                        "requests": len(results),
                        "served": len(served),
                        "refused": codes,
                        "other_failures": len(other),
                        "other_kinds": sorted({r.error or f"http_{r.status}" for r in other}),
                        "served_latency_seconds": summary(latencies(served)),
                        "peak_rss_bytes": peak,
                    }
                )
    base = levels[0]["peak_rss_bytes"]
    report = {
        "case": "l2",
        "in_flight": args.in_flight,
        "queued": args.queued,
        "levels": levels,
        "rss_ratio_4x_to_1x": levels[-1]["peak_rss_bytes"] / base,
        "pass": all(level["other_failures"] == 0 for level in levels)
        and levels[1]["refused"] != {}
        and levels[-1]["peak_rss_bytes"] <= 1.25 * base,
    }
    return report


# ------------------------------------------------------------------------------------------ L3


async def l3(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Normal clients run throughout; the attack runs in every other window (quiet, attack, quiet,
    ...), so machine-load drift affects both sides alike; a normal request counts for the window
    it was sent in."""
    shape = {"tokens": args.tokens, "first_token_seconds": 0.05, "token_interval": args.token_interval}
    limits = {"client_write_timeout_seconds": args.write_timeout, "body_read_timeout_seconds": 30.0}
    phases: dict[str, list[RawResponse]] = {"alone": [], "attacked": [], "control": []}
    started_attacks = {"slow_sender": 0, "non_reader": 0}
    windows: list[tuple[float, float, str]] = []
    agentd_cpu = {"alone": 0.0, "attacked": 0.0, "control": 0.0}  # agentd's CPU seconds per kind of window
    async with running(fakeworker_cmd(**shape)) as (_, worker_url):
        config = write_agentd_config(out, worker_url, limits)
        async with running(agentd_cmd(config)) as (proc, agentd_url):
            host, port = host_port(agentd_url)
            normal_results: list[RawResponse] = []
            stop_at = trio.current_time() + args.seconds + 1.0

            async def normal(i: int) -> None:
                while trio.current_time() < stop_at:
                    normal_results.append(await post(host, port, CHAT_PATH, chat(args.tokens)))

            async def ordinary(i: int) -> None:
                while True:
                    await post(host, port, CHAT_PATH, chat(args.tokens))

            async def slow_sender(i: int) -> None:
                while True:
                    started_attacks["slow_sender"] += 1
                    body = chat(args.tokens)
                    await post(host, port, CHAT_PATH, body, send_slowly_seconds=args.slow_send_seconds)

            async def non_reader(i: int) -> None:
                heavy = chat(1_000_000, fake_token_interval=0.01, fake_event_bytes=args.non_reader_event_bytes)
                while True:
                    started_attacks["non_reader"] += 1
                    await post(host, port, CHAT_PATH, heavy, read_delay_seconds=3600.0, receive_buffer_bytes=4096)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(fan_out, args.clients, 1.0, normal)
                await trio.sleep(1.0)  # the clients are all running before the first window
                cycle = ("alone", "attacked", "control")
                turn = 0
                while trio.current_time() + 0.5 < stop_at:
                    begin = trio.current_time()
                    end = min(begin + args.window_seconds, stop_at)
                    kind = cycle[turn % len(cycle)]
                    turn += 1
                    windows.append((begin, end, kind))
                    cpu_before = cpu_seconds(proc.pid)
                    with trio.move_on_at(end):
                        async with trio.open_nursery() as extra:
                            if kind == "attacked":
                                if args.slow_senders:
                                    extra.start_soon(fan_out, args.slow_senders, 0.2, slow_sender)
                                if args.non_readers:
                                    extra.start_soon(fan_out, args.non_readers, 0.2, non_reader)
                            elif kind == "control":  # as many well-behaved clients instead
                                extra.start_soon(fan_out, args.slow_senders + args.non_readers, 0.2, ordinary)
                            else:
                                await trio.sleep_forever()
                    agentd_cpu[kind] += cpu_seconds(proc.pid) - cpu_before
            rss = rss_bytes(proc.pid)
    quiet_halves: tuple[list[RawResponse], list[RawResponse]] = ([], [])
    by_second: dict[str, dict[int, list[RawResponse]]] = {kind: {} for kind in phases}
    # requests sent in the first --settle-seconds of a window (of every kind alike) meet the
    # change-over: the previous window's clients being torn down and this window's arriving at
    # once. They are reported per second and in "with_transitions", and left out of the
    # steady-state comparison (docs/benchmarks.md §8.6).
    transitions: dict[str, list[RawResponse]] = {kind: [] for kind in phases}
    for r in normal_results:
        for n, (begin, end, kind) in enumerate(windows):
            if begin <= r.sent_at < end:
                by_second[kind].setdefault(int(r.sent_at - begin), []).append(r)
                if r.sent_at - begin < args.settle_seconds:
                    transitions[kind].append(r)
                    continue
                phases[kind].append(r)
                if kind == "alone":  # every other quiet window: the A/A noise floor of a p99
                    quiet_halves[(n // len(cycle)) % 2].append(r)
    report: dict[str, Any] = {
        "case": "l3",
        "clients": args.clients,
        "slow_senders": args.slow_senders,
        "non_readers": args.non_readers,
        "windows": len(windows),
        "window_seconds": args.window_seconds,
        "settle_seconds": args.settle_seconds,
    }
    for phase, results in phases.items():
        report[phase] = {
            "requests": len(results),
            "errors": sum(1 for r in results if not ok(r)),
            "ttft_seconds": summary(ttfts(results)),
            "latency_seconds": summary(latencies(results)),
            # where in the window the tail is: TTFT p99 of the requests sent in each second of it
            "ttft_p99_by_second": [
                round(summary(ttfts(by_second[phase][k]))["p99"], 3) for k in sorted(by_second[phase])
            ],
        }
        everything = results + transitions[phase]
        report[phase]["with_transitions"] = {
            "requests": len(everything),
            "errors": sum(1 for r in everything if not ok(r)),
            "ttft_seconds": summary(ttfts(everything)),
            "latency_seconds": summary(latencies(everything)),
        }
    report["attack_requests_started"] = started_attacks
    report["agentd_cpu_seconds"] = {kind: round(seconds, 2) for kind, seconds in agentd_cpu.items()}
    alone, attacked = report["alone"], report["attacked"]
    report["ttft_p99_degradation"] = attacked["ttft_seconds"]["p99"] / alone["ttft_seconds"]["p99"] - 1
    report["latency_p99_degradation"] = attacked["latency_seconds"]["p99"] / alone["latency_seconds"]["p99"] - 1
    control = report["control"]
    report["ttft_p99_vs_control"] = attacked["ttft_seconds"]["p99"] / control["ttft_seconds"]["p99"] - 1
    report["latency_p99_vs_control"] = attacked["latency_seconds"]["p99"] / control["latency_seconds"]["p99"] - 1
    # the same comparison between two sets of quiet windows (odd vs even cycles): how far apart two
    # p99s of this many requests are on this machine with no attack at all
    half_ttft = [summary(ttfts(h))["p99"] for h in quiet_halves]
    half_latency = [summary(latencies(h))["p99"] for h in quiet_halves]
    report["quiet_halves"] = {
        "requests": [len(h) for h in quiet_halves],
        "ttft_p99": half_ttft,
        "latency_p99": half_latency,
        "ttft_p99_spread": max(half_ttft) / min(half_ttft) - 1 if min(half_ttft) > 0 else None,
        "latency_p99_spread": max(half_latency) / min(half_latency) - 1 if min(half_latency) > 0 else None,
    }
    whole = {phase: report[phase]["with_transitions"] for phase in phases}
    report["with_transitions"] = {
        "ttft_p99_degradation": whole["attacked"]["ttft_seconds"]["p99"] / whole["alone"]["ttft_seconds"]["p99"] - 1,
        "latency_p99_degradation": whole["attacked"]["latency_seconds"]["p99"]
        / whole["alone"]["latency_seconds"]["p99"]
        - 1,
    }
    report["agentd_rss_bytes"] = rss
    report["pass"] = (
        attacked["errors"] == 0 and report["ttft_p99_degradation"] <= 0.10 and report["latency_p99_degradation"] <= 0.10
    )
    return report


CASES = {"l1": l1, "l2": l2, "l3": l3}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.split("\n\n")[0])
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--out", default="bench-out/load")
    parser.add_argument("--clients", type=positive_int, default=None, help="l1: 1000, l3: 100")
    parser.add_argument("--rounds", type=positive_int, default=3, help="l1: requests per client")
    parser.add_argument(
        "--ramp-seconds", type=non_negative_float, default=2.0, help="l1: spread the clients' start over this"
    )
    parser.add_argument("--tokens", type=positive_int, default=None, help=f"chunks per stream (32; l2: {L2_TOKENS})")
    parser.add_argument("--token-interval", type=non_negative_float, default=0.02)
    parser.add_argument(
        "--seconds", type=positive_float, default=None, help="l2: each level (20); l3: the whole run (60)"
    )
    parser.add_argument(
        "--window-seconds", type=positive_float, default=5.0, help="l3: alternating quiet/attack windows"
    )
    parser.add_argument(
        "--settle-seconds",
        type=non_negative_float,
        default=1.0,
        help="l3: requests sent in each window's first seconds (change-over) are reported apart",
    )
    parser.add_argument("--in-flight", type=positive_int, default=200, help="l2: limits.max_in_flight_requests")
    parser.add_argument("--queued", type=positive_int, default=50, help="l2: limits.max_queued_requests")
    parser.add_argument("--queue-timeout", type=positive_float, default=1.0, help="l2: limits.queue_timeout_seconds")
    parser.add_argument(
        "--retry-pause", type=non_negative_float, default=0.2, help="l2: a refused client waits this long"
    )
    parser.add_argument(
        "--attackers", type=positive_int, default=None, help="l3: slow senders and non-readers, each (= clients)"
    )
    parser.add_argument(
        "--slow-senders", type=positive_int, default=None, help="l3: slow senders (default --attackers)"
    )
    parser.add_argument("--non-readers", type=positive_int, default=None, help="l3: non-readers (default --attackers)")
    parser.add_argument("--slow-send-seconds", type=positive_float, default=5.0)
    parser.add_argument(
        "--non-reader-event-bytes",
        type=positive_int,
        default=16384,
        help="l3: non-readers' stream, 100 events/s of this size",
    )
    parser.add_argument(
        "--write-timeout", type=positive_float, default=5.0, help="l3: limits.client_write_timeout_seconds"
    )
    args = parser.parse_args(argv)
    if args.clients is None:
        args.clients = 1000 if args.case == "l1" else 100
    if args.seconds is None:
        args.seconds = 60.0 if args.case == "l3" else 20.0
    args.tokens_given = args.tokens is not None
    if args.tokens is None:
        args.tokens = 32
    if args.attackers is None:
        args.attackers = args.clients
    if args.slow_senders is None:
        args.slow_senders = args.attackers
    if args.non_readers is None:
        args.non_readers = args.attackers
    problem = output_dir_problem(args.out, "--out")
    if problem:
        parser.error(problem)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    report = run_interruptible(lambda: CASES[args.case](args, out))
    report["loadavg_start"] = load_start
    report["loadavg_end"] = os.getloadavg()
    write_atomic(out / f"{args.case}.json", json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m bench.load"))
