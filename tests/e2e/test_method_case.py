"""agentd's app answers a method with lower-case letters with a JSON 405 on every route
(RFC 9110 §9.1: it is another method).  Quart's routing matched ``get`` as GET and agentd's POST
routes took ``post`` as POST, so a filter in front of agentd that blocks a method could be passed
by writing it in lower case (session-36 walk; docs/operations.md §14)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from test_walk30_http import quickstart

from daemon.http.app import create_app


async def asgi_call(app: Any, method: str, path: str, body: bytes = b"") -> tuple[int, dict[str, Any]]:
    """One request through the ASGI app with ``method`` exactly as given (clients upper-case it)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"agentd"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 3001),
    }
    sent: list[dict[str, Any]] = []
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await trio.sleep_forever()
        raise AssertionError  # pragma: no cover

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(payload)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/health"),
        ("Get", "/v1/models"),
        ("head", "/scheduling/diagnostics"),
        ("post", "/v1/chat/completions"),
        ("post", "/v1/files"),
        ("options", "/v1/batches"),
    ],
)
async def test_a_lower_case_method_gets_a_405_on_every_route(tmp_path: Path, method: str, path: str) -> None:
    async with quickstart(tmp_path) as (handles, client):
        body = json.dumps({"model": "agentd-sim", "messages": [{"role": "user", "content": "hi"}]}).encode()
        status, payload = await asgi_call(create_app(handles), method, path, body)
        assert status == 405, payload
        error = payload["error"]
        assert error["code"] == "method_not_allowed" and error["type"] == "invalid_request_error"
        assert f"use {method.upper()!r}" in error["message"]
        diag = (await client.get("/scheduling/diagnostics")).json()
        assert diag["proxy"]["native"]["finished_count"] == 0  # nothing was served
