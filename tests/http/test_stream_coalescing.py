"""``[server] stream_coalesce_ms`` in virtual time (docs/operations.md §13.5): the first
token leaves at once, later events of one stream leave together at most W ms after the first held
one, the end of the stream is never held, a client that leaves during a hold cancels the request,
and 0 (the default) writes every chunk as it arrives."""

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
from daemon.http.proxy import StreamRelay
from daemon.supervisor import run_daemon
from daemon.upstream import UsageChunkFilter

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def event(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def token(i: int, reason: str | None = None) -> bytes:
    return event({"choices": [{"index": 0, "delta": {"content": f"t{i}"}, "finish_reason": reason}]})


ROLE = event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
USAGE = event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}})
DONE = b"data: [DONE]\n\n"


class Script(httpx.AsyncByteStream):
    """Chunks at given times (seconds after the response head); ``hang``: silence after them."""

    def __init__(self, chunks: list[tuple[float, bytes]], hang: bool = False) -> None:
        self.chunks = chunks
        self.hang = hang
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        t0 = trio.current_time()
        for at, chunk in self.chunks:
            await trio.sleep_until(t0 + at)
            yield chunk
        if self.hang:
            await trio.sleep_forever()

    async def aclose(self) -> None:
        self.closed = True


class TimedSink:
    """A response sink that records when each write happened (relative to the head)."""

    def __init__(self) -> None:
        self.t0: float | None = None
        self.status: int | None = None
        self.writes: list[tuple[float, bytes]] = []
        self.ended_at: float | None = None

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.status, self.t0 = status, trio.current_time()

    async def send(self, chunk: bytes) -> None:
        assert self.t0 is not None
        self.writes.append((trio.current_time() - self.t0, chunk))

    async def end(self, chunk: bytes = b"") -> None:
        assert self.t0 is not None
        if chunk:
            self.writes.append((trio.current_time() - self.t0, chunk))
        self.ended_at = trio.current_time() - self.t0

    @property
    def body(self) -> bytes:
        return b"".join(c for _, c in self.writes)


def config(coalesce_ms: float) -> AgentdConfig:
    return AgentdConfig(
        server=ServerConfig(port=0, stream_coalesce_ms=coalesce_ms),
        routing=RoutingConfig(worker_urls=("http://w0:8000",), policy="round_robin"),
        batch_api=BatchApiConfig(enabled=False),
    )


async def relay(script: Script, coalesce_ms: float, body: dict | None = None) -> TimedSink:
    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=script)

    sink = TimedSink()
    async with trio.open_nursery() as nursery:
        handles: DaemonHandles = await nursery.start(
            partial(
                run_daemon,
                config(coalesce_ms),
                transport_factory=lambda cfg: httpx.MockTransport(handler),
                serve_http=False,
                rng=random.Random(1),
            )
        )
        req = handles.build_request("chat", json.dumps(body or CHAT).encode(), {})
        await handles.engine.handle(req, sink)
        nursery.cancel_scope.cancel()
    return sink


STREAM = [(0.0, ROLE), (0.001, token(0))] + [(0.020 * i, token(i)) for i in range(1, 10)]
END = [(0.200, token(10, "stop")), (0.200, USAGE), (0.200, DONE)]


async def test_zero_writes_every_chunk_as_it_arrives(autojump_clock: trio.testing.MockClock) -> None:
    sink = await relay(Script(STREAM + END), 0)
    assert [round(t, 6) for t, _ in sink.writes] == [t for t, _ in STREAM + END][: len(sink.writes)]
    assert len(sink.writes) == len(STREAM + END)
    assert sink.body == b"".join(c for _, c in STREAM + END)


async def test_first_token_immediate_then_coalesced_and_the_end_not_delayed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sink = await relay(Script(STREAM + END), 50)
    times = [round(t, 6) for t, _ in sink.writes]
    # the role event and the first token leave at once; then each 50 ms window, opened by the first
    # held event, closes on the arrival whose successor (one gap later) would come after it: t1 at
    # 20 ms (due 70) .. t3 at 60 (next at 80 > 70); t4 (due 130) .. t6 at 120; t7 (due 190) .. t9
    # at 180; the final token (its finish reason) and [DONE] leave when they arrive (200 ms)
    assert times == [0.0, 0.001, 0.06, 0.12, 0.18, 0.2, 0.2]
    assert sink.writes[1][1] == token(0)
    assert sink.writes[2][1] == token(1) + token(2) + token(3)
    assert sink.writes[-2][1] == token(10, "stop")
    assert sink.writes[-1][1] == USAGE + DONE
    assert sink.body == b"".join(c for _, c in STREAM + END)  # byte for byte
    assert sink.ended_at == pytest.approx(0.2, abs=1e-9)


