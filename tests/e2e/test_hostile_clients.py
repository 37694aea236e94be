"""Hostile and careless clients over real sockets (docs/operations.md §14): bodies that stall or
stop half-way, clients that leave mid-body or mid-stream, raw requests no HTTP library would send.
After each case the daemon still serves and ``/scheduling/diagnostics`` (read over HTTP) shows
every capacity counter back at rest.

Real clock (the socket path is the point, as in ``test_edge_limits``): the short timeouts
configured here (a fraction of a second) are asserted as outcomes, never as measured durations.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Callable
from functools import partial
from typing import Any

import attrs
import httpx
import pytest
import trio
from native_fakes import FakeWorker, make_config

from actors.core.config import ProgramSchedulingConfig
from daemon.config import AdminConfig, AuthConfig, LimitsConfig
from daemon.handles import DaemonHandles
from daemon.supervisor import run_daemon

BUDGET_SECONDS = 30.0
BODY_TIMEOUT = 2.0  # long enough that a starved test process never times out a body it sends itself
MODEL = "fake-model"
LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": []}}\n'


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Poll ``predicate`` on the real clock (socket progress has no event to wait for)."""
    while True:
        if predicate():
            return
        await trio.sleep(0.01)


async def start(nursery: trio.Nursery, worker: FakeWorker, **extra: Any) -> DaemonHandles:
    cfg = attrs.evolve(
        make_config(worker.worker_urls, dp=2),
        limits=LimitsConfig(body_read_timeout_seconds=BODY_TIMEOUT),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(program_scheduling_enable_key="auto"),
        **extra,
    )
    return await nursery.start(partial(run_daemon, cfg, transport_factory=worker.transport, rng=random.Random(5)))


def address(handles: DaemonHandles) -> tuple[str, int]:
    assert handles.http_url is not None
    host, port = handles.http_url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


