"""Helpers for the rank-actor tests: targets, a worker's ``/metrics`` text, and ``observing``, which
runs a RankRegistry's actors and pacer against an httpx.MockTransport (so no real I/O) and records,
with its virtual time, every message they send to the scheduler."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

import attrs
import httpx
import trio

from actors.core.config import BackendTarget, ProgramSchedulingConfig
from actors.rank_registry import RankRegistry, run_rank_registry

W0 = "http://worker-0:8000"
W1 = "http://worker-1:8000"

Handler = Callable[[httpx.Request], httpx.Response | Awaitable[httpx.Response]]


def target(url: str, rank: int, index: int) -> BackendTarget:
    return BackendTarget(worker_url=url, dp_rank=rank, target_id=f"{url}@{rank}", index=index)


def vllm_metrics(kv: Sequence[float] = (0.25, 0.25), *, waiting: Sequence[int] = ()) -> str:
    """One worker's ``/metrics``: an engine per ``kv`` value; engine ``e`` runs ``e + 1`` requests
    and has ``waiting[e]`` waiting (0 past the end of ``waiting``)."""
    return "".join(
        f'vllm:kv_cache_usage_perc{{engine="{e}"}} {usage}\n'
        f'vllm:num_requests_running{{engine="{e}"}} {e + 1}\n'
        f'vllm:num_requests_waiting{{engine="{e}"}} {waiting[e] if e < len(waiting) else 0}\n'
        for e, usage in enumerate(kv)
    )


async def drain(
    recv: trio.MemoryReceiveChannel[object], out: list[tuple[float, object]], hold_first: float = 0.0
) -> None:
    """Append ``(time, message)`` to ``out``; busy for ``hold_first`` seconds after the first one."""
    async for msg in recv:
        out.append((trio.current_time(), msg))
        if hold_first and len(out) == 1:
            await trio.sleep(hold_first)


@attrs.frozen
class Observed:
    """A running registry: ``got`` fills with ``(time, message)`` as the registry sends; ``send`` is
    the sink's send side the registry was given; ``t0`` is the virtual time the registry started."""

    registry: RankRegistry
    send: trio.MemorySendChannel[object]
    got: list[tuple[float, object]]
    t0: float


@asynccontextmanager
async def observing(
    targets: tuple[BackendTarget, ...],
    handler: Handler,
    *,
    interval: float = 1.0,
    sink_size: int = 100,
    hold_first: float = 0.0,
) -> AsyncIterator[Observed]:
    """Run ``RankRegistry(targets)`` (pacer on an ``interval`` grid) with ``handler`` answering every
    scrape; its messages go to a sink of ``sink_size`` that ``drain`` empties. Cancelled on exit."""
    send, recv = trio.open_memory_channel[object](sink_size)  # test sink
    got: list[tuple[float, object]] = []
    registry = RankRegistry(targets)
    cfg = ProgramSchedulingConfig(metrics_interval_seconds=interval)
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client, trio.open_nursery() as nursery:
        nursery.start_soon(drain, recv, got, hold_first)
        t0 = trio.current_time()
        await nursery.start(run_rank_registry, cfg, client, registry, send)
        try:
            yield Observed(registry=registry, send=send, got=got, t0=t0)
        finally:
            nursery.cancel_scope.cancel()
