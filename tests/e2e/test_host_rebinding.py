"""DNS rebinding and cross-site requests over real sockets (docs/operations.md §10.7): every
loopback listener of a daemon without keys answers only IP addresses, localhost names and
``server.allowed_hosts``.

Before this check, ``Host: rebound.example`` (what a browser sends for a page whose name an attacker
re-pointed at 127.0.0.1) was served on every route: completions, ``/v1/files``, diagnostics and
``/metrics`` (session-44 walk).  Each listener is checked: the public one with one process and with
two relay processes (where the relays serve the proxy routes and forward the rest), the admin
listener and the Prometheus listener; the probes pass whatever they name.  A cross-site page's
blind POST (its ``Origin`` names another site) is refused the same way before it reaches a worker.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

sys.path.append(str(Path(__file__).resolve().parents[1] / "faults"))

from fault_env import BUDGET_SECONDS
from fault_worker import Act, FaultWorker

from actors.core.config import ProgramSchedulingConfig
from daemon.config import (
    AdminConfig,
    AgentdConfig,
    BatchApiConfig,
    PrometheusConfig,
    RoutingConfig,
    ServerConfig,
)
from daemon.supervisor import run_daemon

CHAT = {"model": "fault-model", "messages": [{"role": "user", "content": "hi"}]}
REBOUND = "rebound.example"


def _config(worker_url: str, processes: int, allowed: tuple[str, ...], tmp: Path) -> AgentdConfig:
    return AgentdConfig(
        server=ServerConfig(
            host="127.0.0.1", port=0, shutdown_grace_seconds=1.0, data_plane_processes=processes, allowed_hosts=allowed
        ),
        admin=AdminConfig(host="127.0.0.1", port=0),
        prometheus=PrometheusConfig(host="127.0.0.1", port=0),
        routing=RoutingConfig(worker_urls=(worker_url,), health_check_interval_seconds=3600.0, policy="round_robin"),
        batch_api=BatchApiConfig(database_path=str(tmp / "batches.sqlite3")),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(token_capacity_per_dp_rank=1_000_000),
    )


def json_bytes(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def _get(client: httpx.AsyncClient, url: str, host: str) -> httpx.Response:
    return await client.get(url, headers={"host": host})


def _refused(answer: httpx.Response, listener: str) -> None:
    assert answer.status_code == 403, answer.text
    error: dict[str, Any] = answer.json()["error"]
    assert error["code"] == "host_not_allowed" and error["param"] == "host"
    assert error["type"] == "invalid_request_error"
    assert REBOUND in error["message"] and listener in error["message"]
    assert "server.allowed_hosts" in error["message"]


@pytest.mark.parametrize("processes", [1, 2])
async def test_loopback_listeners_refuse_a_rebound_name(tmp_path: Path, processes: int) -> None:
    async with trio.open_nursery() as nursery:
        worker: FaultWorker = await nursery.start(FaultWorker().run)
        worker.default = Act(events=2)
        handles = await nursery.start(run_daemon, _config(worker.url, processes, (), tmp_path))
        public, admin, metrics = handles.http_url, handles.admin_url, handles.metrics_url
        port = _port(public)
        async with httpx.AsyncClient(timeout=BUDGET_SECONDS) as client:
            answer = await client.post(
                f"{public}/v1/chat/completions", json=CHAT, headers={"host": f"{REBOUND}:{port}"}
            )
            _refused(answer, "server.host '127.0.0.1'")
            assert worker.generation_requests() == []  # nothing reached the worker
            # a route the relays forward to the scheduler process, and the Batch API's files
            _refused(await _get(client, f"{public}/v1/models", f"{REBOUND}:{port}"), "server.host")
            _refused(await _get(client, f"{public}/v1/files", REBOUND), "server.host")
            _refused(await _get(client, f"{admin}/scheduling/diagnostics", REBOUND), "admin.host '127.0.0.1'")
            _refused(await _get(client, f"{metrics}/metrics", REBOUND), "prometheus.host '127.0.0.1'")

            # a page of another site sends its POST blind (a text/plain body needs no CORS preflight):
            # refused by its Origin before it reaches a worker
            answer = await client.post(
                f"{public}/v1/chat/completions",
                content=json_bytes(CHAT),
                headers={"origin": "https://evil.example", "content-type": "text/plain"},
            )
            assert answer.status_code == 403, answer.text
            error = answer.json()["error"]
            assert (error["code"], error["param"]) == ("origin_not_allowed", "origin")
            assert "'https://evil.example'" in error["message"] and "server.allowed_hosts" in error["message"]
            assert worker.generation_requests() == []
            # the names a browser on this machine uses for it, and addresses, are answered
            for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", f"app.localhost:{port}"):
                answer = await client.post(f"{public}/v1/chat/completions", json=CHAT, headers={"host": host})
                assert answer.status_code == 200, (host, answer.text)
            # a local web app (a page served from localhost) may use it
            answer = await client.post(
                f"{public}/v1/chat/completions", json=CHAT, headers={"origin": "http://localhost:5173"}
            )
            assert answer.status_code == 200, answer.text
            assert len(worker.generation_requests()) == 5
            assert (await _get(client, f"{public}/v1/models", "localhost")).status_code == 200
            assert (await _get(client, f"{admin}/scheduling/diagnostics", "LOCALHOST")).status_code == 200
            assert (await _get(client, f"{metrics}/metrics", "127.0.0.1")).status_code == 200
            # the probes answer any name (an orchestrator's probe may send its own Host)
            for probe in ("/health", "/liveness", "/readiness"):
                answer = await _get(client, f"{public}{probe}", REBOUND)
                assert answer.status_code in (200, 503), (probe, answer.text)
                assert "host_not_allowed" not in answer.text
        nursery.cancel_scope.cancel()


async def test_allowed_hosts_name_a_reverse_proxys_host(tmp_path: Path) -> None:
    allowed = (REBOUND, ".svc.cluster.local")
    async with trio.open_nursery() as nursery:
        worker: FaultWorker = await nursery.start(FaultWorker().run)
        worker.default = Act(events=2)
        handles = await nursery.start(run_daemon, _config(worker.url, 1, allowed, tmp_path))
        public, admin = handles.http_url, handles.admin_url
        async with httpx.AsyncClient(timeout=BUDGET_SECONDS) as client:
            for host in (REBOUND, f"{REBOUND.upper()}:443", "agentd.default.svc.cluster.local"):
                answer = await client.post(f"{public}/v1/chat/completions", json=CHAT, headers={"host": host})
                assert answer.status_code == 200, (host, answer.text)
            assert (await _get(client, f"{admin}/scheduling/diagnostics", REBOUND)).status_code == 200
            _refused_other = await _get(client, f"{public}/v1/models", "other.example")
            assert _refused_other.status_code == 403
            assert _refused_other.json()["error"]["code"] == "host_not_allowed"
        nursery.cancel_scope.cancel()
