"""``agentd sim-backend``: a standalone simulated vLLM server (OpenAI API, vLLM metrics, DP ranks).

Prints ``agentd sim-backend listening on http://H:P`` once the socket accepts and stops cleanly on
SIGINT/SIGTERM.  Bad flag values exit 2 with a message naming the flag (argparse), and so does a
port that cannot be opened (in use, not permitted: ``--port``; a host that does not resolve or is not
a local address: ``--host``).
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
from functools import partial
from typing import Any

import attrs
import trio

from actors.core.config import DecodeThroughputModel, PrefillCostModel, problems
from daemon.commands.argtypes import finite_at_least, int_at_least, non_empty, non_negative_float, port, positive_float
from daemon.commands.start import listen_error
from daemon.http.serve import serve_http
from sim.api import wall_clock_epoch
from sim.cluster import SimCluster, SimConfig
from sim.config import MIN_TIME_SCALE, SCHEDULING_POLICIES, SimServerShape, shape_of
from sim.server import create_app
from sim.stats import CostModel

SHUTDOWN_GRACE_SECONDS = 5.0

NAME = "sim-backend"
HELP = "Run a simulated vLLM server (KV cache, prefix caching, batching and timing models)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", type=non_empty, help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", default=8000, type=port, help="bind port, 0 = any free port (default 8000)")
    parser.add_argument("--dp-size", default=1, type=int_at_least(1), help="data-parallel ranks (default 1)")
    parser.add_argument(
        "--num-gpu-blocks", default=4096, type=int_at_least(2), help="KV blocks per rank (default 4096)"
    )
    parser.add_argument("--block-size", default=16, type=int_at_least(1), help="tokens per KV block (default 16)")
    parser.add_argument("--max-num-seqs", default=256, type=int_at_least(1), help="max running requests per rank")
    parser.add_argument("--max-num-batched-tokens", default=8192, type=int_at_least(1), help="token budget per step")
    parser.add_argument(
        "--time-scale",
        default=1.0,
        type=finite_at_least(MIN_TIME_SCALE),
        help=f"divide every simulated duration by this factor (default 1.0 = real time; >= {MIN_TIME_SCALE:g})",
    )
    parser.add_argument("--model", default="agentd-sim", type=non_empty, help="served model name")
    parser.add_argument(
        "--scheduling-policy",
        default="fcfs",
        choices=SCHEDULING_POLICIES,
        help="waiting-queue policy of every rank (docs/simulator.md §1; default fcfs)",
    )
    parser.add_argument(
        "--strict-xargs", action="store_true", help="reject non-scalar vllm_xargs values with 400, as stock vLLM does"
    )
    parser.add_argument("--seed", default=0, type=int_at_least(0), help="seed of generated text and hashes")
    # The cost model (docs/simulator.md §1, "Timing"): the coefficients of [program_scheduling]'s two
    # cost-model sections under their field names; defaults are the seed's reference calibration.
    for section, model in (
        ("prefill_cost_model", PrefillCostModel()),
        ("decode_throughput_model", DecodeThroughputModel()),
    ):
        for a in attrs.fields(type(model)):
            if a.name == "decode_throughput_alpha":
                parser.add_argument(
                    "--decode-throughput-alpha",
                    default=None,
                    type=alpha_share,
                    metavar="A",
                    help="simulate prefill_cost_model.decode_throughput_alpha: a decode batch keeps the share A "
                    "of its throughput while a prefill runs (default: not simulated, additive step model)",
                )
                continue
            default = getattr(model, a.name)
            parser.add_argument(
                "--" + a.name.replace("_", "-"),
                default=default,
                type=positive_float if a.name == "fixed_step_seconds" else non_negative_float,
                metavar="S",
                help=f"{section}.{a.name} of the simulated engine (default {default:.6g})",
            )


def alpha_share(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be a number within (0, 1], got {text!r}")
    return value


def config_from_args(args: argparse.Namespace) -> SimConfig:
    # The flags carry exactly the shape's field names (and defaults, but one DP rank: tests/sim/test_shape.py).
    shape = shape_of(args)
    found = problems(shape)
    if found:
        # each flag checked its own value; what is left are the rules across flags (what one process
        # can hold), named by their flags
        raise ValueError("; ".join(re.sub(r"\b[a-z]+(?:_[a-z0-9]+)+\b", _flag, line) for line in found))
    return SimConfig.from_shape(shape, strict_xargs=args.strict_xargs, cost=cost_model_from_args(args))


def _flag(field: re.Match[str]) -> str:
    name = field.group(0)
    return "--" + name.replace("_", "-") if name in attrs.fields_dict(SimServerShape) else name


def cost_model_from_args(args: argparse.Namespace) -> CostModel:
    """The engine's cost model from the coefficient flags (each named after its field)."""

    def build(cls: Any) -> Any:
        fields = [a.name for a in attrs.fields(cls) if a.name != "decode_throughput_alpha"]
        return cls(**{name: getattr(args, name) for name in fields if hasattr(args, name)})

    prefill = build(PrefillCostModel)
    if args.decode_throughput_alpha is None:
        return CostModel(prefill=prefill, decode=build(DecodeThroughputModel))
    prefill = attrs.evolve(prefill, decode_throughput_alpha=args.decode_throughput_alpha)
    return CostModel(prefill=prefill, decode=build(DecodeThroughputModel), simulate_alpha=True)


async def serve_until_signal(config: SimConfig, host: str, port: int) -> None:
    shutdown = trio.Event()

    async def trigger() -> None:
        await shutdown.wait()

    async with trio.open_nursery() as nursery:
        cluster: SimCluster = await nursery.start(SimCluster(config).run)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as server_nursery:
                bound: str = await server_nursery.start(
                    partial(serve_http, listen_field="--port"),
                    create_app(cluster, created_epoch=wall_clock_epoch()),
                    host,
                    port,
                    SHUTDOWN_GRACE_SECONDS,
                    trigger,
                )
                print(f"agentd sim-backend listening on {bound}", flush=True)
                async for _signum in signals:
                    shutdown.set()
                    break
        nursery.cancel_scope.cancel()


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"agentd sim-backend: {exc}", file=sys.stderr)
        return 2
    try:
        trio.run(serve_until_signal, config, args.host, args.port)
    except BaseException as exc:
        # the port is in use, not permitted or not local: one line naming --port, exit 2 (as agentd start)
        failed = listen_error(exc)
        if failed is None:
            raise
        for line in failed.lines:
            print(f"agentd sim-backend: {line}", file=sys.stderr)
        return 2
    return 0
