"""The four upstream timeouts in virtual time, exactly (docs/operations.md §11; F2's "within the
idle timeout +-10%" holds to the microsecond here; the socket cases check it with slack)."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from functools import partial

import httpx
import pytest
import trio
import trio.testing

from actors.core.config import problems
from daemon.config import AgentdConfig, BatchApiConfig, RoutingConfig, ServerConfig
from daemon.handles import DaemonHandles
from daemon.supervisor import run_daemon

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class Stalling(httpx.AsyncByteStream):
    """``sent`` events ``gap`` seconds apart, then silence (forever, or ``then`` more events after
    ``pause`` seconds)."""

    def __init__(self, sent: int, gap: float = 0.0, pause: float | None = None, then: int = 0) -> None:
        self.sent, self.gap, self.pause, self.then = sent, gap, pause, then
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for i in range(self.sent):
            if i:
                await trio.sleep(self.gap)
            yield event({"choices": [{"index": 0, "delta": {"content": str(i)}}]})
        if self.pause is None:
            await trio.sleep_forever()
        await trio.sleep(self.pause)
        for i in range(self.then):
            yield event({"choices": [{"index": 0, "delta": {"content": str(i)}}]})
        yield b"data: [DONE]\n\n"

    async def aclose(self) -> None:
        self.closed = True


class Worker:
    def __init__(self) -> None:
        self.head_delay = 0.0
        self.stream: Stalling | None = None

    async def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        await trio.sleep(self.head_delay)
        assert self.stream is not None
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=self.stream)

    def transport(self, cfg: AgentdConfig) -> httpx.AsyncBaseTransport:
        return httpx.MockTransport(self.handler)


def config(**routing: float) -> AgentdConfig:
    return AgentdConfig(
        server=ServerConfig(port=0),
        routing=RoutingConfig(worker_urls=("http://w0:8000",), policy="round_robin", **routing),  # type: ignore[arg-type]
        batch_api=BatchApiConfig(enabled=False),
    )


async def serve(handles: DaemonHandles, body: dict) -> tuple[float, int | None, bytes]:
    req = handles.build_request("chat", json.dumps(body).encode(), {})
    t0 = trio.current_time()
    sink = await handles.handle_collect(req)
    return trio.current_time() - t0, sink.status, sink.body


async def run(worker: Worker, cfg: AgentdConfig, body: dict) -> tuple[float, int | None, bytes]:
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(
            partial(run_daemon, cfg, transport_factory=worker.transport, serve_http=False, rng=random.Random(1))
        )
        result = await serve(handles, body)
        nursery.cancel_scope.cancel()
    return result


async def test_stream_idle_timeout_fires_exactly_after_the_last_event(autojump_clock: trio.testing.MockClock) -> None:
    worker = Worker()
    worker.stream = Stalling(sent=3, gap=2.0)  # events at 0, 2, 4 s, then silence
    elapsed, status, body = await run(worker, config(stream_idle_timeout_seconds=7.5), {**CHAT, "stream": True})
    assert status == 200
    assert elapsed == pytest.approx(4.0 + 7.5, abs=1e-6)
    *data, error, done = [e for e in body.split(b"\n\n") if e]
    assert len(data) == 3
    payload = json.loads(error.removeprefix(b"data: "))
    assert payload["error"]["code"] == "upstream_stream" and "7.5 s" in payload["error"]["message"]
    assert done == b"data: [DONE]"
    assert worker.stream.closed


async def test_a_pause_shorter_than_the_idle_timeout_is_no_fault(autojump_clock: trio.testing.MockClock) -> None:
    worker = Worker()
    worker.stream = Stalling(sent=2, pause=7.0, then=2)
    elapsed, status, body = await run(worker, config(stream_idle_timeout_seconds=7.5), {**CHAT, "stream": True})
    assert status == 200 and body.endswith(b"data: [DONE]\n\n") and b"error" not in body
    assert elapsed == pytest.approx(7.0, abs=1e-6)


async def test_first_byte_timeout_is_504_for_a_stream(autojump_clock: trio.testing.MockClock) -> None:
    worker = Worker()
    worker.head_delay = 100.0
    worker.stream = Stalling(sent=1, pause=0.0)
    elapsed, status, body = await run(worker, config(first_byte_timeout_seconds=3.0), {**CHAT, "stream": True})
    assert elapsed == pytest.approx(3.0, abs=1e-6)
    assert status == 504
    assert json.loads(body)["error"]["code"] == "upstream_timeout"


async def test_first_byte_timeout_does_not_apply_to_a_non_streaming_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A non-streaming answer's head comes with the whole completion: only the total bounds it."""
    worker = Worker()
    worker.head_delay = 100.0
    worker.stream = Stalling(sent=1, pause=0.0)
    elapsed, status, _ = await run(worker, config(first_byte_timeout_seconds=3.0), CHAT)
    assert status == 200
    assert elapsed == pytest.approx(100.0, abs=1e-6)


async def test_total_timeout_ends_a_live_stream_with_error_and_done(autojump_clock: trio.testing.MockClock) -> None:
    worker = Worker()
    worker.stream = Stalling(sent=1000, gap=1.0)  # never idle, never done
    cfg = config(request_timeout_seconds=20.0, stream_idle_timeout_seconds=5.0, first_byte_timeout_seconds=5.0)
    elapsed, status, body = await run(worker, cfg, {**CHAT, "stream": True})
    assert status == 200
    assert elapsed == pytest.approx(20.0, abs=1e-6)
    *data, error, done = [e for e in body.split(b"\n\n") if e]
    assert len(data) == 20  # events at 0..19 s
    assert json.loads(error.removeprefix(b"data: "))["error"]["code"] == "upstream_stream"
    assert done == b"data: [DONE]"


def test_timeout_rules_are_checked() -> None:
    bad = RoutingConfig(request_timeout_seconds=10.0, stream_idle_timeout_seconds=11.0, keepalive_expiry_seconds=0)
    found = problems(bad)
    assert any("stream_idle_timeout_seconds" in p and "request_timeout_seconds" in p for p in found)
    assert any("keepalive_expiry_seconds" in p for p in found)
