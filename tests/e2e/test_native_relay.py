"""End to end through a real hypercorn socket: relay, streaming, DP header, usage injection."""

from __future__ import annotations

import json
import random
from functools import partial

import attrs
import httpx
import trio
import trio.testing
from native_fakes import BUDGET_SECONDS, FakeWorker, make_config

from daemon.config import PrometheusConfig
from daemon.handles import DaemonHandles
from daemon.supervisor import run_daemon

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


async def start(nursery: trio.Nursery, worker: FakeWorker, **cfg_kwargs: object) -> DaemonHandles:
    cfg = make_config(worker.worker_urls, **cfg_kwargs)  # type: ignore[arg-type]
    return await nursery.start(partial(run_daemon, cfg, transport_factory=worker.transport, rng=random.Random(7)))


async def test_native_non_streaming_chat_relayed_whole(fake_worker: FakeWorker) -> None:
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            response = await client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 200
        assert response.json()["choices"][0]["message"]["content"] == "Hello world"
        assert response.headers["content-type"] == "application/json"
        [seen] = fake_worker.generation_requests()
        assert seen.path == "/v1/chat/completions"
        assert json.loads(seen.raw) == CHAT
        await trio.testing.wait_all_tasks_blocked()
        handles.request_shutdown()
    assert handles.native_dispatcher.statistics().finished_count == 1
    # the server's own "stream closed" after a complete response is not a client disconnect
    assert (
        handles.registry.get_sample_value(
            "agentd_proxy_requests_total", {"endpoint": "chat", "target": "http://w0:8000", "outcome": "success"}
        )
        == 1.0
    )


async def test_native_streaming_chat_relayed_chunk_by_chunk(fake_worker: FakeWorker) -> None:
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        body = {**CHAT, "stream": True}
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                assert response.headers["content-type"] == "text/event-stream"
                raw = b"".join([chunk async for chunk in response.aiter_raw()])
        events = [e for e in raw.split(b"\n\n") if e]
        assert events[-1] == b"data: [DONE]"
        contents = [json.loads(e[6:])["choices"][0]["delta"].get("content") for e in events[:-1]]
        assert contents == ["", "Hello", " world"]
        # the client did not ask for usage and the native path does not want it: no injection
        [seen] = fake_worker.generation_requests()
        assert "stream_options" not in seen.body
        await trio.testing.wait_all_tasks_blocked()
        assert (
            handles.registry.get_sample_value(
                "agentd_proxy_requests_total", {"endpoint": "chat", "target": "http://w0:8000", "outcome": "success"}
            )
            == 1.0
        )
        handles.request_shutdown()


async def test_native_streaming_first_chunk_arrives_before_stream_ends(fake_worker: FakeWorker) -> None:
    fake_worker.hold_streams = True
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as response:
                chunks = response.aiter_raw()
                # the worker cannot produce the rest before `release`: getting the first chunk
                # now proves the proxy relays without waiting for the end of the stream
                first = await chunks.__anext__()
                await trio.testing.wait_all_tasks_blocked()
                assert fake_worker.holding == 1
                assert b'"role": "assistant"' in first
                fake_worker.release.set()
                rest = b"".join([c async for c in chunks])
        assert rest.endswith(b"data: [DONE]\n\n")
        handles.request_shutdown()


async def test_native_completions_and_responses_relayed(fake_worker: FakeWorker) -> None:
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            completion = await client.post("/v1/completions", json={"model": "fake-model", "prompt": "say"})
            response = await client.post("/v1/responses", json={"model": "fake-model", "input": "hello"})
            streamed = await client.post("/v1/responses", json={"model": "fake-model", "input": "x", "stream": True})
        assert completion.status_code == 200 and completion.json()["choices"][0]["text"] == "ok!"
        assert response.status_code == 200 and response.json()["usage"]["input_tokens"] == 9
        assert streamed.status_code == 200 and b"response.completed" in streamed.content
        assert [r.path for r in fake_worker.generation_requests()] == [
            "/v1/completions",
            "/v1/responses",
            "/v1/responses",
        ]
        handles.request_shutdown()


async def test_native_dp_rank_header_set_and_client_header_not_passed(fake_worker: FakeWorker) -> None:
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker, dp=2, policy="round_robin")
        assert [t.target_id for t in handles.targets] == [
            "http://w0:8000@0",
            "http://w0:8000@1",
            "http://w1:8000@0",
            "http://w1:8000@1",
        ]
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            for _ in range(4):
                response = await client.post(
                    "/v1/chat/completions",
                    json=CHAT,
                    headers={
                        "X-Data-Parallel-Rank": "7",
                        "Connection": "keep-alive, x-hop",
                        "x-hop": "1",
                        "x-custom": "kept",
                    },
                )
                assert response.status_code == 200
        seen = fake_worker.generation_requests()
        assert [(r.base_url, r.headers["x-data-parallel-rank"]) for r in seen] == [
            ("http://w0:8000", "0"),
            ("http://w0:8000", "1"),
            ("http://w1:8000", "0"),
            ("http://w1:8000", "1"),
        ]
        for r in seen:
            assert "@" not in r.base_url
            assert r.headers["x-custom"] == "kept"
            assert "x-hop" not in r.headers  # named in Connection: hop-by-hop
        handles.request_shutdown()


