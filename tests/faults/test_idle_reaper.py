"""Idle upstream connections are closed without waiting for the next request (docs/operations.md
§11.2), over real sockets.  Each case failed before session 31, when a pooled connection expired
only when it was next taken from the pool:

* after a burst, agentd's idle connections stay open past ``keepalive_expiry_seconds``
  (``invariants.upstream_idle_connections`` never went back to 0, the worker kept them open);
* a connection the worker closes while idle stays in CLOSE-WAIT in agentd until the next request;
* the relay processes' pools (docs/operations.md §13) keep theirs as well.

And each failed before session 32:

* ``https://`` workers (httpx's pool): after a burst the idle TLS connections stayed open past the
  expiry, and in CLOSE-WAIT once the worker had closed them, until the next request to it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import attrs
import httpx
import pytest
import trio
from fault_env import BUDGET_SECONDS, CHAT, await_diagnostics, fault_config, fault_env, wait_until
from fault_worker import Act, FaultWorker, self_signed, server_context

from daemon.config import WorkerTlsConfig
from daemon.handles import DaemonHandles
from daemon.supervisor import run_daemon
from tests.http.test_h1client import close_wait_sockets, sockets_to

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


def _certificate(directory: Path) -> tuple[Path, Path]:
    made = self_signed(directory)
    if made is None:
        pytest.skip("openssl is not installed: no certificate for the TLS worker")
    return made


@asynccontextmanager
async def https_daemon(
    directory: Path, **routing: float
) -> AsyncIterator[tuple[FaultWorker, DaemonHandles, httpx.AsyncClient]]:
    """A TLS worker (a self-signed certificate, agentd's ``[worker_tls] ca_file``), agentd in front."""
    cert, key = _certificate(directory)
    async with trio.open_nursery() as nursery:
        worker: FaultWorker = await nursery.start(FaultWorker(server_context(cert, key)).run)
        cfg = attrs.evolve(fault_config([worker.url], **routing), worker_tls=WorkerTlsConfig(ca_file=str(cert)))
        with trio.fail_after(BUDGET_SECONDS):
            handles = await nursery.start(partial(run_daemon, cfg))
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            yield worker, handles, client
        handles.request_shutdown()
        nursery.cancel_scope.cancel()


async def test_https_idle_connections_close_at_the_expiry_after_a_burst(tmp_path: Path) -> None:
    async with https_daemon(tmp_path, keepalive_expiry_seconds=0.5) as (worker, handles, client):
        worker.default = Act(delay=0.1, events=3)  # streams: the burst's requests overlap
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(partial(client.post, "/v1/chat/completions", json={**CHAT, "stream": True}))
        assert len(worker.generation_requests()) == 8 and worker.connections >= 2
        # no request after the burst: agentd closes every connection (nothing left, not CLOSE-WAIT)
        assert await wait_until(lambda: worker.open_connections == 0, WAIT_SECONDS), sockets_to(worker.port)
        assert await wait_until(lambda: not sockets_to(worker.port), WAIT_SECONDS), sockets_to(worker.port)
        tls = handles.engine.transport.tls  # type: ignore[union-attr]
        assert tls.open_connections() == 0 and tls.reaped_count >= 2


async def test_https_connection_the_worker_closes_while_idle_leaves_no_close_wait(tmp_path: Path) -> None:
    # the expiry far away: only the worker's close (uvicorn's idle timeout, here 0.2 s) ends it
    async with https_daemon(tmp_path, keepalive_expiry_seconds=3600.0) as (worker, handles, client):
        worker.idle_timeout = 0.2
        response = await client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 200
        assert await wait_until(lambda: worker.open_connections == 0, WAIT_SECONDS)  # the worker closed it
        assert await wait_until(lambda: not sockets_to(worker.port), WAIT_SECONDS), sockets_to(worker.port)
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200  # a new connection
