"""Large request bodies are held within a per-process budget (docs/operations.md §14).

A parsed JSON body lives as long as its request and takes up to about 20 times the body's size in
memory (a body of a million small members, 12 MB, took 300 MB); six such bodies at once took the
daemon from 254 MB to 1.7 GB (session-35 security walk).  Session 35 parsed bodies over
``LARGE_BODY_BYTES`` one at a time, which bounded nothing: the parse is synchronous, and the parsed
body outlives it (six 14 MB bodies still peaked at 1,050 MB, session 36).  Now the bytes of such
bodies held at once, from before the parse to the request's end, are bounded by
``limits.max_large_body_bytes_in_flight``; a request over it waits in FIFO order up to
``queue_timeout_seconds``, then gets a JSON 503; smaller bodies never wait.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio
import trio.testing

from daemon.config import BatchApiConfig
from daemon.config_loading import load_config
from daemon.http.app import AgentdApp, create_app
from daemon.http.edge import LARGE_BODY_BYTES
from daemon.supervisor import run_daemon

ROOT = Path(__file__).resolve().parents[2]


def chat(padding: int = 0, **extra: Any) -> bytes:
    body = {"model": "agentd-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}
    if padding:
        body["metadata_padding"] = "x" * padding  # an unknown member: forwarded as it is
    return json.dumps(body).encode()


@asynccontextmanager
async def quickstart(tmp_path: Path, **limits: Any) -> AsyncIterator[tuple[AgentdApp, httpx.AsyncClient]]:
    cfg = load_config(ROOT / "configs" / "quickstart.toml")
    cfg = attrs.evolve(
        cfg,
        batch_api=BatchApiConfig(database_path=str(tmp_path / "b.sqlite3")),
        limits=attrs.evolve(cfg.limits, **limits),
    )
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, cfg, serve_http=False))
            app = create_app(handles)
            transport = httpx.ASGITransport(app)  # type: ignore[arg-type]
            async with httpx.AsyncClient(transport=transport, base_url="http://agentd", timeout=600) as client:
                yield app, client
            handles.request_shutdown()


async def test_a_large_body_holds_its_bytes_until_its_request_ends(tmp_path: Path) -> None:
    async with quickstart(tmp_path) as (app, client):
        post = partial(client.post, "/v1/chat/completions", headers={"content-type": "application/json"})
        body = chat(LARGE_BODY_BYTES + 1, max_tokens=64)
        answers: list[int] = []

        async def large() -> None:
            answers.append((await post(content=body)).status_code)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(large)
            await trio.testing.wait_all_tasks_blocked()  # the simulated worker is decoding
            assert answers == [] and app.edge.statistics().in_flight == 1
            assert app.edge.statistics().large_body_bytes_in_flight == len(body)
        assert answers == [200] and app.edge.statistics().large_body_bytes_in_flight == 0
        small = await post(content=chat(LARGE_BODY_BYTES // 2))
        assert small.status_code == 200
        assert app.edge.statistics().large_body_bytes_in_flight == 0  # a smaller body never counts


async def test_large_bodies_over_the_budget_wait_in_order_and_time_out(tmp_path: Path) -> None:
    budget = 3 * LARGE_BODY_BYTES
    async with quickstart(tmp_path, max_large_body_bytes_in_flight=budget, queue_timeout_seconds=0.5) as (app, client):
        post = partial(client.post, "/v1/chat/completions", headers={"content-type": "application/json"})
        bodies = app.edge.large_bodies
        held = await bodies.take(2 * LARGE_BODY_BYTES, 1.0)  # another request holds two thirds
        answers: list[tuple[str, int]] = []

        async def large(name: str, size: int) -> None:
            answers.append((name, (await post(content=chat(size))).status_code))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(large, "first", 2 * LARGE_BODY_BYTES)  # does not fit: waits
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(large, "second", LARGE_BODY_BYTES + 1)  # would fit, but queues behind it
            await trio.testing.wait_all_tasks_blocked()
            assert (bodies.held, bodies.waiting) == (held, 2)
            small = await post(content=chat(LARGE_BODY_BYTES // 2))
            assert small.status_code == 200 and answers == []  # a smaller body does not wait
            bodies.give_back(held)
        assert sorted(answers) == [("first", 200), ("second", 200)]
        assert bodies.held == 0

        held = await bodies.take(budget, 1.0)
        refused = await post(content=chat(LARGE_BODY_BYTES + 1))  # nothing ends within 0.5 s
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["code"] == "queue_timeout" and "limits.max_large_body_bytes_in_flight" in error["message"]
        bodies.give_back(held)
        assert app.edge.statistics().refused_large_body_timeout_count == 1
        metrics = (await client.get("/metrics")).text
        assert 'agentd_edge_refused_requests_total{reason="large_body_timeout"} 1.0' in metrics
        assert "agentd_edge_large_body_bytes 0.0" in metrics


async def test_the_drain_turns_large_body_waiters_away(tmp_path: Path) -> None:
    async with quickstart(tmp_path, max_large_body_bytes_in_flight=2 * LARGE_BODY_BYTES) as (app, client):
        bodies = app.edge.large_bodies
        held = await bodies.take(2 * LARGE_BODY_BYTES, 1.0)
        answers: list[httpx.Response] = []

        async def large() -> None:
            answers.append(await client.post("/v1/chat/completions", content=chat(LARGE_BODY_BYTES + 1)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(large)
            await trio.testing.wait_all_tasks_blocked()
            assert bodies.waiting == 1
            app.edge.begin_drain(30.0)
        (answer,) = answers
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "server_shutting_down"
        bodies.give_back(held)
        assert bodies.held == 0
