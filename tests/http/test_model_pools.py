"""Model pools (issue 14 §7): served models discovered from each worker's ``/v1/models`` or
configured, requests only to workers serving their model, 404 ``model_not_found``, and the pool
passed to Program scheduling (the core keys Program state by it)."""

from __future__ import annotations

import json
import logging
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import httpx
import pytest
import trio
import trio.testing
from log_capture import EventLog

from actors.core.config import BackendTarget, ProgramSchedulingConfig
from actors.core.ids import DEFAULT_MODEL_POOL
from daemon.config import AgentdConfig, RoutingConfig, ServerConfig
from daemon.handles import DaemonHandles
from daemon.http.diagnostics import proxy_section
from daemon.http.errors import ApiError
from daemon.models import ModelDirectory, served_model_ids, with_pool_models
from daemon.program_dispatch import ProgramDispatcher
from daemon.supervisor import run_daemon

W0, W1, W2 = "http://w0:8000", "http://w1:8000", "http://w2:8000"
SERVED = {W0: ["a"], W1: ["b", "shared"], W2: None}  # W2's /v1/models fails


class PoolWorkers:
    def __init__(self) -> None:
        self.generations: list[tuple[str, str]] = []  # (worker, model)
        self.served = dict(SERVED)
        self.healthy = {W0: True, W1: True, W2: True}
        self.model_reads: list[str] = []  # worker of each GET /v1/models
        self.broken: set[str] = set()  # workers whose /v1/models answers 500 for now

    async def handler(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        path = request.url.path
        if path == "/health":
            return httpx.Response(200 if self.healthy[base] else 503)
        if path == "/metrics":
            return httpx.Response(200, text='vllm:num_requests_running{engine="0"} 0\n')
        if path == "/v1/models":
            self.model_reads.append(base)
            models = self.served[base]
            if models is None or base in self.broken:
                return httpx.Response(500, text="boom")
            return httpx.Response(200, json={"object": "list", "data": [{"id": m} for m in [*models, "shared"]]})
        body = json.loads(await request.aread())
        self.generations.append((base, body.get("model")))
        return httpx.Response(
            200,
            json={"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 3}},
        )


def pool_config(**routing: object) -> AgentdConfig:
    return AgentdConfig(
        server=ServerConfig(port=0),
        routing=RoutingConfig(worker_urls=(W0, W1, W2), policy="round_robin", **routing),  # type: ignore[arg-type]
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(),
    )


@asynccontextmanager
async def daemon(cfg: AgentdConfig, workers: PoolWorkers) -> AsyncIterator[DaemonHandles]:
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(
            partial(
                run_daemon,
                cfg,
                transport_factory=lambda c: httpx.MockTransport(workers.handler),
                serve_http=False,
                rng=random.Random(0),
            )
        )
        yield handles
        handles.request_shutdown()


def chat(model: str | None, program: str | None = None) -> bytes:
    body: dict[str, object] = {"messages": [{"role": "user", "content": "hi"}]}
    if model is not None:
        body["model"] = model
    if program is not None:
        body["vllm_xargs"] = {"agentic_context": {"program_id": program}}
    return json.dumps(body).encode()


def test_directory_routes_by_model_and_keeps_the_default_pool_when_all_serve_it() -> None:
    targets = tuple(BackendTarget(u, r, f"{u}@{r}", 2 * i + r) for i, u in enumerate((W0, W1)) for r in range(2))
    one = ModelDirectory(targets, {W0: ["m"], W1: ["m"]})
    assert one.route("m") == (DEFAULT_MODEL_POOL, None) and one.route(None) == (DEFAULT_MODEL_POOL, None)
    with pytest.raises(ApiError) as caught:
        one.route("other")
    assert (caught.value.status, caught.value.code, caught.value.param) == (404, "model_not_found", "model")
    two = ModelDirectory(targets, {W0: ["a"]})  # W1 unknown: serves any model
    assert two.route("a") == (DEFAULT_MODEL_POOL, None)
    assert two.route("z") == ("z", frozenset({2, 3}))
    two.set_models(W1, frozenset({"b"}))
    assert two.route("b") == ("b", frozenset({2, 3})) and two.route("a") == ("a", frozenset({0, 1}))
    two.set_models(W0, frozenset({"changed"}))  # configured workers keep their configured list
    assert two.route("a") == ("a", frozenset({0, 1}))
    assert served_model_ids({"data": [{"id": "x"}, {"id": 3}, "y"]}) == frozenset({"x"})
    assert served_model_ids({"data": []}) is None and served_model_ids([1]) is None
    listed = json.loads(with_pool_models(b'{"object":"list","data":[{"id":"b"}]}', two))
    assert [m["id"] for m in listed["data"]] == ["b", "a"]  # every worker's models, once
    assert with_pool_models(b"not json", two) == b"not json"


async def test_requests_go_only_to_workers_serving_their_model(autojump_clock: trio.testing.MockClock) -> None:
    workers = PoolWorkers()
    async with daemon(pool_config(), workers) as handles:
        for model in ["a", "a", "b", "b", "shared", "shared", "shared", "unknown-to-all-but-w2"]:
            sink = await handles.handle_collect(handles.build_request("chat", chat(model), {}))
            assert sink.status == 200
        seen = {(w, m) for w, m in workers.generations}
        assert {w for w, m in seen if m == "a"} <= {W0, W2}  # W2's list is unknown: it serves any model
        assert {w for w, m in seen if m == "b"} <= {W1, W2}
        assert {w for w, m in seen if m == "shared"} == {W0, W1, W2}
        assert {w for w, m in seen if m == "unknown-to-all-but-w2"} == {W2}
        req = handles.build_request("chat", chat("shared"), {})
        assert (req.model_pool, req.pool_targets) == (DEFAULT_MODEL_POOL, None)  # served everywhere


async def test_unknown_model_is_404_and_program_state_is_kept_per_pool(
    autojump_clock: trio.testing.MockClock,
) -> None:
    workers = PoolWorkers()
    cfg = pool_config(served_models={W2: ["c"]})  # configured: W2's failing /v1/models is not asked
    async with daemon(cfg, workers) as handles:
        with pytest.raises(ApiError) as caught:
            handles.build_request("chat", chat("nope"), {})
        assert (caught.value.status, caught.value.code) == (404, "model_not_found")
        assert "a" in caught.value.message and "c" in caught.value.message
        for model in ("a", "b", "c"):
            sink = await handles.handle_collect(handles.build_request("chat", chat(model, program="p1"), {}))
            assert sink.status == 200
        assert [w for w, _ in workers.generations] == [W0, W1, W2]
        ps = handles.program_dispatcher
        assert isinstance(ps, ProgramDispatcher)
        # one Program id, three pools: three Programs, each bound inside its own pool
        pools = {key.model_pool: p.home_target for key, p in ps.scheduler.state.programs.items()}
        assert pools == {"a": W0, "b": W1, "c": W2}
        estimates = {row["model_pool"] for row in ps.diagnostics()["token_estimation"]}
        assert estimates == {"a", "b", "c"}
        assert proxy_section(handles)["models"] == [
            {"worker_url": W0, "models": ["a", "shared"], "source": "discovered"},
            {"worker_url": W1, "models": ["b", "shared"], "source": "discovered"},
            {"worker_url": W2, "models": ["c"], "source": "config"},
        ]


async def test_a_worker_whose_list_was_unknown_is_learnt_and_pools_follow_health(
    autojump_clock: trio.testing.MockClock,
) -> None:
    workers = PoolWorkers()
    async with daemon(pool_config(), workers) as handles:
        assert handles.engine.models is not None
        assert handles.engine.models.unknown() == (W2,)
        workers.served[W2] = ["c"]  # W2's /v1/models works now: learnt at the next retry
        await trio.sleep(handles.config.routing.health_check_interval_seconds + 0.5)
        assert handles.engine.models.unknown() == ()
        with pytest.raises(ApiError):
            handles.build_request("chat", chat("nope"), {})
        sink = await handles.handle_collect(handles.build_request("chat", chat("a", program="p1"), {}))
        assert sink.status == 200
        ps = handles.program_dispatcher
        assert isinstance(ps, ProgramDispatcher)
        assert ps.scheduler.state.pools["a"] == (W0,)
        workers.healthy[W0] = False  # once the health board takes W0 out, pool "a" is emptied at the next tick
        await trio.sleep(3 * handles.config.routing.health_check_interval_seconds + 2.0)  # up to 3 failed checks
        assert ps.scheduler.state.pools["a"] == ()
        assert ps.scheduler.state.pools[DEFAULT_MODEL_POOL] == (W1, W2)


async def test_model_lists_are_refreshed_every_health_interval_and_a_change_is_logged_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    records = EventLog()
    models_logger = logging.getLogger("agentd.models")
    models_logger.addHandler(records)
    old_level = models_logger.level
    models_logger.setLevel(logging.INFO)
    workers = PoolWorkers()
    workers.served[W2] = ["c"]
    try:
        async with daemon(pool_config(), workers) as handles:
            directory = handles.engine.models
            assert directory is not None
            interval = handles.config.routing.health_check_interval_seconds
            start = trio.current_time()
            assert handles.build_request("chat", chat("a"), {}).model_pool == "a"
            workers.served[W0] = ["z"]  # W0 restarted with another model
            await trio.sleep(interval + 0.5)
            assert directory.models[W0] == frozenset({"z", "shared"})
            assert handles.build_request("chat", chat("z"), {}).model_pool == "z"
            with pytest.raises(ApiError) as gone:
                handles.build_request("chat", chat("a"), {})
            assert gone.value.status == 404 and gone.value.param == "model"
            workers.broken.add(W0)  # a failed refresh keeps the last list read
            await trio.sleep(3 * interval)
            assert directory.models[W0] == frozenset({"z", "shared"})
            workers.broken.clear()
            await trio.sleep(3 * interval)
            elapsed = trio.current_time() - start
            changed = [f for _, e, f in records.events if e == "models_changed"]
            assert changed == [{"worker": W0, "models": "shared,z", "added": "z", "removed": "a"}]  # once
            failures = [f for _, e, f in records.events if e == "models_discovered" and f["worker"] == W0]
            assert len(failures) == 3  # the first list, the failure kind once, the recovery once
            # bounded: one read per worker per interval (plus the one at start)
            reads = workers.model_reads.count(W0)
            assert reads == int(elapsed // interval) + 1
    finally:
        models_logger.removeHandler(records)
        models_logger.setLevel(old_level)


async def test_configured_workers_are_never_read_again(autojump_clock: trio.testing.MockClock) -> None:
    workers = PoolWorkers()
    cfg = pool_config(served_models={W0: ["a"], W1: ["b"], W2: ["c"]})
    async with daemon(cfg, workers) as handles:
        await trio.sleep(5 * handles.config.routing.health_check_interval_seconds)
    assert workers.model_reads == []
