"""A complete (non-stream) answer is written to the client before the worker's body is read for
its usage and the lease is finished (docs/benchmarks.md §10.2.7): the usage parse is off the
client's path.  A write that fails still finishes the lease with the usage the worker reported
(the worker did the work), as when the usage was read first."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from prometheus_client import CollectorRegistry

from actors.core.config import BackendTarget
from daemon.dispatch import Outcome, ProxyRequest
from daemon.http.proxy import ClientGone, ProxyEngine
from daemon.metrics import ProxyMetrics

TARGET = BackendTarget(worker_url="http://w:1", dp_rank=0, target_id="http://w:1@0", index=0)
ANSWER = json.dumps(
    {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
    }
).encode()


class RecordingLease:
    target = TARGET
    wants_usage = True
    attempt = 0

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.outcome: Outcome | None = None

    def finish(self, outcome: Outcome) -> None:
        self.events.append("finish")
        self.outcome = outcome


class OneLease:
    def __init__(self, lease: RecordingLease) -> None:
        self.the_lease = lease

    @asynccontextmanager
    async def lease(self, req: ProxyRequest) -> AsyncIterator[RecordingLease]:
        yield self.the_lease


class Sink:
    def __init__(self, events: list[str], *, fail_end: bool = False) -> None:
        self.events = events
        self.fail_end = fail_end
        self.body = b""

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.events.append(f"start {status}")

    async def send(self, chunk: bytes) -> None:
        self.body += chunk

    async def end(self, chunk: bytes = b"") -> None:
        if self.fail_end:
            raise ClientGone("the client left")
        self.body += chunk
        self.events.append("end")


def engine_with(lease: RecordingLease) -> ProxyEngine:
    def worker(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=ANSWER, headers={"content-type": "application/json"})

    return ProxyEngine(
        client=httpx.AsyncClient(transport=httpx.MockTransport(worker)),
        native=OneLease(lease),  # type: ignore[arg-type]
        metrics=ProxyMetrics(CollectorRegistry(), [TARGET.target_id]),
        agentic_context_forwarding="strip",
    )


def request_of(engine: ProxyEngine) -> ProxyRequest:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    return engine.build_request("chat", body, {"content-type": "application/json"})


async def test_the_answer_is_written_before_the_lease_is_finished_with_its_usage() -> None:
    events: list[str] = []
    lease = RecordingLease(events)
    engine = engine_with(lease)
    sink = Sink(events)
    await engine.handle(request_of(engine), sink)
    assert events == ["start 200", "end", "finish"]
    assert sink.body == ANSWER
    assert lease.outcome is not None and lease.outcome.success
    assert lease.outcome.usage is not None and lease.outcome.usage.prompt_tokens == 11
    assert lease.outcome.finish_reason == "stop"


async def test_a_failed_write_still_finishes_the_lease_with_the_usage() -> None:
    events: list[str] = []
    lease = RecordingLease(events)
    engine = engine_with(lease)
    with pytest.raises(ClientGone):
        await engine.handle(request_of(engine), Sink(events, fail_end=True))
    assert events == ["start 200", "finish"]
    assert lease.outcome is not None and lease.outcome.success
    assert lease.outcome.usage is not None and lease.outcome.usage.completion_tokens == 3
