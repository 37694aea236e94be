"""Client disconnect and graceful shutdown through a real socket.

The socket path is the point here (hypercorn's drain and cut-off, a client closing its TCP
connection), so these tests run on the real clock: every wait is bounded by a generous budget
(``BUDGET_SECONDS``, never reached on success) and nothing asserts how long real I/O took, only
ordering and outcomes.  Waits poll explicit conditions, never ``wait_all_tasks_blocked`` alone (a
task blocked on socket I/O counts as blocked while bytes are still in flight).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from functools import partial

import httpx
import pytest
import trio
import trio.lowlevel
import trio.testing
from native_fakes import FakeWorker, make_config

from daemon.handles import DaemonHandles
from daemon.supervisor import run_daemon

BUDGET_SECONDS = 180.0  # generous: a broken behaviour fails instead of hanging, success never nears it
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Checkpoint until ``predicate()`` holds (the caller bounds it with ``trio.fail_after``)."""
    while not predicate():
        await trio.testing.wait_all_tasks_blocked()
        await trio.lowlevel.checkpoint()


async def start(nursery: trio.Nursery, worker: FakeWorker, **cfg_kwargs: object) -> DaemonHandles:
    cfg = make_config(worker.worker_urls, **cfg_kwargs)  # type: ignore[arg-type]
    return await nursery.start(partial(run_daemon, cfg, transport_factory=worker.transport, rng=random.Random(3)))


async def test_native_client_disconnect_cancels_upstream_and_abandons_lease(fake_worker: FakeWorker) -> None:
    fake_worker.hold_streams = True
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)

        def outcome() -> float | None:
            return handles.registry.get_sample_value(
                "agentd_proxy_requests_total",
                {"endpoint": "chat", "target": "http://w0:8000", "outcome": "client_disconnect"},
            )

        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            async with client.stream("POST", "/v1/chat/completions", json=CHAT) as response:
                await response.aiter_raw().__anext__()
                assert handles.native_dispatcher.total_in_flight() == 1
            # leaving the block closes the connection mid-stream
        with trio.fail_after(BUDGET_SECONDS):
            await fake_worker.stream_closed.wait()
            await wait_until(
                lambda: handles.native_dispatcher.statistics().abandoned_count >= 1 and outcome() is not None
            )
        stats = handles.native_dispatcher.statistics()
        assert (stats.abandoned_count, stats.finished_count) == (1, 0)
        assert handles.native_dispatcher.total_in_flight() == 0
        assert not fake_worker.release.is_set()  # the worker never finished: it was cancelled
        assert outcome() == 1.0
        handles.request_shutdown()


async def test_native_graceful_shutdown_finishes_in_flight_then_exits(fake_worker: FakeWorker) -> None:
    fake_worker.hold_streams = True
    received: list[bytes] = []
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        url = handles.http_url
        assert url is not None
        async with httpx.AsyncClient(base_url=url, timeout=BUDGET_SECONDS) as client:
            async with client.stream("POST", "/v1/chat/completions", json=CHAT) as response:
                chunks = response.aiter_raw()
                received.append(await chunks.__anext__())
                handles.request_shutdown()
                await trio.testing.wait_all_tasks_blocked()
                async with httpx.AsyncClient(timeout=BUDGET_SECONDS) as other:  # no longer accepting
                    with pytest.raises(httpx.ConnectError):
                        await other.get(f"{url}/health")
                fake_worker.release.set()
                received.extend([c async for c in chunks])
    # run_daemon returned (the nursery exited) after the in-flight stream completed
    assert b"".join(received).endswith(b"data: [DONE]\n\n")
    assert handles.native_dispatcher.statistics().finished_count == 1


async def test_native_graceful_shutdown_answers_the_stream_at_the_grace_deadline(fake_worker: FakeWorker) -> None:
    # Real clock (the drain deadline is the point): a short grace keeps the test fast; only
    # ordering and outcome are asserted - the held stream ends with an error event and [DONE]
    # (docs/operations.md §10.4), never a bare close, and no earlier than the grace.
    grace = 0.5
    fake_worker.hold_streams = True
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start(nursery, fake_worker, grace_seconds=grace)
            async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
                async with client.stream("POST", "/v1/chat/completions", json=CHAT) as response:
                    chunks = response.aiter_raw()
                    await chunks.__anext__()
                    stopped_at = trio.current_time()
                    handles.request_shutdown()
                    rest = b"".join([c async for c in chunks])
                    cut_at = trio.current_time()
    assert cut_at - stopped_at >= grace  # drained for the whole grace, never cut early
    assert b'"code": "server_shutting_down"' in rest
    assert rest.endswith(b"data: [DONE]\n\n")
    assert not fake_worker.release.is_set()  # the worker never finished the stream
    assert handles.native_dispatcher.statistics().abandoned_count == 1


async def test_native_one_keep_alive_connection_serves_more_than_a_thousand_requests(fake_worker: FakeWorker) -> None:
    """hypercorn's default recycles a connection after 1000 requests and loses that response."""
    body = b'{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}'
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        host, port = handles.http_url.removeprefix("http://").rsplit(":", 1)
        request = (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n"
        ).encode() + body
        statuses: list[bytes] = []
        with trio.fail_after(BUDGET_SECONDS):
            stream = await trio.open_tcp_stream(host, int(port))
            buf = b""
            for _ in range(1005):
                await stream.send_all(request)
                while b"\r\n\r\n" not in buf:
                    data = await stream.receive_some(65536)
                    assert data, f"connection closed after {len(statuses)} responses"
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                assert b"connection: close" not in head.lower()
                length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
                while len(buf) < length:
                    buf += await stream.receive_some(65536)
                buf = buf[length:]
                statuses.append(head.split(b" ", 2)[1])
            await stream.aclose()
        assert statuses == [b"200"] * 1005
        handles.request_shutdown()
