"""Helpers for the simulator tests: a cluster plus an in-process httpx client (no sockets), SSE decoding."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import trio

from sim.cluster import SimCluster, SimConfig
from sim.transport import SimTransport


@asynccontextmanager
async def sim_client(config: SimConfig | None = None) -> AsyncIterator[tuple[SimCluster, httpx.AsyncClient]]:
    config = config if config is not None else SimConfig(dp_size=2, deterministic=True)
    async with trio.open_nursery() as nursery:
        cluster: SimCluster = await nursery.start(SimCluster(config).run)
        async with httpx.AsyncClient(transport=SimTransport(cluster), base_url="http://sim") as client:
            yield cluster, client
        nursery.cancel_scope.cancel()


def sse_payloads(raw: bytes) -> list[Any]:
    """Decode an SSE body into JSON payloads (``"[DONE]"`` kept as the string)."""
    frames = raw.decode().split("\n\n")
    assert frames[-1] == ""
    out: list[Any] = []
    for frame in frames[:-1]:
        assert frame.startswith("data: "), frame
        data = frame[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out
