"""Idle upstream connections are closed without waiting for the next request (docs/operations.md
§11.2), over real sockets.  Each case failed before session 31, when a pooled connection expired
only when it was next taken from the pool:

* after a burst, agentd's idle connections stay open past ``keepalive_expiry_seconds``
  (``invariants.upstream_idle_connections`` never went back to 0, the worker kept them open);
* a connection the worker closes while idle stays in CLOSE-WAIT in agentd until the next request;
* the relay processes' pools (docs/operations.md §13) keep theirs as well.

And each failed before session 32:

* ``https://`` workers (httpx's pool): after a burst the idle TLS connections stayed open past the
  expiry, and in CLOSE-WAIT once the worker had closed them, until the next request to it;
* a relay's connections to the scheduler process's internal listener (the routes it forwards)
  stayed open until the next forwarded request, in CLOSE-WAIT after the listener's 75 s keep-alive;
* a relay that drained left its upstream connections and its socket to the scheduler unclosed
  (``ResourceWarning: unclosed <socket...>`` at its exit).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

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


async def test_https_connections_are_counted_in_the_invariants(tmp_path: Path) -> None:
    # the expiry far away and no idle close by the worker: the TLS connection stays open and idle,
    # and the diagnostics' invariants count it (they counted only the plain-HTTP pool)
    async with https_daemon(tmp_path, keepalive_expiry_seconds=3600.0) as (worker, handles, client):
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        doc = await await_diagnostics(client, lambda d: d["invariants"]["upstream_idle_connections"] == 1)
        assert doc["invariants"]["upstream_open_connections"] == 1 and doc["invariants"]["at_rest"], doc
        assert worker.open_connections == 1


def _relay_pids(handles: DaemonHandles) -> list[int]:
    assert handles.data_plane is not None
    pids = [slot.pid for slot in handles.data_plane.slots]
    assert all(pid is not None for pid in pids)
    return [pid for pid in pids if pid is not None]


async def test_relays_close_their_idle_connections_to_the_scheduler_process() -> None:
    async with trio.open_nursery() as nursery:
        worker: FaultWorker = await nursery.start(FaultWorker().run)
        cfg = fault_config([worker.url])
        cfg = attrs.evolve(cfg, server=attrs.evolve(cfg.server, data_plane_processes=2))
        with trio.fail_after(BUDGET_SECONDS):
            handles = await nursery.start(partial(run_daemon, cfg))
        assert handles.data_plane is not None and handles.data_plane.scheduler_url is not None
        internal = urlsplit(handles.data_plane.scheduler_url).port
        assert internal is not None
        relays = _relay_pids(handles)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            # routes the relays forward to the scheduler process; a new client connection per
            # request: the relays take turns accepting them
            for path in ("/scheduling/diagnostics", "/v1/models", "/health", "/metrics") * 2:
                response = await client.get(path, headers={"connection": "close"})
                assert response.status_code == 200, response.text
        # every relay closes its idle connections to the internal listener (whose own keep-alive
        # timeout is 75 s): none left open, none in CLOSE-WAIT
        assert await wait_until(lambda: not any(sockets_to(internal, pid) for pid in relays), WAIT_SECONDS), {
            pid: sockets_to(internal, pid) for pid in relays
        }
        assert await wait_until(lambda: handles.server_state.open_connections == 0, WAIT_SECONDS)
        handles.request_shutdown()
        nursery.cancel_scope.cancel()


async def test_a_drained_daemon_with_relays_leaves_no_socket_unclosed(tmp_path: Path) -> None:
    """``agentd start`` with two relay processes and an ``https://`` worker, Python's
    ``ResourceWarning`` on in every process: after requests (to the worker, and to routes the relays
    forward) and SIGTERM, the daemon exits 0 and no process reports an unclosed socket."""
    cert, key = _certificate(tmp_path)
    async with trio.open_nursery() as nursery:
        worker: FaultWorker = await nursery.start(FaultWorker(server_context(cert, key)).run)
        config = tmp_path / "agentd.toml"
        config.write_text(
            '[server]\nhost = "127.0.0.1"\nport = 0\ndata_plane_processes = 2\nshutdown_grace_seconds = 1.0\n'
            f'[routing]\nworker_urls = ["{worker.url}"]\nhealth_check_interval_seconds = 3600.0\n'
            "keepalive_expiry_seconds = 3600.0\n"  # every connection still open at the drain
            f'[worker_tls]\nca_file = "{cert}"\n[batch_api]\nenabled = false\n'
        )
        env = {**os.environ, "PYTHONWARNINGS": "always::ResourceWarning"}
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "daemon", "start", "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
        )
        assert process.stdout is not None
        output = b""
        try:
            with trio.fail_after(BUDGET_SECONDS):
                while b"event=daemon_listening" not in output:
                    chunk = await process.stdout.receive_some()
                    assert chunk, output.decode(errors="replace")
                    output += chunk
                url = output.split(b"event=daemon_listening url=")[1].split()[0].decode()
                async with httpx.AsyncClient(base_url=url, timeout=BUDGET_SECONDS) as client:
                    for _ in range(4):  # new client connections: both relays serve some
                        chat = await client.post("/v1/chat/completions", json=CHAT, headers={"connection": "close"})
                        assert chat.status_code == 200, chat.text
                        models = await client.get("/v1/models", headers={"connection": "close"})
                        assert models.status_code == 200, models.text
                process.send_signal(signal.SIGTERM)
                async for chunk in process.stdout:
                    output += chunk
                assert await process.wait() == 0, output.decode(errors="replace")
        finally:
            if process.returncode is None:
                process.kill()
        text = output.decode(errors="replace")
        assert text.count("event=relay_stopped") >= 2, text
        assert "ResourceWarning" not in text, text
        nursery.cancel_scope.cancel()
