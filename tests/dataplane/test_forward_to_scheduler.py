"""A relay's forward of a non-proxy route to the scheduler process (docs/operations.md §14).

The scheduler process is an ASGI app behind httpx's ASGI transport (no sockets: the behaviour is
about the relay's reading of the client's body, not about TCP).  A body of several ASGI messages is
streamed through, never held whole; a body that stalls is a 408 after exactly
``body_read_timeout_seconds``; a client that leaves mid-body ends the forward without an answer."""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio

from daemon.dataplane.relay import forward_to_scheduler

STALL = 7.0


class Scheduler:
    """Stands in for the scheduler process: records when each body chunk arrived."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[float, int]] = []
        self.calls = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.calls += 1
        size = 0
        while True:
            message = await receive()
            chunk = message.get("body", b"")
            if chunk:
                self.arrivals.append((trio.current_time(), len(chunk)))
            size += len(chunk)
            if not message.get("more_body", False):
                break
        body = json.dumps({"path": scope["path"], "bytes": size}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


def _scope(method: str = "POST", path: str = "/v1/files") -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [(b"content-type", b"multipart/form-data; boundary=x")],
    }


class Client:
    """The relay's ASGI side: the client's body messages, each after a delay (None: never)."""

    def __init__(self, parts: list[tuple[float | None, dict[str, Any]]]) -> None:
        self.parts = list(parts)
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        delay, message = self.parts.pop(0)
        if delay is None:
            await trio.sleep_forever()
        await trio.sleep(delay)
        return message

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def answer(self) -> tuple[int, dict[str, Any]]:
        start = self.sent[0]
        body = b"".join(m.get("body", b"") for m in self.sent[1:])
        return start["status"], json.loads(body)


async def _forward(scheduler: Scheduler, client: Client, method: str = "POST") -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=scheduler)) as http:
        await forward_to_scheduler(
            http, "http://scheduler", _scope(method), client.receive, client.send, stall_seconds=STALL
        )


def _chunk(size: int, more: bool = True) -> dict[str, Any]:
    return {"type": "http.request", "body": b"x" * size, "more_body": more}


async def test_a_long_body_is_streamed_as_it_arrives(autojump_clock: Any) -> None:
    scheduler = Scheduler()
    client = Client([(0.0, _chunk(1000)), (5.0, _chunk(2000)), (6.0, _chunk(3000, more=False))])
    await _forward(scheduler, client)
    assert client.answer() == (200, {"path": "/v1/files", "bytes": 6000})
    # each part reached the scheduler when the client sent it, not all at the end
    assert scheduler.arrivals == [(0.0, 1000), (5.0, 2000), (11.0, 3000)]


async def test_a_body_in_one_message_is_sent_whole(autojump_clock: Any) -> None:
    scheduler = Scheduler()
    client = Client([(0.0, {"type": "http.request", "body": b"", "more_body": False})])
    await _forward(scheduler, client, method="GET")
    assert client.answer() == (200, {"path": "/v1/files", "bytes": 0})


async def test_the_schedulers_content_length_reaches_the_client(autojump_clock: Any) -> None:
    """A forwarded answer keeps the scheduler's content-length (docs/operations.md §13.1): without
    it the relay's server would send it chunked; ``date`` is the relay's own."""

    async def scheduler(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        head = [(b"content-type", b"application/json"), (b"content-length", b"11"), (b"date", b"then")]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": b'{"ok":true}'})

    client = Client([(0.0, {"type": "http.request", "body": b"", "more_body": False})])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=scheduler)) as http:
        await forward_to_scheduler(
            http, "http://scheduler", _scope("GET"), client.receive, client.send, stall_seconds=STALL
        )
    body = b"".join(m.get("body", b"") for m in client.sent[1:])
    headers = dict(client.sent[0]["headers"])
    assert (headers[b"content-length"], len(body)) == (b"11", 11)
    assert b"date" not in headers and b"transfer-encoding" not in headers


async def test_a_stalled_body_is_a_408_after_the_timeout(autojump_clock: Any) -> None:
    scheduler = Scheduler()
    client = Client([(0.0, _chunk(1000)), (6.5, _chunk(1000)), (None, _chunk(1))])
    await _forward(scheduler, client)
    assert trio.current_time() == 6.5 + STALL
    status, doc = client.answer()
    assert status == 408
    assert doc["error"]["code"] == "body_read_timeout"
    assert "limits.body_read_timeout_seconds" in doc["error"]["message"]


async def test_a_body_that_never_starts_is_a_408_without_asking_the_scheduler(autojump_clock: Any) -> None:
    scheduler = Scheduler()
    client = Client([(None, _chunk(1))])
    await _forward(scheduler, client)
    assert trio.current_time() == STALL
    assert client.answer()[0] == 408
    assert scheduler.calls == 0


async def test_a_client_that_leaves_mid_body_gets_no_answer(autojump_clock: Any) -> None:
    scheduler = Scheduler()
    client = Client([(0.0, _chunk(1000)), (1.0, {"type": "http.disconnect"})])
    await _forward(scheduler, client)
    assert client.sent == []
    assert trio.current_time() == 1.0


async def test_a_relay_refuses_a_lower_case_method_as_the_scheduler_process_does(autojump_clock: Any) -> None:
    # before, a relay forwarded "post /v1/chat/completions" (not its POST) and "get /v1/models"
    # to the scheduler process, and httpx upper-cased the method there: both were served (200)
    from daemon.config import AgentdConfig
    from daemon.dataplane.relay_main import RelayApp

    scheduler = Scheduler()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=scheduler)) as http:
        relay = RelayApp(None, AgentdConfig(), None, None, "http://scheduler", http)  # type: ignore[arg-type]
        for method, path in [("post", "/v1/chat/completions"), ("get", "/v1/models"), ("Get", "/v1/files")]:
            client = Client([(0.0, {"type": "http.request", "body": b"{}", "more_body": False})])
            await relay(_scope(method, path), client.receive, client.send)
            status, body = client.answer()
            assert status == 405, (method, path)
            assert body["error"]["code"] == "method_not_allowed"
            assert "case-sensitive" in body["error"]["message"] and repr(method.upper()) in body["error"]["message"]
    assert scheduler.calls == 0