async def read_response(stream: trio.SocketStream) -> tuple[int, dict[str, str], bytes]:
    """One response (a JSON one: read by its content-length, or until the server closes)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "-1"))
    while length < 0 or len(body) < length:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        body += chunk
    if length >= 0:  # not the start of the next response (e.g. the 400 for bytes after the body)
        body = body[:length]
    return int(lines[0].split(" ")[1]), headers, body


async def at_rest(client: httpx.AsyncClient) -> dict[str, Any]:
    """Poll ``/scheduling/diagnostics`` until every request-bound counter is back at zero."""
    while True:
        doc = (await client.get("/scheduling/diagnostics")).json()
        edge = doc["proxy"]["edge"]
        if doc["invariants"]["at_rest"] and edge["in_flight"] == 0 and edge["queued"] == 0:
            return dict(doc)
        await trio.sleep(0.02)


def multipart_head(path: str, length: int) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: multipart/form-data; boundary=bnd\r\n"
        f"content-length: {length}\r\n\r\n"
    ).encode()


UPLOAD_START = b'--bnd\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'


@pytest.mark.parametrize(
    ("path", "head", "partial"),
    [
        pytest.param("/v1/files", multipart_head("/v1/files", 10_000), UPLOAD_START, id="upload"),
        pytest.param(
            "/v1/batches",
            b"POST /v1/batches HTTP/1.1\r\n"
            b"host: localhost\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n",
            b'{"input_file_id": ',
            id="create-batch",
        ),
    ],
)
async def test_a_batch_api_body_that_stalls_is_a_json_408(
    fake_worker: FakeWorker, path: str, head: bytes, partial: bytes
) -> None:
    """Before: the upload and the batch creation waited for the rest of the body for ever (no
    body-read timeout outside the proxy routes), holding the connection."""
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start(nursery, fake_worker)
            host, port = address(handles)
            stream = await trio.open_tcp_stream(host, port)
            await stream.send_all(head + partial)  # ... and nothing more
            status, headers, body = await read_response(stream)
            assert status == 408, body
            assert json.loads(body)["error"]["code"] == "body_read_timeout"
            if os.environ.get("AGENTD_HTTP1_IMPLEMENTATION", "agentd") == "agentd":
                assert headers.get("connection") == "close"  # the rest of the body is not read
            await stream.aclose()
            async with httpx.AsyncClient(base_url=handles.http_url) as client:
                assert (await client.get("/v1/files")).json()["data"] == []  # nothing half-stored
            handles.request_shutdown()


async def test_an_upload_abandoned_mid_body_stores_nothing(fake_worker: FakeWorker) -> None:
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start(nursery, fake_worker)
            host, port = address(handles)
            file_part = b'--bnd\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n'
            stream = await trio.open_tcp_stream(host, port)
            await stream.send_all(multipart_head("/v1/files", 100_000) + UPLOAD_START + file_part + LINE * 20)
            await stream.aclose()
            async with httpx.AsyncClient(base_url=handles.http_url) as client:
                await wait_until(
                    lambda: handles.server_state is not None and handles.server_state.open_connections == 0
                )
                assert (await client.get("/v1/files")).json()["data"] == []
                ok = await client.post(
                    "/v1/files", files={"purpose": (None, b"batch"), "file": ("in.jsonl", LINE)}
                )  # and the next upload is served
                assert ok.status_code == 200 and ok.json()["bytes"] == len(LINE)
            handles.request_shutdown()


def chat(stream: bool, program: str) -> bytes:
    return json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": stream,
            "vllm_xargs": {"agentic_context": {"program_id": program, "step_id": 0}},
        }
    ).encode()


async def test_clients_that_leave_mid_body_or_mid_stream_leave_no_capacity_behind(fake_worker: FakeWorker) -> None:
    fake_worker.hold_streams = True  # streams stay open until the test releases them
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start(nursery, fake_worker)
            host, port = address(handles)
            async with httpx.AsyncClient(base_url=handles.http_url) as client:
                # 1. half a body, then gone
                body = chat(False, "leaver-1")
                stream = await trio.open_tcp_stream(host, port)
                await stream.send_all(
                    b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(body)}\r\n\r\n".encode()
                    + body[: len(body) // 2]
                )
                await stream.aclose()
                # 2. a Program stream under way, then gone
                body = chat(True, "leaver-2")
                stream = await trio.open_tcp_stream(host, port)
                await stream.send_all(
                    b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await wait_until(lambda: fake_worker.holding >= 1)
                await stream.aclose()
                await fake_worker.stream_closed.wait()  # the worker's stream was cancelled
                doc = await at_rest(client)
                assert doc["invariants"]["program_open_leases"] == 0
                # 3. the daemon still serves, the same Program included
                fake_worker.hold_streams = False
                fake_worker.release.set()
                again = await client.post("/v1/chat/completions", content=chat(False, "leaver-2"))
                assert again.status_code == 200, again.text
                await at_rest(client)
            handles.request_shutdown()


# Raw requests a careless or hostile client sends, and the answer each must get.
RAW_CASES = [
    pytest.param(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        b"content-encoding: gzip\r\ncontent-length: 2\r\n\r\n{}",
        415,
        "unsupported_content_encoding",
        "content-encoding",
        id="gzip-body",
    ),
    pytest.param(
        b"POST /v1/batches HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        b"content-encoding: deflate\r\ncontent-length: 2\r\n\r\n{}",
        415,
        "unsupported_content_encoding",
        "content-encoding",
        id="deflate-batch",
    ),
    pytest.param(  # a content-length shorter than the body: the declared bytes are the body
        b"POST /v1/chat/completions HTTP/1.1\r\n"
        b"host: localhost\r\ncontent-type: application/json\r\ncontent-length: 10\r\n\r\n"
        b'{"model": "fake-model", "messages": []}',
        400,
        "invalid_json",
        None,
        id="content-length-short",
    ),
    pytest.param(
        b"GET /v1/files/..%2F..%2Fetc%2Fpasswd HTTP/1.1\r\nhost: localhost\r\n\r\n",
        404,
        "not_found",
        None,
        id="traversal",
    ),
    pytest.param(
        b"GET /v1/files/%ff%fe HTTP/1.1\r\nhost: localhost\r\n\r\n", 404, "file_not_found", "file_id", id="bad-utf8-id"
    ),
    pytest.param(
        b"GET /v1/files/a%00b/content HTTP/1.1\r\nhost: localhost\r\n\r\n",
        404,
        "file_not_found",
        "file_id",
        id="nul-id",
    ),
    pytest.param(
        b"GET /v1/batches?limit=%C2%B2 HTTP/1.1\r\nhost: localhost\r\n\r\n",
        400,
        "invalid_value",
        "limit",
        id="limit-sup2",
    ),
    pytest.param(
        b"GET /v1/files?limit=" + b"9" * 5000 + b" HTTP/1.1\r\nhost: localhost\r\n\r\n",
        400,
        "invalid_value",
        "limit",
        id="limit-5000-digits",
    ),
    pytest.param(
        b"GET /v1/batches?limit=1&limit=2 HTTP/1.1\r\nhost: localhost\r\n\r\n",
        400,
        "invalid_value",
        "limit",
        id="limit-twice",
    ),
    pytest.param(
        b"GET /scheduling/dashboard.json?page=%C2%B2 HTTP/1.1\r\nhost: localhost\r\n\r\n",
        400,
        "invalid_parameter",
        "page",
        id="page-sup2",
    ),
    pytest.param(
        b"POST /v1/batches HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 66\r\n\r\n"
        b'{"input_file_id": "f", "endpoint": {}, "completion_window": "24h"}',
        400,
        "invalid_value",
        "endpoint",
        id="endpoint-object",
    ),
    pytest.param(
        b"DELETE /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n\r\n", 405, "method_not_allowed", None, id="405"
    ),
]


@pytest.mark.parametrize(("raw", "status", "code", "param"), RAW_CASES)
async def test_raw_hostile_requests_get_a_json_4xx_naming_the_field(
    fake_worker: FakeWorker, raw: bytes, status: int, code: str, param: str | None
) -> None:
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start(nursery, fake_worker)
            host, port = address(handles)
            stream = await trio.open_tcp_stream(host, port)
            await stream.send_all(raw)
            got, headers, body = await read_response(stream)
            await stream.aclose()
            error = json.loads(body)["error"]
            assert (got, error["code"], error["param"]) == (status, code, param), error
            if status == 405:
                assert headers["allow"] == "POST"
            async with httpx.AsyncClient(base_url=handles.http_url) as client:
                await at_rest(client)
            handles.request_shutdown()


CLIENT_KEY, ADMIN_KEY = "sk-client", "sk-admin"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


async def raw_get(host: str, port: int, target: bytes, key: str) -> tuple[int, bytes]:
    stream = await trio.open_tcp_stream(host, port)
    await stream.send_all(
        b"GET " + target + b" HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer " + key.encode() + b"\r\n\r\n"
    )
    status, _, body = await read_response(stream)
    await stream.aclose()
    return status, body


# (target, answer on the public port of a split daemon, answer to a client key with one listener)
ADMIN_TARGETS = [
    (b"//scheduling/diagnostics", 404, 401),
    (b"///metrics", 404, 401),
    (b"//dashboard", 404, 401),
    (b"/scheduling//dashboard.json", 404, 401),
    (b"http://agentd/scheduling/diagnostics", 404, 401),  # absolute-form, as behind an HTTP proxy
    (b"scheduling/diagnostics", 400, 400),
    (b"http:/scheduling/diagnostics", 400, 400),
]


async def test_no_spelling_of_an_admin_path_reaches_it_from_the_public_port(fake_worker: FakeWorker) -> None:
    """Before: Quart's router merged the slashes of ``//scheduling/diagnostics`` and routed a
    target without its leading slash (``scheduling/diagnostics``), while the admin check saw a path
    outside ``/scheduling/``: the public listener served diagnostics, metrics and the dashboard to
    any client key (and to anyone without keys), past the admin listener split."""
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            auth = AuthConfig(api_keys=(f"team:{digest(CLIENT_KEY)}",), admin_keys=(digest(ADMIN_KEY),))
            handles = await start(nursery, fake_worker, auth=auth, admin=AdminConfig(port=0))
            host, port = address(handles)
            for target, public, _ in ADMIN_TARGETS:
                status, body = await raw_get(host, port, target, CLIENT_KEY)
                assert status == public and "error" in json.loads(body), (target, body[:200])
            assert (await raw_get(host, port, b"http://agentd/health", CLIENT_KEY))[0] == 200
            assert handles.admin_url is not None
            admin_host, admin_port = handles.admin_url.removeprefix("http://").rsplit(":", 1)
            status, body = await raw_get(admin_host, int(admin_port), b"//scheduling/diagnostics", ADMIN_KEY)
            assert status == 200 and "invariants" in json.loads(body)  # the admin listener serves it
            handles.request_shutdown()
        async with trio.open_nursery() as nursery:  # one listener: the admin key is required
            handles = await start(nursery, fake_worker, auth=auth)
            host, port = address(handles)
            for target, _, single in ADMIN_TARGETS:
                status, body = await raw_get(host, port, target, CLIENT_KEY)
                assert status == single, (target, body[:200])
                if single == 401:
                    assert (await raw_get(host, port, target, ADMIN_KEY))[0] == 200, target
            handles.request_shutdown()
