"""Relay processes as an operator sees them, over real sockets (docs/operations.md §13, §14).

One daemon with two real relay processes on hypercorn's HTTP/1.1 protocol (the less walked one)
in front of a fake worker.  Each check failed before session 27:

* a POST to a proxy route spelt ``//v1/chat/completions`` or in absolute form
  (``http://host/v1/chat/completions``) was not recognised by the relay, forwarded to the scheduler
  process and served there (outside the relay's limits, one more hop); now the relay serves it;
* a route the relay forwards to the scheduler process (``/health``) came back with two ``date``
  headers (the scheduler's and the relay's own);
* a request head over 16 KiB that arrived in one read was served by a relay instead of the JSON
  431 (hypercorn's protocol, see tests/e2e/test_ops27_limits.py);
* ``/metrics`` fell back by a relay's counts when that relay was SIGKILLed and restarted (a
  counter reset for Prometheus); now every counter keeps its value across the restart;
* the daemon runs from a working directory that holds an unrelated package named ``daemon``:
  the relays (``python -m daemon.dataplane.relay_main``) imported that one and the daemon failed
  to start.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from fault_env import BUDGET_SECONDS, await_diagnostics, diagnostics
from fault_worker import Act, FaultWorker
from prometheus_client.parser import text_string_to_metric_families

from actors.core.config import ProgramSchedulingConfig
from daemon.config import AgentdConfig, BatchApiConfig, LimitsConfig, RoutingConfig, ServerConfig
from daemon.supervisor import run_daemon

CHAT = {"model": "fault-model", "messages": [{"role": "user", "content": "hi"}]}
# a relay process boots in ~1.5 s of CPU; on a loaded 2-core machine that is tens of seconds of wall time
PROCESS_START_BUDGET_SECONDS = 180.0


def _program(program_id: str) -> dict[str, Any]:
    return {**CHAT, "vllm_xargs": {"agentic_context": {"program_id": program_id}}}


def _config(worker_url: str, database: Path) -> AgentdConfig:
    return AgentdConfig(
        server=ServerConfig(
            host="127.0.0.1",
            port=0,
            shutdown_grace_seconds=2.0,
            data_plane_processes=2,
            http1_implementation="hypercorn",
        ),
        routing=RoutingConfig(worker_urls=(worker_url,), health_check_interval_seconds=3600.0, policy="round_robin"),
        limits=LimitsConfig(max_connections=3),  # per relay: 6 client connections in all
        batch_api=BatchApiConfig(database_path=str(database)),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(token_capacity_per_dp_rank=100_000),
    )


async def _raw(port: int, request: bytes) -> tuple[bytes, bytes]:
    """One request on a new connection (``Connection: close``); the answer's head and body."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        raw = b""
        while data := await stream.receive_some(65536):
            raw += data
    head, _, body = raw.partition(b"\r\n\r\n")
    return head, body


def _post(target: bytes, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    return (
        b"POST %b HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n\r\n%b" % (target, len(data), data)
    )


UPLOAD = (
    b'--x\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
    b'--x\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n{}\n\r\n--x--\r\n'
)


async def _concurrent_uploads(port: int, count: int, client: httpx.AsyncClient) -> None:
    """``count`` uploads whose bodies are held until every one is being forwarded, then finished;
    each must be stored (200)."""
    streams = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(count)]
    head = (
        b"POST /v1/files HTTP/1.1\r\nHost: localhost\r\nContent-Type: multipart/form-data; boundary=x\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(UPLOAD)
    )
    for stream in streams:
        await stream.send_all(head + UPLOAD[:20])
    # every upload is open on a relay (and its forward under way) before any of them ends
    await await_diagnostics(
        client, lambda d: sum(r["open_connections"] for r in d["data_plane"]["relays"]) == count + 1
    )
    answers = []
    for stream in streams:
        async with stream:
            await stream.send_all(UPLOAD[20:])
            raw = b""
            while data := await stream.receive_some(65536):
                raw += data
            answers.append(raw.split(b"\r\n", 1)[0].split(b" ")[1])  # the status code
    assert answers == [b"200"] * count, answers


async def _counters(client: httpx.AsyncClient) -> dict[str, float]:
    """Every relay-side cumulative sample of ``/metrics`` (proxied requests and their latencies)."""
    text = (await client.get("/metrics")).text
    return {
        s.name + json.dumps(s.labels, sort_keys=True): s.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("agentd_proxy_") and family.type in ("counter", "histogram")
        for s in family.samples
        if not s.name.endswith("_created")
    }


def _requests(counters: dict[str, float]) -> float:
    return sum(v for k, v in counters.items() if k.startswith("agentd_proxy_requests_total"))


