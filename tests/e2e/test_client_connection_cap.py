"""``limits.max_connections_per_client`` over real sockets (docs/operations.md §10.3).

One client address holding the cap's worth of connections gets a JSON 429
``too_many_client_connections`` with ``Retry-After`` for the next one, while another address is
served; a closed connection frees its place.  Without the cap (the default) one client could hold
every one of ``max_connections`` (an agent framework leaking a connection per request locks every
other client out).  Behind relay processes the scheduler process's internal listener, whose
connections all come from the relays on 127.0.0.1, is never capped per client."""

from __future__ import annotations

import json
import random
import sys
from functools import partial
from pathlib import Path

import attrs
import httpx
import trio
from native_fakes import FakeWorker, make_config
from test_edge_limits import BUDGET_SECONDS, host_port, wait_until

sys.path.append(str(Path(__file__).resolve().parents[1] / "faults"))

from fault_worker import FaultWorker

from daemon.config import AgentdConfig, BatchApiConfig, LimitsConfig, RoutingConfig, ServerConfig
from daemon.handles import DaemonHandles
from daemon.supervisor import run_daemon


async def _start(nursery: trio.Nursery, worker: FakeWorker, processes: int = 1, **limits: object) -> DaemonHandles:
    cfg = make_config(worker.worker_urls, grace_seconds=2.0)
    cfg = attrs.evolve(
        cfg,
        limits=LimitsConfig(**limits),  # type: ignore[arg-type]
        server=attrs.evolve(cfg.server, data_plane_processes=processes),
    )
    return await nursery.start(partial(run_daemon, cfg, transport_factory=worker.transport, rng=random.Random(3)))


async def _get(host: str, port: int, source: str, path: bytes = b"/health") -> bytes:
    """A GET of ``path`` from the client address ``source`` on a connection of its own: the answer."""
    stream = await trio.open_tcp_stream(host, port, local_address=source)
    async with stream:
        await stream.send_all(b"GET %b HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n" % path)
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data


async def test_one_client_over_its_cap_gets_a_json_429_and_others_are_served(fake_worker: FakeWorker) -> None:
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await _start(nursery, fake_worker, max_connections=10, max_connections_per_client=2)
            state = handles.server_state
            host, port = host_port(handles)
            held = [await trio.open_tcp_stream(host, port, local_address="127.0.0.1") for _ in range(2)]
            await wait_until(lambda: state.open_connections == 2)
            assert state.per_client == {"127.0.0.1": 2}

            head, _, body = (await _get(host, port, "127.0.0.1")).partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 429"), head
            assert b"retry-after: 1" in head and b"connection: close" in head
            error = json.loads(body)["error"]
            assert (error["code"], error["type"]) == ("too_many_client_connections", "rate_limit_error")
            assert "limits.max_connections_per_client" in error["message"]

            # another address is served while the first holds its two
            assert (await _get(host, port, "127.0.0.2")).startswith(b"HTTP/1.1 200")
            # a closed connection frees its place
            await held.pop().aclose()
            await wait_until(lambda: state.per_client == {"127.0.0.1": 1})
            assert (await _get(host, port, "127.0.0.1")).startswith(b"HTTP/1.1 200")
            for stream in held:
                await stream.aclose()
            await wait_until(lambda: state.open_connections == 0)
            assert state.per_client == {}
            assert (state.rejected_client_connections, state.rejected_connections) == (1, 0)

            async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
                doc = (await client.get("/scheduling/diagnostics")).json()
                connections = doc["proxy"]["connections"]
                assert (connections["max_per_client"], connections["rejected_per_client_count"]) == (2, 1)
                metrics = (await client.get("/metrics")).text
                assert "agentd_client_connections_rejected_total 1.0" in metrics
            handles.request_shutdown()


async def test_relays_cap_clients_but_not_their_own_forwards(tmp_path: Path) -> None:
    """Two relays and a cap of 1: eight clients' forwarded routes (``/v1/models`` is served by the
    scheduler process) all answered, although both relays forward over connections from 127.0.0.1."""
    cfg = AgentdConfig(
        server=ServerConfig(host="127.0.0.1", port=0, shutdown_grace_seconds=1.0, data_plane_processes=2),
        limits=LimitsConfig(max_connections_per_client=1),
        batch_api=BatchApiConfig(database_path=str(tmp_path / "batches.sqlite3")),
    )
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            worker: FaultWorker = await nursery.start(FaultWorker().run)
            cfg = attrs.evolve(
                cfg, routing=RoutingConfig(worker_urls=(worker.url,), health_check_interval_seconds=3600.0)
            )
            handles = await nursery.start(run_daemon, cfg)
            host, port = host_port(handles)
            statuses: list[bytes] = []

            async def ask(source: str) -> None:
                data = await _get(host, port, source, b"/v1/models")
                statuses.append(data.split(b"\r\n", 1)[0])

            async with trio.open_nursery() as clients:
                for i in range(8):
                    clients.start_soon(ask, f"127.0.0.{10 + i}")
            assert statuses == [b"HTTP/1.1 200 OK"] * 8, statuses
            assert handles.server_state.rejected_client_connections == 0
            nursery.cancel_scope.cancel()
