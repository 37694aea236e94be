"""vLLM ``priority`` forwarding over real sockets (docs/priority.md §5.4).

Two simulated vLLM servers on port 0: one runs ``--scheduling-policy priority``, the other is a
stock ``fcfs`` engine that answers a non-zero ``priority`` with vLLM's 400 ("Priority scheduling
is not enabled").  agentd, configured with the first as a priority worker, sends every request's
class and priority to it in vLLM's convention and never lets the stock worker see the field.
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import httpx
import trio
from native_fakes import BUDGET_SECONDS

from daemon.config import AgentdConfig, PriorityRule, PrioritySection, RoutingConfig, ServerConfig
from daemon.http.serve import serve_http
from daemon.supervisor import run_daemon
from sim.cluster import SimCluster, SimConfig
from sim.engine import EngineConfig
from sim.server import create_app


class Recording:
    """An ASGI wrapper that records each POST body a worker receives."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.bodies: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        self.bodies.append(json.loads(raw))
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def start_sim(nursery: trio.Nursery, policy: str) -> tuple[str, Recording]:
    config = SimConfig(
        dp_size=1, engine=EngineConfig(time_scale=1e6, scheduling_policy=policy), priority_under_fcfs="reject"
    )
    cluster: SimCluster = await nursery.start(SimCluster(config).run)
    app = Recording(create_app(cluster))
    url: str = await nursery.start(serve_http, app, "127.0.0.1", 0, 1.0, trio.Event().wait)
    return url, app


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "agentd-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra}


async def test_priority_worker_receives_vllm_priority_and_stock_worker_never_sees_it() -> None:
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            prio_url, prio = await start_sim(nursery, "priority")
            stock_url, stock = await start_sim(nursery, "fcfs")
            cfg = AgentdConfig(
                server=ServerConfig(port=0),
                routing=RoutingConfig(worker_urls=(prio_url, stock_url), policy="round_robin"),
                priority=PrioritySection(
                    max_abs_priority=100,
                    worker_policies={prio_url: "priority"},
                    rules=(PriorityRule(tenant="eval", set_class="batch"),),
                ),
            )
            handles = await nursery.start(partial(run_daemon, cfg))
            sent = [
                chat(priority=3),  # vLLM convention: internal -3, interactive band -> vLLM 3
                chat(priority=-5),
                chat(),  # no priority: interactive 0 -> nothing to add
                chat(user="eval"),  # a rule makes it batch: band 2 -> 2 * 201 - 0
                chat(vllm_xargs={"agentic_context": {"priority": 7}}),  # larger first: vLLM -7
            ]
            statuses = []
            async with httpx.AsyncClient(base_url=handles.http_url) as client:
                for body in sent:
                    for _ in range(2):  # round robin: once to each worker
                        r = await client.post("/v1/chat/completions", json=body)
                        statuses.append(r.status_code)
                bad = await client.post("/v1/chat/completions", json=chat(priority=101))
                conflict = await client.post(
                    "/v1/chat/completions",
                    json=chat(priority=2, vllm_xargs={"agentic_context": {"priority": 3}}),
                )
            handles.shutdown.set()
            nursery.cancel_scope.cancel()
    assert statuses == [200] * 10  # the rejecting stock worker never answered 400
    assert [b.get("priority") for b in prio.bodies] == [3, -5, None, 402, -7]
    assert len(stock.bodies) == 5 and all("priority" not in b for b in stock.bodies)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "priority"
    assert conflict.status_code == 400 and conflict.json()["error"]["code"] == "conflicting_priority"


async def test_auto_worker_that_rejects_priority_is_detected_once() -> None:
    """Policy ``auto``: both workers are sent ``priority``; the stock one answers vLLM's 400 once,
    that request is sent again without the field (the client sees a 200) and the worker never
    gets the field again; the priority-mode one keeps receiving it."""
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            prio_url, prio = await start_sim(nursery, "priority")
            stock_url, stock = await start_sim(nursery, "fcfs")
            cfg = AgentdConfig(
                server=ServerConfig(port=0),
                routing=RoutingConfig(worker_urls=(prio_url, stock_url), policy="round_robin"),
                priority=PrioritySection(default_worker_policy="auto"),
            )
            handles = await nursery.start(partial(run_daemon, cfg))
            statuses = []
            async with httpx.AsyncClient(base_url=handles.http_url) as client:
                for _ in range(3):
                    for _ in range(2):
                        r = await client.post("/v1/chat/completions", json=chat(priority=4, stream=True))
                        statuses.append(r.status_code)
                        assert r.text.rstrip().endswith("data: [DONE]")
                diag = (await client.get("/scheduling/diagnostics")).json()
            handles.shutdown.set()
            nursery.cancel_scope.cancel()
    assert statuses == [200] * 6
    assert [b.get("priority") for b in prio.bodies] == [4, 4, 4]
    assert [b.get("priority") for b in stock.bodies] == [4, None, None, None]  # rejected once, resent
    modes = {t["base_url"]: t["priority_mode"] for t in diag["proxy"]["targets"]}
    assert modes == {prio_url: "auto:priority", stock_url: "auto:fcfs"}