async def _counted(client: httpx.AsyncClient, requests: int) -> dict[str, float]:
    """The counters once the relays counted ``requests`` proxied requests (a relay counts one after
    its last byte, so the count is awaited, then checked exactly)."""
    with trio.fail_after(BUDGET_SECONDS):
        while True:
            counters = await _counters(client)
            if _requests(counters) >= requests:
                assert _requests(counters) == requests
                return counters
            await trio.sleep(0.05)


def _asks(doc: dict[str, Any]) -> int:
    return sum(r["asks_count"] for r in doc["data_plane"]["relays"])


async def test_relays_route_bound_heads_and_keep_metrics_across_a_sigkill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "daemon").mkdir()
    (tmp_path / "daemon" / "__init__.py").write_text('raise SystemExit("an unrelated package named daemon")\n')
    monkeypatch.chdir(tmp_path)  # where the operator happens to run agentd from
    async with trio.open_nursery() as nursery:
        worker: FaultWorker = await nursery.start(FaultWorker().run)
        worker.default = Act(events=3)
        done = trio.Event()

        async def daemon(task_status: trio.TaskStatus[Any]) -> None:
            await run_daemon(_config(worker.url, tmp_path / "batches.sqlite3"), task_status=task_status)
            done.set()

        handles = await nursery.start(daemon)
        plane = handles.data_plane
        assert plane is not None
        port = int(handles.http_url.rsplit(":", 1)[1])
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            # Program requests on fresh connections: the relays take them
            for i in range(6):
                head, body = await _raw(port, _post(b"/v1/chat/completions", _program(f"p{i}")))
                assert head.startswith(b"HTTP/1.1 200"), head
            doc = await await_diagnostics(client, lambda d: d["dispatcher"]["completed_count"] == 6)
            assert _asks(doc) == 6

            # the proxy routes however the target is spelt are the relay's (asks_count counts them)
            for target in (b"//v1/chat/completions", b"/v1//chat/completions", b"http://agentd/v1/chat/completions"):
                head, body = await _raw(port, _post(target, _program("spelt")))
                assert head.startswith(b"HTTP/1.1 200"), (target, head)
                assert b'"completion_tokens"' in body
            doc = await await_diagnostics(client, lambda d: d["dispatcher"]["completed_count"] == 9)
            assert _asks(doc) == 9, "a proxy route was served by the scheduler process, not a relay"

            # four uploads at once, each on a relay with room (the limits are per relay): every one is
            # forwarded to the scheduler process's internal listener, which took only max_connections
            await _concurrent_uploads(port, 4, client)

            # a forwarded route has one date header
            head, body = await _raw(port, b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            assert head.lower().count(b"\r\ndate:") == 1, head
            # a 40 KiB head in one write is the relay's JSON 431
            big = b"GET /health HTTP/1.1\r\nHost: localhost\r\nx-big: " + b"a" * 40_000 + b"\r\n\r\n"
            head, body = await _raw(port, big)
            assert head.startswith(b"HTTP/1.1 431"), head
            assert json.loads(body)["error"]["code"] == "request_head_too_large"

            # /metrics across a SIGKILL and restart of the relay that counted most
            before = await _counted(client, 9)
            doc = await diagnostics(client)
            victim = max(doc["data_plane"]["relays"], key=lambda r: r["asks_count"])
            assert victim["asks_count"] > 0
            os.kill(victim["pid"], signal.SIGKILL)

            def restarted(d: dict[str, Any]) -> bool:
                slot = d["data_plane"]["relays"][victim["index"]]
                return bool(slot["alive"] and slot["pid"] != victim["pid"] and slot.get("frames_received", 0) > 0)

        # `client`'s keep-alive connection may have been the killed relay's (its clients lose their
        # connections, docs/operations.md §13.2): the rest on a new one
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            doc = await await_diagnostics(client, restarted, PROCESS_START_BUDGET_SECONDS)
            assert doc["data_plane"]["relays"][victim["index"]]["last_exit"] == "killed by SIGKILL"
            after = await _counters(client)
            assert after == before  # every counter and histogram sample as it was: nothing lost, nothing twice
            assert doc["data_plane"]["metrics"]["retired_relays_count"] == 0  # retired at the next scrape
            assert (await diagnostics(client))["data_plane"]["metrics"]["retired_relays_count"] == 1

            # and they go on from there
            head, _ = await _raw(port, _post(b"/v1/chat/completions", _program("after")))
            assert head.startswith(b"HTTP/1.1 200")
            await _counted(client, 10)
        handles.request_shutdown()
        with trio.fail_after(BUDGET_SECONDS):
            await done.wait()
        nursery.cancel_scope.cancel()
