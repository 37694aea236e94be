"""vLLM's other inference routes through agentd (docs/operations.md §12.1).

``/v1/embeddings``, ``/pooling``, ``/classify``, the score and rerank routes, ``/tokenize`` and
``/detokenize`` are forwarded identity-free through the native policy: the client's bytes reach the
worker unchanged (no ``agentic_context`` strip, no ``priority``), Program scheduling never sees them,
and the edge's checks and limits apply as to the agent routes.  Before session 33 each was a 404.
"""

from __future__ import annotations

from functools import partial

import attrs
import httpx
import trio
from fault_env import BUDGET_SECONDS, fault_config, fault_env
from fault_worker import FaultWorker

from daemon.http.requests import FORWARDED_ENDPOINTS
from daemon.supervisor import run_daemon

# odd spacing, a Program context and a priority: agentd forwards these bytes exactly as they are
RAW = (
    b'{ "model" : "fault-model",  "input": ["a", "b"],\n "priority": 3,'
    b' "vllm_xargs": {"agentic_context": {"program_id": "p-1"}} }'
)


async def test_every_forwarded_route_reaches_the_worker_byte_for_byte() -> None:
    async with fault_env(1, program=True) as env:
        [worker] = env.workers
        for path in FORWARDED_ENDPOINTS:
            response = await env.client.post(
                path, content=RAW, headers={"content-type": "application/json", "x-request-id": "mine-1"}
            )
            assert response.status_code == 200, (path, response.text)
            assert response.headers["x-request-id"] == "mine-1"
            seen = worker.requests[-1]
            assert (seen.method, seen.path, seen.body) == ("POST", path, RAW)
        # never a Program: nothing was submitted to the scheduler, nothing is held
        doc = (await env.client.get("/scheduling/diagnostics")).json()
        assert all(rank["programs"] == [] for rank in doc.get("ranks", [])), doc
        assert doc["invariants"]["at_rest"] and doc["invariants"]["program_open_leases"] == 0, doc
        metrics = (await env.client.get("/metrics")).text
        assert 'agentd_proxy_requests_total{endpoint="embeddings",outcome="success"' in metrics
        await env.check_clean()


async def test_forwarded_routes_refuse_bad_input_like_the_agent_routes() -> None:
    async with fault_env(1) as env:
        [worker] = env.workers
        cases = [
            ("/v1/embeddings", b"not json", 400, "invalid_json", None),
            ("/v1/embeddings", b"[1, 2]", 400, None, None),
            ("/tokenize", b'{"model": 5, "prompt": "x"}', 400, "invalid_type", "model"),
            ("/v1/rerank", b'{"query": "\\ud800"}', 400, None, None),
        ]
        for path, raw, status, code, param in cases:
            response = await env.client.post(path, content=raw, headers={"content-type": "application/json"})
            assert response.status_code == status, (path, raw, response.text)
            error = response.json()["error"]
            if code is not None:
                assert error["code"] == code, error
            if param is not None:
                assert error["param"] == param, error
        # a route agentd does not forward stays a 404; GET on a forwarded route is a 405
        assert (await env.client.post("/v1/moderations", json={"input": "x"})).status_code == 404
        response = await env.client.get("/v1/embeddings")
        assert response.status_code == 405 and response.headers["allow"] == "POST"
        assert [r.path for r in worker.requests if r.method == "POST"] == []
        await env.check_clean()


async def test_a_forwarded_body_over_the_limit_is_a_413() -> None:
    async with trio.open_nursery() as nursery:
        worker: FaultWorker = await nursery.start(FaultWorker().run)
        cfg = fault_config([worker.url])
        cfg = attrs.evolve(cfg, server=attrs.evolve(cfg.server, max_body_bytes=1024))
        with trio.fail_after(BUDGET_SECONDS):
            handles = await nursery.start(partial(run_daemon, cfg))
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            response = await client.post("/v1/embeddings", json={"input": "x" * 2000})
            assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"
            assert (await client.post("/v1/embeddings", json={"input": "x"})).status_code == 200
        assert [r.path for r in worker.requests if r.method == "POST"] == ["/v1/embeddings"]
        handles.request_shutdown()
        nursery.cancel_scope.cancel()


async def test_relay_processes_forward_them_too() -> None:
    async with trio.open_nursery() as nursery:
        worker: FaultWorker = await nursery.start(FaultWorker().run)
        cfg = fault_config([worker.url])
        cfg = attrs.evolve(cfg, server=attrs.evolve(cfg.server, data_plane_processes=2))
        with trio.fail_after(BUDGET_SECONDS):
            handles = await nursery.start(partial(run_daemon, cfg))
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            for _ in range(4):  # new connections: the relays take turns accepting them
                response = await client.post(
                    "/v1/embeddings", content=RAW, headers={"connection": "close", "content-type": "application/json"}
                )
                assert response.status_code == 200, response.text
        assert [(r.path, r.body) for r in worker.requests if r.method == "POST"] == [("/v1/embeddings", RAW)] * 4
        handles.request_shutdown()
        nursery.cancel_scope.cancel()
