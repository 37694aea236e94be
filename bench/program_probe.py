"""agentd's CPU per Program request in a closed loop (c=1 by default), optionally A/B against
another checkout (docs/benchmarks.md §10.4.1).

Usage (from the repository root)::

    python -m bench.program_probe [--seconds 5] [--rounds 3] [--kb 1] [--identity program]
        [--processes 1] [--think-ms 0] [--compare DIR] [--py-spy OUT]

A zero-delay fake worker (``bench.proxy_overhead``'s), ``agentd start`` in front of it with
Program scheduling on (the overhead bench's configuration: capacity far above the load, so
admission never waits) and one keep-alive client that sends the same Program's 1 KiB agent body
in a closed loop.  After a warm-up, the agentd process tree's CPU (user + system, ``/proc``) is
read before and after ``--seconds`` of requests: CPU per request and the mean latency.

``--compare DIR`` runs a second agentd from another checkout (a detached worktree of ``main``:
``python -m daemon`` started with DIR as its working directory imports DIR's code) and
alternates the two for ``--rounds`` rounds, so both see the same minutes of the machine.
``--concurrency C`` runs C connections, one Program each (the overhead bench's c=32 loop).
``--think-ms T``: each connection waits T ms after an answer before its next request, as an agent
between turns (the closed loop, T = 0, sends it at once: work agentd does after an answer's last
write then delays the next request whenever it outlasts the client's turnaround, docs/benchmarks.md
§10.2.7); the latencies never include the wait.
``--py-spy OUT`` records this checkout's agentd (with N > 1 its scheduler process) during its
first round (``py-spy`` on PATH or beside this interpreter; ``--format raw``: collapsed stacks).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from functools import partial
from pathlib import Path

import trio

from bench.harness import (
    ROOT,
    cpu_seconds,
    daemon_env,
    free_port,
    python_speed_probe_us,
    stop_all,
    tree_cpu_seconds,
    wait_listening,
)
from bench.interrupt import run_interruptible, run_main
from bench.proxy_overhead import MODULE, PROGRAM_CONFIG, Conn, agent_body, connect, program_context, wait_relays
from daemon.commands.argtypes import non_negative_float, positive_int


def agentd_command(port: int, worker_port: int, program: bool, config: Path) -> list[str]:
    cmd = [sys.executable, "-m", "daemon", "start", "--port", str(port), "--log-level", "warning"]
    cmd += ["--worker-urls", f"http://127.0.0.1:{worker_port}", "--policy", "round_robin", "--config", str(config)]
    if program:
        cmd += ["--enable-program-scheduling", "--program-scheduling-config-json", json.dumps(PROGRAM_CONFIG)]
    return cmd


async def _loop(
    port: int, bodies: list[bytes], seconds: float, pid: int, think: float = 0.0
) -> tuple[int, float, float, float, list[float]]:
    """(requests, agentd tree CPU seconds, its first process's CPU seconds, wall seconds, each
    request's latency in seconds) of ``seconds`` of a closed loop, one connection per body.  The
    first process is the whole daemon with N = 1, the scheduler process with N > 1."""
    conns = [await connect(port, body) for body in bodies]
    count = 0
    end = 0.0
    latencies: list[float] = []

    async def user(conn: Conn, warmup: bool) -> None:
        nonlocal count
        if warmup:
            for _ in range(200 // len(conns) + 1):  # windows, caches, the first run of every path
                await conn.roundtrip()
            return
        while (t0 := time.perf_counter()) < end:
            await conn.roundtrip()
            latencies.append(time.perf_counter() - t0)
            count += 1
            if think > 0:
                await trio.sleep(think)

    try:
        async with trio.open_nursery() as nursery:
            for conn in conns:
                nursery.start_soon(user, conn, True)
        cpu0, main0 = tree_cpu_seconds(pid), cpu_seconds(pid)
        t0 = time.perf_counter()
        end = t0 + seconds
        async with trio.open_nursery() as nursery:
            for conn in conns:
                nursery.start_soon(user, conn, False)
        wall = time.perf_counter() - t0
        cpu, main = tree_cpu_seconds(pid) - cpu0, cpu_seconds(pid) - main0
    finally:
        for conn in conns:
            await conn.stream.aclose()
    return count, cpu, main, wall, latencies


def _passes(port: int) -> str:
    """The resume passes so far (docs/operations.md §13.3), when the checkout and N > 1 have them."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/scheduling/diagnostics", timeout=10) as answer:
            passes = json.load(answer).get("data_plane", {}).get("passes")
    except (OSError, ValueError):
        return ""
    if not passes:
        return ""
    counts = (passes["passed_count"], passes["crossed_count"], passes["races_count"])
    return "; passed {}, crossed {}, races {} (so far)".format(*counts)