async def test_native_models_from_first_healthy_worker(fake_worker: FakeWorker) -> None:
    fake_worker.healthy["http://w0:8000"] = False
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            response = await client.get("/v1/models")
        assert response.status_code == 200
        assert response.json()["data"][0]["id"] == "fake-model"
        seen = [r for r in fake_worker.requests if r.path == "/v1/models"][-1]  # after start-up discovery
        assert seen.base_url == "http://w1:8000"
        handles.request_shutdown()


async def test_a_model_list_without_a_content_type_is_not_served_as_html(fake_worker: FakeWorker) -> None:
    """Quart labelled it text/html: worker-chosen text as HTML on agentd's origin, the dashboard's
    when there is no admin listener (session-35 security walk)."""
    fake_worker.models_without_content_type = True
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            listing = await client.get("/v1/models")
            one = await client.get("/v1/models/fake-model")
        assert listing.status_code == 200 and listing.headers["content-type"] == "application/json"
        assert listing.headers.get_list("content-type") == ["application/json"]
        assert one.status_code == 200 and one.headers["content-type"].startswith("application/json")
        handles.request_shutdown()


async def test_native_agentic_context_stripped_by_default(fake_worker: FakeWorker) -> None:
    body = {**CHAT, "vllm_xargs": {"agentic_context": {"program_id": "p1"}, "other": 1}}
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200
        [seen] = fake_worker.generation_requests()
        assert seen.body == {**CHAT, "vllm_xargs": {"other": 1}}
        handles.request_shutdown()


async def test_native_no_healthy_target_is_503_naming_reason(fake_worker: FakeWorker) -> None:
    for url in fake_worker.worker_urls:
        fake_worker.healthy[url] = False
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            response = await client.post("/v1/chat/completions", json=CHAT)
            health = await client.get("/health")
            models = await client.get("/v1/models")
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["code"] == "no_healthy_target"
        # when to try again: [limits] retry_after_seconds (default 1), as agentd's other 429/503s
        assert response.headers["retry-after"] == "1"
        assert (models.status_code, models.headers["retry-after"]) == (503, "1")
        assert "http://w0:8000: HTTP 503" in error["message"]
        assert health.status_code == 503
        assert "http://w1:8000: HTTP 503" in health.json()["reason"]
        assert fake_worker.generation_requests() == []
        handles.request_shutdown()


async def test_native_metrics_on_extra_prometheus_listener(fake_worker: FakeWorker) -> None:
    cfg = attrs.evolve(make_config(fake_worker.worker_urls), prometheus=PrometheusConfig(host="127.0.0.1", port=0))
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(partial(run_daemon, cfg, transport_factory=fake_worker.transport))
        assert handles.metrics_url is not None and handles.metrics_url != handles.http_url
        async with httpx.AsyncClient(timeout=BUDGET_SECONDS) as client:
            await client.post(f"{handles.http_url}/v1/chat/completions", json=CHAT)
            await trio.testing.wait_all_tasks_blocked()
            scrape = await client.get(f"{handles.metrics_url}/metrics")
            other = await client.get(f"{handles.metrics_url}/v1/models")
        assert scrape.status_code == 200
        assert (
            'agentd_proxy_requests_total{endpoint="chat",outcome="success",target="http://w0:8000"} 1.0' in scrape.text
        )
        assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"
        handles.request_shutdown()


async def test_native_agentic_context_json_string_and_unchanged_modes(fake_worker: FakeWorker) -> None:
    ctx = {"program_id": "p1", "step_id": 2}
    body = {**CHAT, "vllm_xargs": {"agentic_context": ctx}}
    forwarded = {}
    for mode in ("json_string", "unchanged"):
        worker = FakeWorker(fake_worker.worker_urls)
        base = make_config(worker.worker_urls)
        cfg = attrs.evolve(base, routing=attrs.evolve(base.routing, agentic_context_forwarding=mode))
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, cfg, transport_factory=worker.transport))
            async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
                assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
            handles.request_shutdown()
        [seen] = worker.generation_requests()
        forwarded[mode] = seen.body["vllm_xargs"]["agentic_context"]
    assert json.loads(forwarded["json_string"]) == ctx and isinstance(forwarded["json_string"], str)
    assert forwarded["unchanged"] == ctx
