"""Client disconnect and graceful shutdown through a real socket."""

from __future__ import annotations

import random
from functools import partial

import httpx
import pytest
import trio
import trio.testing

from native_fakes import FakeWorker, make_config
from daemon.handles import DaemonHandles
from daemon.supervisor import run_daemon

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def start(nursery: trio.Nursery, worker: FakeWorker, **cfg_kwargs: object) -> DaemonHandles:
    cfg = make_config(worker.worker_urls, **cfg_kwargs)  # type: ignore[arg-type]
    return await nursery.start(partial(run_daemon, cfg, transport_factory=worker.transport, rng=random.Random(3)))


async def test_native_client_disconnect_cancels_upstream_and_abandons_lease(fake_worker: FakeWorker) -> None:
    fake_worker.hold_streams = True
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=None) as client:
            async with client.stream("POST", "/v1/chat/completions", json=CHAT) as response:
                await response.aiter_raw().__anext__()
                assert handles.native_dispatcher.total_in_flight() == 1
            # leaving the block closes the connection mid-stream
        with trio.fail_after(10):
            await fake_worker.stream_closed.wait()
        await trio.testing.wait_all_tasks_blocked()
        stats = handles.native_dispatcher.statistics()
        assert (stats.abandoned_count, stats.finished_count) == (1, 0)
        assert handles.native_dispatcher.total_in_flight() == 0
        assert not fake_worker.release.is_set()  # the worker never finished: it was cancelled
        outcome = handles.registry.get_sample_value(
            "agentd_proxy_requests_total",
            {"endpoint": "chat", "target": "http://w0:8000@0", "outcome": "client_disconnect"})
        assert outcome == 1.0
        handles.request_shutdown()


async def test_native_graceful_shutdown_finishes_in_flight_then_exits(fake_worker: FakeWorker) -> None:
    fake_worker.hold_streams = True
    received: list[bytes] = []
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        url = handles.http_url
        assert url is not None
        async with httpx.AsyncClient(base_url=url, timeout=None) as client:
            async with client.stream("POST", "/v1/chat/completions", json=CHAT) as response:
                chunks = response.aiter_raw()
                received.append(await chunks.__anext__())
                handles.request_shutdown()
                await trio.testing.wait_all_tasks_blocked()
                async with httpx.AsyncClient(timeout=None) as other:  # no longer accepting
                    with pytest.raises(httpx.ConnectError):
                        await other.get(f"{url}/health")
                fake_worker.release.set()
                received.extend([c async for c in chunks])
    # run_daemon returned (the nursery exited) after the in-flight stream completed
    assert b"".join(received).endswith(b"data: [DONE]\n\n")
    assert handles.native_dispatcher.statistics().finished_count == 1


async def test_native_graceful_shutdown_cancels_after_grace(
    fake_worker: FakeWorker, autojump_clock: trio.testing.MockClock
) -> None:
    fake_worker.hold_streams = True
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker, grace_seconds=7.0)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=None) as client:
            async with client.stream("POST", "/v1/chat/completions", json=CHAT) as response:
                chunks = response.aiter_raw()
                await chunks.__anext__()
                stopped_at = trio.current_time()
                handles.request_shutdown()
                with pytest.raises(httpx.RemoteProtocolError):  # cut off when the grace ran out
                    _ = [c async for c in chunks]
    assert trio.current_time() - stopped_at == pytest.approx(7.0)
    assert handles.native_dispatcher.statistics().abandoned_count == 1
