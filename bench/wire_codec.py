"""CPU of the data-plane frame codec per Program request (docs/benchmarks.md §10.3.1).

Usage (from the repository root)::

    python -m bench.wire_codec [--repeat 5] [--number 3000] [--link-requests 3000]

Encodes and decodes the three frames every Program request sends between a relay process and the
scheduler process (``Ask`` with a parsed Program identity, ``Grant``, ``Finish`` with usage) and
prints, for each, its size and the best-of-``--repeat`` thread CPU per encode and per decode over
``--number`` calls, and the total per request.  Runs in one process with no I/O; the relay does
``encode(Ask)``, ``decode(Grant)``, ``encode(Finish)``, the scheduler the other three.

Then the link itself (:class:`~daemon.dataplane.link.Link`, docs/benchmarks.md §10.3.2): a relay
link and a scheduler link on the two ends of a Unix socket pair in this one process, the
scheduler's reader answering every ``Ask`` with a ``Grant`` at once, and ``C`` client tasks that
each loop ``Ask`` -> wait for the ``Grant`` -> ``Finish`` (C = 1 and 32), ``--link-requests``
requests each: the best-of-``--repeat`` CPU per request (codec, link tasks, system calls, trio's
run loop) and the trio task steps per request (counted in a separate run with an instrument;
fewer steps = fewer run-loop turns between the frames).  No scheduler actor runs: what is measured
is the transport.  A checkout's own code runs from its directory, so the same command in a
worktree of ``main`` gives the comparison.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import trio
import trio.testing

from actors.core.config import BackendTarget
from actors.core.model import Usage
from actors.messages import Admitted
from bench.harness import python_speed_probe_us
from bench.interrupt import run_interruptible, run_main
from bench.proxy_overhead import agent_body, program_context
from daemon.dataplane.link import Link
from daemon.dataplane.wire import HEADER, Ask, Finish, Grant, WireRequest, decode, encode
from daemon.dispatch import Outcome
from daemon.http.identity import parse_identity
from daemon.http.requests import PromptSize


def frames() -> dict[str, Any]:
    identity = parse_identity(json.loads(agent_body(1, program_context(3))), {})
    request = WireRequest(
        "agentd-7f3a9c", "chat", "fake-model", False, PromptSize(900), "user:hello " * 5, identity, max_tokens=16
    )
    target = BackendTarget("http://127.0.0.1:9999", 0, "http://127.0.0.1:9999@0", 0)
    return {
        "Ask": Ask(7, "program", request),
        "Grant": Grant(7, Admitted("agentd-7f3a9c", target, "3f1c0d2e9a8b7c6d", 0.0001)),
        "Finish": Finish(7, Outcome(True, Usage(12, 0, 2), None, 0.001, 0.002, "stop")),
    }


def best_us(fn: Callable[[], object], repeat: int, number: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.thread_time_ns()
        for _ in range(number):
            fn()
        best = min(best, (time.thread_time_ns() - t0) / number / 1000)
    return best


class _Steps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


async def _link_run(requests: int, clients: int, count_steps: bool) -> tuple[float, int]:
    """(CPU seconds, task steps) of ``clients`` loops of ``requests`` Ask/Grant/Finish each."""
    import socket

    sample = frames()
    ask, grant, finish = sample["Ask"], sample["Grant"], sample["Finish"]
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    relay = Link(trio.SocketStream(trio.socket.from_stdlib_socket(left)))
    scheduler = Link(trio.SocketStream(trio.socket.from_stdlib_socket(right)))
    waiting: dict[int, trio.Event] = {}
    finished = 0
    done = trio.Event()  # every Finish reached the scheduler's reader

    async def scheduler_reader() -> None:
        nonlocal finished
        async for frame in scheduler.frames():
            if type(frame) is Ask:
                scheduler.send(Grant(frame.lease, grant.admitted))
            elif type(frame) is Finish:
                finished += 1
                if finished == requests * clients:
                    done.set()

    async def relay_reader() -> None:
        async for frame in relay.frames():
            waiting.pop(frame.lease).set()

    async def client(first: int) -> None:
        for i in range(requests):
            number = first + i
            event = waiting[number] = trio.Event()
            relay.send(Ask(number, "program", ask.request))
            await event.wait()
            relay.send(Finish(number, finish.outcome))

    steps = _Steps()
    async with trio.open_nursery() as nursery:
        for task in (relay.run_writer, scheduler.run_writer, scheduler_reader, relay_reader):
            nursery.start_soon(task)
        await trio.testing.wait_all_tasks_blocked()
        if count_steps:
            trio.lowlevel.add_instrument(steps)
        t0 = time.process_time()
        async with trio.open_nursery() as loops:
            for c in range(clients):
                loops.start_soon(client, 1 + c * requests)
        await done.wait()
        cpu = time.process_time() - t0
        if count_steps:
            trio.lowlevel.remove_instrument(steps)
        nursery.cancel_scope.cancel()
    left.close()
    right.close()
    return cpu, steps.steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--number", type=int, default=3000)
    parser.add_argument("--link-requests", type=int, default=3000, help="requests per client in the link runs")
    args = parser.parse_args(argv)
    for name in ("repeat", "number", "link_requests"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    print(f"python speed probe: {python_speed_probe_us():.1f} us; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("| frame | bytes | encode | decode |\n| --- | --- | --- | --- |")
    total = 0.0
    for name, frame in frames().items():
        data = encode(frame)
        payload = data[HEADER.size :]
        assert decode(payload) == frame
        enc = best_us(partial(encode, frame), args.repeat, args.number)
        dec = best_us(partial(decode, payload), args.repeat, args.number)
        total += enc + dec
        print(f"| {name} | {len(data)} | {enc:.1f} us | {dec:.1f} us |")
    print(f"encode + decode of the three frames of one Program request: {total:.1f} us of CPU")
    print("\n| link, clients | CPU per request (best of repeat) | task steps per request |\n| --- | --- | --- |")
    for clients in (1, 32):
        requests = max(1, args.link_requests // clients) if clients > 1 else args.link_requests
        best = min(run_interruptible(partial(_link_run, requests, clients, False))[0] for _ in range(args.repeat))
        _, steps = run_interruptible(partial(_link_run, requests, clients, True))
        n = requests * clients
        print(f"| c={clients} | {best / n * 1e6:.1f} us | {steps / n:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m bench.wire_codec"))
