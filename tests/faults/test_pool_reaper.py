"""daemon.pool_reaper: httpx's transport with its idle connections closed by a reaper task
(docs/operations.md §11.2), over real loopback sockets, plain and TLS (a self-signed certificate
made with ``openssl``; the TLS cases skip when it is not installed).

httpx's own pool closed an expired connection, or one the server had closed (left in CLOSE-WAIT),
only when it was next used.  Real time: every wait is bounded by a budget a correct reaper never
nears, and the one timing assertion is a lower bound (a connection is not closed before its
expiry), which load cannot break.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio
from fault_env import open_fds, wait_until
from fault_worker import Act, FaultWorker, self_signed, server_context

from daemon.pool_reaper import ReapedTransport
from tests.http.test_h1client import sockets_to

BUDGET_SECONDS = 60.0  # bounds every wait: a correct reaper takes a fraction of a second
CHAT = {"model": "fault-model", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    made = self_signed(tmp_path_factory.mktemp("tls"))
    if made is None:
        pytest.skip("openssl is not installed: no certificate for the TLS worker")
    return made


@pytest.fixture(params=["http", "https"])
def scheme(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@asynccontextmanager
async def reaped(
    scheme: str, request: pytest.FixtureRequest, expiry: float
) -> AsyncIterator[tuple[FaultWorker, ReapedTransport, httpx.AsyncClient]]:
    """A worker (TLS for ``https``), a client on a :class:`ReapedTransport` whose reaper runs."""
    server_ssl = client_ssl = None
    if scheme == "https":
        cert, key = request.getfixturevalue("certificate")
        server_ssl = server_context(cert, key)
        client_ssl = ssl.create_default_context(cafile=str(cert))
    async with trio.open_nursery() as nursery:
        worker: FaultWorker = await nursery.start(FaultWorker(server_ssl).run)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=expiry)
        transport = ReapedTransport(limits=limits, verify=client_ssl if client_ssl is not None else True)
        async with httpx.AsyncClient(transport=transport, base_url=worker.url, timeout=BUDGET_SECONDS) as client:
            nursery.start_soon(transport.run_reaper)
            yield worker, transport, client
        nursery.cancel_scope.cancel()


async def test_idle_connections_close_at_their_expiry_after_a_burst(
    scheme: str, request: pytest.FixtureRequest
) -> None:
    expiry = 0.5
    async with reaped(scheme, request, expiry) as (worker, transport, client):
        # streams of 8 events 0.2 s apart: the burst's requests overlap, each ends 1.4 s or more
        # after it started
        worker.default = Act(delay=0.2, events=5)

        async def one() -> None:
            response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
            assert response.status_code == 200

        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(one)
        opened = worker.connections
        assert opened >= 2
        # without a request, every connection closes (agentd's side: nothing left, not CLOSE-WAIT)
        assert await wait_until(lambda: worker.open_connections == 0), sockets_to(worker.port)
        assert await wait_until(lambda: not sockets_to(worker.port)), sockets_to(worker.port)
        assert transport.open_connections() == 0 and transport.reaped_count == opened
        # ... and none before its expiry (a lower bound: a loaded machine only makes it later)
        assert min(worker.closed_at) >= started + 1.4 + expiry, (worker.closed_at, started)
        # it woke at expiries only, never per response or per event (30 events were read)
        assert transport.reaper_wakeups <= opened


async def test_a_connection_the_server_closes_while_idle_is_closed_at_once(
    scheme: str, request: pytest.FixtureRequest
) -> None:
    # the expiry far away: only the server's close (uvicorn's idle timeout, here 0.2 s) can end it
    async with reaped(scheme, request, 3600.0) as (worker, transport, client):
        worker.idle_timeout = 0.2
        response = await client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 200
        assert await wait_until(lambda: worker.open_connections == 0)  # the server closed it
        assert await wait_until(lambda: not sockets_to(worker.port)), sockets_to(worker.port)  # no CLOSE-WAIT
        assert transport.open_connections() == 0 and transport.reaped_count == 1
        assert transport.reaper_wakeups == 1  # the hang-up; the expiry is an hour away
        # the pool then opens a new connection for the next request
        response = await client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 200 and worker.connections == 2


async def test_a_busy_connection_is_left_to_its_request(scheme: str, request: pytest.FixtureRequest) -> None:
    # a stream three times as long as the expiry, on a connection reused from an earlier request
    async with reaped(scheme, request, 0.3) as (worker, transport, client):
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        worker.script.append(Act(events=9, delay=0.1))
        async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as response:
            body = b"".join([chunk async for chunk in response.aiter_raw()])
        assert body.count(b"data: ") == 12 and body.endswith(b"data: [DONE]\n\n")
        assert worker.connections == 1  # the same connection, never closed under the stream
        assert await wait_until(lambda: worker.open_connections == 0)  # then it expires


async def test_closing_the_transport_ends_its_reaper_and_leaves_no_descriptor(
    scheme: str, request: pytest.FixtureRequest
) -> None:
    server_ssl = client_ssl = None
    if scheme == "https":
        cert, key = request.getfixturevalue("certificate")
        server_ssl, client_ssl = server_context(cert, key), ssl.create_default_context(cafile=str(cert))
    async with trio.open_nursery() as outer:
        worker: FaultWorker = await outer.start(FaultWorker(server_ssl).run)
        baseline = open_fds()
        with trio.fail_after(BUDGET_SECONDS):
            async with trio.open_nursery() as nursery:
                limits = httpx.Limits(keepalive_expiry=3600.0)
                transport = ReapedTransport(limits=limits, verify=client_ssl if client_ssl is not None else True)
                async with httpx.AsyncClient(transport=transport, base_url=worker.url) as client:
                    nursery.start_soon(transport.run_reaper)
                    assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
                    assert transport.idle_connections() == 1
                # the client closed: the reaper returned by itself (the nursery is not cancelled)
        assert transport.open_connections() == 0
        assert await wait_until(lambda: worker.open_connections == 0)
        assert open_fds() == baseline  # the connection and the epoll set
        outer.cancel_scope.cancel()


async def test_the_reaper_runs_once_per_transport() -> None:
    transport = ReapedTransport(limits=httpx.Limits(keepalive_expiry=1.0))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(transport.run_reaper)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(RuntimeError, match="already running"):
            await transport.run_reaper()
        await transport.aclose()
    await transport.run_reaper()  # closed: returns at once
