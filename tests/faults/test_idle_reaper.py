"""Idle upstream connections are closed without waiting for the next request (docs/operations.md
§11.2), over real sockets.  Each case failed before session 31, when a pooled connection expired
only when it was next taken from the pool:

* after a burst, agentd's idle connections stay open past ``keepalive_expiry_seconds``
  (``invariants.upstream_idle_connections`` never went back to 0, the worker kept them open);
* a connection the worker closes while idle stays in CLOSE-WAIT in agentd until the next request;
* the relay processes' pools (docs/operations.md §13) keep theirs as well.
"""

from __future__ import annotations

from functools import partial

import attrs
import httpx
import trio
from fault_env import BUDGET_SECONDS, CHAT, await_diagnostics, fault_config, fault_env, wait_until
from fault_worker import FaultWorker

from daemon.supervisor import run_daemon
from tests.http.test_h1client import close_wait_sockets

# a case that fails waits this long (the behaviour takes a fraction of a second when it is right)
WAIT_SECONDS = 60.0


async def test_idle_connections_close_at_the_expiry_after_a_burst() -> None:
    async with fault_env(1, keepalive_expiry_seconds=0.5) as env:
        [worker] = env.workers
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(partial(env.chat))
        assert worker.connections >= 1 and len(worker.generation_requests()) == 8
        doc = await await_diagnostics(
            env.client,
            lambda d: (
                d["invariants"]["upstream_idle_connections"] == 0 and d["invariants"]["upstream_open_connections"] == 0
            ),
            WAIT_SECONDS,
        )
        assert doc["invariants"]["at_rest"], doc
        assert await wait_until(lambda: worker.open_connections == 0, WAIT_SECONDS)  # agentd closed them
        assert env.pool.reaped_count >= 1
        await env.check_clean()


async def test_a_connection_the_worker_closes_while_idle_leaves_no_close_wait() -> None:
    # the expiry far away: only the worker's close (uvicorn's idle timeout, here 0.2 s) ends it
    async with fault_env(1, keepalive_expiry_seconds=3600.0) as env:
        [worker] = env.workers
        worker.idle_timeout = 0.2
        response = await env.chat()
        assert response.status_code == 200
        assert await wait_until(lambda: worker.open_connections == 0, WAIT_SECONDS)  # the worker closed it
        assert await wait_until(lambda: env.pool.open_connections == 0, WAIT_SECONDS), env.invariants()
        assert close_wait_sockets(worker.port) == 0
        assert env.invariants()["upstream_idle_connections"] == 0
        await env.check_clean()


async def test_relay_processes_close_their_idle_connections() -> None:
    async with trio.open_nursery() as nursery:
        worker: FaultWorker = await nursery.start(FaultWorker().run)
        cfg = fault_config([worker.url], keepalive_expiry_seconds=0.5)
        cfg = attrs.evolve(cfg, server=attrs.evolve(cfg.server, data_plane_processes=2))
        with trio.fail_after(BUDGET_SECONDS):
            handles = await nursery.start(partial(run_daemon, cfg))
        assert handles.data_plane is not None
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            # a new client connection per request: the relays take turns accepting them
            for _ in range(6):
                response = await client.post("/v1/chat/completions", json=CHAT, headers={"connection": "close"})
                assert response.status_code == 200, response.text
        assert len(worker.generation_requests()) == 6
        # every process's pool (the relays' and the scheduler's) closed its connections to the worker
        assert await wait_until(lambda: worker.open_connections == 0, WAIT_SECONDS), worker.open_connections
        handles.request_shutdown()
        nursery.cancel_scope.cancel()