def _py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.program_probe", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kb", type=positive_int, default=1, help="body size in KiB (default 1)")
    parser.add_argument("--identity", choices=("program", "free"), default="program")
    parser.add_argument("--processes", type=int, default=1, help="[server] data_plane_processes (default 1)")
    parser.add_argument("--concurrency", type=int, default=1, help="connections, one Program each (default 1)")
    parser.add_argument(
        "--think-ms",
        type=non_negative_float,
        default=0.0,
        help="wait after each answer before the next request (default 0)",
    )
    parser.add_argument("--compare", type=Path, help="another checkout to alternate with (e.g. a worktree of main)")
    parser.add_argument("--py-spy", type=Path, help="record this checkout's agentd in its first round (raw)")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        print("--seconds: must be > 0", file=sys.stderr)
        return 2
    if args.rounds < 1:
        print("--rounds: must be >= 1", file=sys.stderr)
        return 2
    if args.concurrency < 1:
        print("--concurrency: must be >= 1", file=sys.stderr)
        return 2
    if args.processes < 1:
        print("--processes: must be >= 1", file=sys.stderr)
        return 2
    if args.compare is not None and not (args.compare / "daemon" / "__main__.py").is_file():
        print(f"--compare: {args.compare} is not an agentd checkout (no daemon/__main__.py)", file=sys.stderr)
        return 2
    spy = _py_spy() if args.py_spy else None
    if args.py_spy and spy is None:
        print("--py-spy: py-spy is not installed (pip install py-spy)", file=sys.stderr)
        return 2
    program = args.identity == "program"
    bodies = [agent_body(args.kb, program_context(user) if program else None) for user in range(args.concurrency)]
    trees = {"this": ROOT} | ({"compare": args.compare.resolve()} if args.compare else {})
    load = os.getloadavg()
    print(
        f"program probe: identity {args.identity}, {args.kb} KiB, N = {args.processes}, c={args.concurrency}, "
        f"think {args.think_ms:g} ms, "
        f"{args.seconds:g} s x {args.rounds} rounds; {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, "
        f"load {load[0]:.2f}, speed probe {python_speed_probe_us():.1f} us",
        flush=True,
    )
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    scheduler: dict[str, list[float]] = {name: [] for name in trees}  # the first process's CPU
    medians: dict[str, list[float]] = {name: [] for name in trees}  # latency p50 per round (ms)
    with tempfile.TemporaryDirectory(prefix="program-probe-") as tmp:
        config = Path(tmp) / "agentd.toml"
        config.write_text(f"[server]\ndata_plane_processes = {args.processes}\n")
        try:
            worker_port = free_port()
            worker = subprocess.Popen([sys.executable, "-m", MODULE, "--serve-worker", str(worker_port)], cwd=ROOT)
            procs.append(worker)
            wait_listening(worker_port, worker, "fake worker")
            daemons: dict[str, tuple[int, subprocess.Popen[bytes]]] = {}
            for name, tree in trees.items():
                port = free_port()
                # the child's logs (its start-up warnings included) go to a file of the run, named
                # when it fails: on the bench's stderr they read as the bench's own
                log = Path(tmp) / f"agentd-{name}.log"
                with log.open("wb") as sink:
                    proc = subprocess.Popen(
                        agentd_command(port, worker_port, program, config),
                        cwd=tree,
                        stdout=subprocess.DEVNULL,
                        stderr=sink,
                        env=daemon_env(),
                    )
                procs.append(proc)
                wait_listening(port, proc, f"agentd ({name}, log {log})")
                daemons[name] = (port, proc)
            time.sleep(2.0)  # the first health round
            if args.processes > 1:  # every relay accepts before the first round (its imports take seconds)
                for name, (port, proc) in daemons.items():
                    wait_relays(port, proc, f"agentd ({name})")
            for r in range(args.rounds):
                for name, (port, proc) in daemons.items():
                    recorder = None
                    if spy is not None and name == "this" and r == 0:
                        cmd = [spy, "record", "--format", "raw", "-r", "500", "-o", str(args.py_spy)]
                        cmd += ["--pid", str(proc.pid)]  # the scheduler process when N > 1
                        recorder = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        time.sleep(1.0)
                    n, cpu, main, wall, latencies = run_interruptible(
                        partial(_loop, port, bodies, args.seconds, proc.pid, args.think_ms / 1e3)
                    )
                    if recorder is not None:
                        recorder.send_signal(2)  # SIGINT: py-spy writes its output and exits
                        recorder.wait(timeout=60)
                    us = cpu / max(1, n) * 1e6
                    main_us = main / max(1, n) * 1e6
                    p50 = statistics.median(latencies) * 1e3 if latencies else float("nan")
                    # the mean latency: the wall time per request of the loop, without the think time
                    mean = statistics.fmean(latencies) if args.think_ms > 0 and latencies else wall / max(1, n)
                    results[name].append((us, mean * 1e3))
                    scheduler[name].append(main_us)
                    medians[name].append(p50)
                    print(
                        f"  round {r + 1} {name:8} {n:6d} requests  agentd CPU {us:7.0f} us/request "
                        f"(first process {main_us:6.0f})  "
                        f"mean latency {mean * 1e3:6.3f} ms, p50 {p50:6.3f} ms{_passes(port)}",
                        flush=True,
                    )
        finally:
            stop_all(procs)
    for name, rows in results.items():
        cpus = [u for u, _ in rows]
        print(
            f"{name:8} ({trees[name]}): CPU per request median {statistics.median(cpus):.0f} us "
            f"(runs {', '.join(f'{u:.0f}' for u in cpus)}), mean latency median "
            f"{statistics.median(ms for _, ms in rows):.3f} ms, latency p50 median "
            f"{statistics.median(medians[name]):.3f} ms "
            f"(runs {', '.join(f'{m:.3f}' for m in medians[name])}); first process (the scheduler with N > 1) "
            f"median {statistics.median(scheduler[name]):.0f} us per request"
        )
    if args.compare is not None:
        ratios = [a / b for (a, _), (b, _) in zip(results["this"], results["compare"], strict=True)]
        print("this / compare CPU per request, round by round: " + ", ".join(f"{x:.3f}" for x in ratios))
        firsts = [a / b for a, b in zip(scheduler["this"], scheduler["compare"], strict=True)]
        print("this / compare first-process CPU per request, round by round: " + ", ".join(f"{x:.3f}" for x in firsts))
        p50s = [a / b for a, b in zip(medians["this"], medians["compare"], strict=True)]
        print("this / compare latency p50, round by round: " + ", ".join(f"{x:.3f}" for x in p50s))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m bench.program_probe"))
