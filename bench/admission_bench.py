"""The scheduler's own CPU per admission cycle, through the real scheduler actor (docs/benchmarks.md §10.4).

Usage (from the repository root)::

    python -m bench.admission_bench [--cycles 20000] [--programs 1000] [--concurrency 32] [--ranks 8] [--json OUT]

One process runs the daemon's scheduling side as ``agentd start`` builds it (``run_daemon`` with
Program scheduling on, no HTTP listener; the workers are an in-memory transport that answers the
health, model and metrics probes) and ``--concurrency`` client tasks that each loop over:
submit a Program request (``ProgramDispatcher.lease``: the message to the scheduler actor, the
pure core's step, the ``Admit`` effect routed back) -> finish it (``lease.finish`` with usage:
the completion message, the core's step, the Program pauses). Requests cycle over
``--programs`` Program ids spread over ``--ranks`` DP ranks, so most are resumes of a paused
Program.  The request values (parsed bodies and identities) are built before the clock starts:
the CPU counted is the dispatcher, the actor, the mailboxes and the core, not request parsing
or the proxy (docs/benchmarks.md §10.2 has those).

Reported: process CPU (``time.process_time``) per cycle, cycles per second of wall time, and the
ceiling this implies for one scheduler core (1e6 / CPU us per cycle admissions per second).
``--phases`` also times, in thread CPU, every core ``step`` and every routing of a step's effects
(``EffectRouter.route``) and reports both per cycle (two clock reads around each, about a
microsecond, included; docs/benchmarks.md §10.2.6): their ratio does not depend on the machine's
load the way the CPU per cycle does.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from actors.core.config import ProgramSchedulingConfig
from actors.core.model import Usage
from bench import harness
from bench.interrupt import run_interruptible, run_main
from bench.output import write_atomic
from daemon.commands.paths import output_file_problem
from daemon.config import AgentdConfig, BatchApiConfig, RoutingConfig, ServerConfig
from daemon.dispatch import Outcome
from daemon.handles import DaemonHandles
from daemon.logs import configure_logging
from daemon.program_dispatch import ProgramDispatcher
from daemon.supervisor import run_daemon

METRICS = (
    '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 0\n'
    '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine="0"} 0\n'
)


async def _worker(request: httpx.Request) -> httpx.Response:
    path = request.url.path
    if path == "/v1/models":
        return httpx.Response(200, json={"object": "list", "data": [{"id": "m"}]})
    if path == "/metrics":
        return httpx.Response(200, text=METRICS)
    return httpx.Response(200, json={})


def _config(ranks: int) -> AgentdConfig:
    return AgentdConfig(
        server=ServerConfig(port=0, log_level="warning"),
        routing=RoutingConfig(worker_urls=("http://w0:8000",), intra_node_data_parallel_size=ranks),  # type: ignore[arg-type]
        batch_api=BatchApiConfig(enabled=False),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(),
    )


def _body(program: int) -> bytes:
    return json.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 16,
            "vllm_xargs": {"agentic_context": {"program_id": f"p{program}", "agent_id": "lead"}},
        }
    ).encode()


def _time_phases(handle: Any, acc: dict[str, int]) -> Callable[[], None]:
    """Wrap the scheduler's core step and its effect routing with thread-CPU clocks (``--phases``);
    returns what undoes it."""
    import actors.scheduler_actor as actor_module

    step, route, clock = actor_module.step, handle.router.route, time.thread_time_ns

    def timed_step(*args: Any, **kwargs: Any) -> Any:
        t = clock()
        try:
            return step(*args, **kwargs)
        finally:
            acc["step"] += clock() - t

    def timed_route(effects: Any) -> None:
        t = clock()
        try:
            route(effects)
        finally:
            acc["route"] += clock() - t

    actor_module.step = timed_step
    handle.router.route = timed_route

    def undo() -> None:
        actor_module.step = step
        del handle.router.route

    return undo


async def run(cycles: int, programs: int, concurrency: int, ranks: int, phases: bool = False) -> dict[str, Any]:
    done = 0
    acc = {"step": 0, "route": 0}
    async with trio.open_nursery() as nursery:
        handles: DaemonHandles = await nursery.start(
            partial(
                run_daemon,
                _config(ranks),
                transport_factory=lambda cfg: httpx.MockTransport(_worker),
                serve_http=False,
                rng=random.Random(1),
            )
        )
        dispatcher = handles.program_dispatcher
        assert dispatcher is not None, "Program scheduling did not start"
        undo = None
        if phases:
            assert isinstance(dispatcher, ProgramDispatcher)
            undo = _time_phases(dispatcher.scheduler, acc)
        bodies = [_body(p) for p in range(programs)]
        requests = [
            attrs.evolve(handles.build_request("chat", bodies[i % programs], {}), request_id=f"r{i}")
            for i in range(cycles + programs)
        ]
        outcome = Outcome(
            True, Usage(prompt_tokens=200, cached_prompt_tokens=150, completion_tokens=16), None, 0.01, 0.1
        )

        async def client(first: int, step: int, until: int) -> None:
            nonlocal done
            for i in range(first, until, step):
                async with dispatcher.lease(requests[i]) as lease:
                    lease.finish(outcome)
                done += 1

        async def phase(start: int, count: int) -> tuple[float, float]:
            cpu0, wall0 = time.process_time(), time.perf_counter()
            async with trio.open_nursery() as clients:
                for c in range(concurrency):
                    clients.start_soon(client, start + c, concurrency, start + count)
            return time.process_time() - cpu0, time.perf_counter() - wall0

        await phase(0, programs)  # warm-up: every Program admitted once (then paused)
        done = 0
        acc["step"] = acc["route"] = 0
        cpu, wall = await phase(programs, cycles)
        timed = dict(acc)
        if undo is not None:
            undo()
        counters = attrs.asdict(dispatcher.counters) if hasattr(dispatcher, "counters") else {}
        handles.request_shutdown()
        nursery.cancel_scope.cancel()
    out: dict[str, Any] = {"cycles": done, "cpu_seconds": cpu, "wall_seconds": wall, "counters": counters}
    if phases:
        out["step_us_per_cycle"] = timed["step"] / 1e3 / max(done, 1)
        out["route_us_per_cycle"] = timed["route"] / 1e3 / max(done, 1)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.admission_bench", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("--cycles", type=int, default=20000)
    parser.add_argument("--programs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--phases", action="store_true", help="also time the core's steps and the effect routing (thread CPU)"
    )
    args = parser.parse_args()
    for name in ("cycles", "programs", "concurrency", "ranks"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    problem = output_file_problem(str(args.json), "--json") if args.json else None
    if problem:
        parser.error(problem)
    # The daemon's start-up warnings (program_scheduling_reference_calibration) do not apply to this
    # in-memory cluster; without a handler Python printed each as its bare event name.
    configure_logging("error", "kv")
    probe = harness.python_speed_probe_us()
    uptime = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()
    result = run_interruptible(partial(run, args.cycles, args.programs, args.concurrency, args.ranks, args.phases))
    us = result["cpu_seconds"] / max(result["cycles"], 1) * 1e6
    result.update(
        cpu_us_per_cycle=us,
        cycles_per_second=result["cycles"] / result["wall_seconds"],
        ceiling_admissions_per_second=1e6 / us,
        python_speed_probe_us=probe,
        uptime=uptime,
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        command=" ".join(sys.argv),
    )
    print(f"python speed probe: {probe:.1f} us; {uptime}")
    print(
        f"{result['cycles']} submit->admit->complete cycles ({args.programs} Programs, {args.ranks} ranks, "
        f"{args.concurrency} concurrent): {us:.1f} us CPU per cycle, {result['cycles_per_second']:.0f} cycles/s "
        f"-> ceiling about {1e6 / us:.0f} admissions/s per scheduler core"
    )
    if args.phases:
        step_us, route_us = result["step_us_per_cycle"], result["route_us_per_cycle"]
        print(
            f"per cycle, thread CPU: core step {step_us:.1f} us, effect routing {route_us:.1f} us "
            f"(routing / step {route_us / max(step_us, 1e-9):.2f})"
        )
    if args.json is not None:
        write_atomic(args.json, json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, "python -m bench.admission_bench"))
