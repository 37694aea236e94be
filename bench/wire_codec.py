"""CPU of the data-plane frame codec per Program request (docs/benchmarks.md §10.3.1).

Usage (from the repository root)::

    python -m bench.wire_codec [--repeat 5] [--number 3000]

Encodes and decodes the three frames every Program request sends between a relay process and the
scheduler process (``Ask`` with a parsed Program identity, ``Grant``, ``Finish`` with usage) and
prints, for each, its size and the best-of-``--repeat`` thread CPU per encode and per decode over
``--number`` calls, and the total per request.  Runs in one process with no I/O; the relay does
``encode(Ask)``, ``decode(Grant)``, ``encode(Finish)``, the scheduler the other three.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from actors.core.config import BackendTarget
from actors.core.model import Usage
from actors.messages import Admitted
from bench.harness import python_speed_probe_us
from bench.proxy_overhead import agent_body, program_context
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--number", type=int, default=3000)
    args = parser.parse_args(argv)
    for name in ("repeat", "number"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