async def test_tokens_slower_than_the_window_are_never_held(autojump_clock: trio.testing.MockClock) -> None:
    chunks = [(0.080 * i, token(i)) for i in range(4)] + [(0.320, DONE)]
    sink = await relay(Script(chunks), 50)
    assert [(round(t, 6), c) for t, c in sink.writes] == chunks


async def test_the_end_flushes_what_is_held(autojump_clock: trio.testing.MockClock) -> None:
    """A stream whose end arrives while events are held: nothing waits for the window."""
    chunks = [(0.0, token(0)), (0.010, token(1)), (0.015, token(2)), (0.016, DONE)]
    sink = await relay(Script(chunks), 50)
    assert [(round(t, 6), c) for t, c in sink.writes] == [(0.0, token(0)), (0.016, token(1) + token(2) + DONE)]


async def test_an_upstream_pause_releases_the_held_events_on_time(autojump_clock: trio.testing.MockClock) -> None:
    """The window is a deadline of its own: a worker that goes quiet does not keep events held."""
    chunks = [(0.0, token(0)), (0.010, token(1)), (5.0, token(2, "stop")), (5.0, DONE)]
    sink = await relay(Script(chunks), 50)
    assert [(round(t, 6), c) for t, c in sink.writes] == [
        (0.0, token(0)),
        (0.06, token(1)),
        (5.0, token(2, "stop")),
        (5.0, DONE),
    ]


async def test_usage_filter_and_coalescing_together(autojump_clock: trio.testing.MockClock) -> None:
    """agentd injected include_usage: its usage event is dropped, the rest coalesced, the end at once."""
    writes: list[tuple[float, bytes]] = []

    async def send(chunk: bytes) -> None:
        writes.append((trio.current_time(), chunk))

    t0 = trio.current_time()
    relay = StreamRelay(send, UsageChunkFilter(), 0.05, lambda now: None)
    await relay.feed(token(0))
    await trio.sleep(0.010)
    await relay.feed(token(1))
    assert relay.due == pytest.approx(t0 + 0.060)
    await trio.sleep(0.020)
    await relay.feed(token(2, "stop") + USAGE[:20])  # the usage event split across two reads
    await relay.feed(USAGE[20:] + DONE)
    await relay.finish()
    assert [(round(t - t0, 6), c) for t, c in writes] == [
        (0.0, token(0)),
        (0.03, token(1) + token(2, "stop")),
        (0.03, DONE),
    ]
    assert relay.accumulator.usage is not None and relay.accumulator.usage.completion_tokens == 5
    assert relay.accumulator.finish_reason == "stop"


async def test_client_disconnect_during_a_hold_cancels_at_once(autojump_clock: trio.testing.MockClock) -> None:
    script = Script([(0.0, token(0)), (0.010, token(1))], hang=True)
    sink = TimedSink()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=script)

    request_scope = trio.CancelScope()  # what the disconnect watcher cancels
    finished_at: list[float] = []

    async def client(handles: DaemonHandles) -> None:
        req = handles.build_request("chat", json.dumps(CHAT).encode(), {})
        try:
            with request_scope:
                await handles.engine.handle(req, sink)
        finally:
            finished_at.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        handles: DaemonHandles = await nursery.start(
            partial(
                run_daemon,
                config(50),
                transport_factory=lambda cfg: httpx.MockTransport(handler),
                serve_http=False,
                rng=random.Random(1),
            )
        )
        nursery.start_soon(client, handles)
        await trio.sleep(0.030)  # t1 arrived at 10 ms and is held (until 60 ms)
        t_cancel = trio.current_time()
        request_scope.cancel()
        await trio.sleep(1.0)
        nursery.cancel_scope.cancel()
    assert finished_at == [t_cancel]
    assert [c for _, c in sink.writes] == [token(0)]  # the held event never went out
    assert sink.ended_at is None
    assert script.closed  # the upstream response was closed


def test_stream_coalesce_ms_is_validated() -> None:
    found = problems(ServerConfig(stream_coalesce_ms=-1))
    assert any("stream_coalesce_ms" in p and "[0, 1000]" in p for p in found), found
    found = problems(ServerConfig(stream_coalesce_ms=5000))
    assert any("stream_coalesce_ms" in p for p in found), found
    assert not problems(ServerConfig(stream_coalesce_ms=50))
