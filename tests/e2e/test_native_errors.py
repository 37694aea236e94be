"""Error mapping through a real socket: OpenAI-shaped bodies, status codes, named fields/targets."""

from __future__ import annotations

import random
from functools import partial

import httpx
import pytest
import trio
from native_fakes import BUDGET_SECONDS, FakeWorker, make_config

from daemon.handles import DaemonHandles
from daemon.supervisor import run_daemon

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}


async def start(nursery: trio.Nursery, worker: FakeWorker, **cfg_kwargs: object) -> DaemonHandles:
    cfg = make_config(worker.worker_urls, **cfg_kwargs)  # type: ignore[arg-type]
    return await nursery.start(partial(run_daemon, cfg, transport_factory=worker.transport, rng=random.Random(1)))


def assert_openai_error(response: httpx.Response, status: int, code: str, param: str | None = None) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert error["param"] == param
    assert "Traceback" not in error["message"]
    return error["message"]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {**CHAT, "model": 3}, "model"),
        ("/v1/chat/completions", {**CHAT, "stream": "yes"}, "stream"),
        ("/v1/chat/completions", {"model": "m", "messages": "notalist"}, "messages"),
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": 1}]}, "messages[0].role"),
        ("/v1/chat/completions", {"model": "m", "messages": ["x"]}, "messages[0]"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": 0}, "max_tokens"),
        ("/v1/chat/completions", {**CHAT, "max_tokens": "8"}, "max_tokens"),
        ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": "y"}}, "stream_options.include_usage"),
        ("/v1/chat/completions", {**CHAT, "vllm_xargs": "nope"}, "vllm_xargs"),
        ("/v1/completions", {"model": "m", "prompt": {"a": 1}}, "prompt"),
        ("/v1/responses", {"model": "m", "input": 5}, "input"),
    ],
)
async def test_native_wrong_field_type_is_400_naming_field(
    fake_worker: FakeWorker, path: str, body: dict, param: str
) -> None:
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            response = await client.post(path, json=body)
        message = assert_openai_error(response, 400, response.json()["error"]["code"], param)
        assert param.split("[")[0].split(".")[0] in message
        assert fake_worker.generation_requests() == []
        handles.request_shutdown()


async def test_native_missing_and_malformed_bodies(fake_worker: FakeWorker) -> None:
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            malformed = await client.post(
                "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
            )
            array = await client.post("/v1/chat/completions", json=[1, 2])
            missing = await client.post("/v1/chat/completions", json={"model": "m"})
            binary = await client.post("/v1/completions", content=b"\xff\xfe")
        assert "not valid JSON" in assert_openai_error(malformed, 400, "invalid_json")
        assert "JSON object" in assert_openai_error(array, 400, "invalid_json")
        assert_openai_error(missing, 400, "missing_field", "messages")
        assert_openai_error(binary, 400, "invalid_json")
        handles.request_shutdown()


async def test_native_body_over_limit_is_413(fake_worker: FakeWorker) -> None:
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker, max_body_bytes=1000)
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 2000}]}
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            response = await client.post("/v1/chat/completions", json=big)

            async def chunked():  # no content-length: the limit is enforced while reading
                for _ in range(3):
                    yield b"x" * 600

            streamed = await client.post("/v1/chat/completions", content=chunked())
        assert "1000" in assert_openai_error(response, 413, "body_too_large")
        assert_openai_error(streamed, 413, "body_too_large")
        handles.request_shutdown()


async def test_native_unknown_route_404_and_wrong_method_405(fake_worker: FakeWorker) -> None:
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            unknown = await client.get("/v1/nothing")
            wrong = await client.get("/v1/chat/completions")
            wrong_health = await client.post("/health")
            wrong_models = await client.delete("/v1/models")
        assert "/v1/nothing" in assert_openai_error(unknown, 404, "not_found")
        assert_openai_error(wrong, 405, "method_not_allowed")
        assert wrong.headers["allow"] == "POST"
        assert_openai_error(wrong_health, 405, "method_not_allowed")
        # in one order, whatever the process's hash seed (one relay and another answered alike)
        assert_openai_error(wrong_models, 405, "method_not_allowed")
        assert wrong_health.headers["allow"] == wrong_models.headers["allow"] == "GET, HEAD, OPTIONS"
        handles.request_shutdown()


async def test_native_worker_unreachable_fails_over_and_is_ejected(fake_worker: FakeWorker) -> None:
    """Connection refused: nothing was sent, so the request goes to the healthy peer (no error for
    the client) and the refusing worker leaves rotation at once (docs/operations.md §11)."""
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker, policy="round_robin")
        fake_worker.unreachable.add("http://w0:8000")  # after the health round: still in rotation
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            response = await client.post("/v1/chat/completions", json=CHAT)
            again = await client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 200 and again.status_code == 200
        assert [r.base_url for r in fake_worker.generation_requests()] == ["http://w1:8000"] * 2
        value = handles.registry.get_sample_value
        assert value("agentd_proxy_upstream_errors_total", {"target": "http://w0:8000", "kind": "unreachable"}) == 0
        assert value("agentd_proxy_failovers_total", {"target": "http://w0:8000"}) == 1.0
        assert value("agentd_health_ejections_total", {"target": "http://w0:8000", "source": "outlier"}) == 1.0
        assert value("agentd_health_target_healthy", {"target": "http://w0:8000"}) == 0.0
        assert handles.health.worker("http://w0:8000").reason.startswith("ejected: unreachable")
        handles.request_shutdown()


async def test_native_only_worker_unreachable_is_502_naming_target() -> None:
    worker = FakeWorker(("http://w0:8000",))
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, worker)
        worker.unreachable.add("http://w0:8000")
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            response = await client.post("/v1/chat/completions", json=CHAT)
        message = assert_openai_error(response, 502, "upstream_unreachable")
        assert "http://w0:8000" in message
        assert response.json()["error"]["type"] == "upstream_error"
        errors = handles.registry.get_sample_value(
            "agentd_proxy_upstream_errors_total", {"target": "http://w0:8000", "kind": "unreachable"}
        )
        assert errors == 1.0
        handles.request_shutdown()


@pytest.mark.parametrize(("worker_status", "status"), [(500, 502), (503, 503)])
async def test_native_worker_failing_maps_to_5xx_naming_target(
    fake_worker: FakeWorker, worker_status: int, status: int
) -> None:
    fake_worker.fail_status = worker_status
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            response = await client.post("/v1/chat/completions", json=CHAT)
        message = assert_openai_error(response, status, "upstream_status")
        assert "http://w0:8000" in message and f"HTTP {worker_status}" in message
        handles.request_shutdown()


async def test_native_worker_4xx_relayed_unchanged(fake_worker: FakeWorker) -> None:
    fake_worker.fail_status = 400
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            response = await client.post("/v1/chat/completions", json=CHAT)
        assert response.status_code == 400
        assert response.json() == {"error": {"message": "worker exploded"}}
        handles.request_shutdown()


async def test_native_stream_broken_mid_way_ends_with_error_event(fake_worker: FakeWorker) -> None:
    fake_worker.break_stream_after_chunks = True
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker)
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert response.status_code == 200
        *_, error, done = [e for e in response.content.split(b"\n\n") if e]
        assert b'"code": "upstream_stream"' in error and b"http://w0:8000" in error
        assert done == b"data: [DONE]"
        handles.request_shutdown()
