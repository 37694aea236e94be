"""The agent-facing contract as documented, over real sockets (session 32's walk of issues 13 and 17).

The metadata contract of docs/program-scheduling.md §0 ("The fields of `agentic_context` and their
rules") and the tenant rules of docs/priority.md §5.3, each edge as a client would send it.  Real
clock: the daemon listens on a loopback socket in front of a fake worker; nothing here waits for
time to pass, and the budget is generous.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio
from test_program_scheduling import ProgramWorker, start

BUDGET_SECONDS = 60.0
MODEL = "m"


def chat(ctx: Any = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    if ctx is not None:
        body["vllm_xargs"] = {"agentic_context": ctx}
    body.update(extra)
    return body


def programs(diag: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["root_program_id"]: p for rank in diag["ranks"] for p in rank["programs"]}


async def test_agentic_context_fields_as_documented() -> None:
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start(nursery, ProgramWorker())
            async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:

                async def post(ctx: Any) -> httpx.Response:
                    return await client.post("/v1/chat/completions", json=chat(ctx))

                accepted = [
                    {"program_id": 12345},  # an integer id is its decimal text
                    {"program_id": "  spaced  ", "unknown_future_field": {"x": [1]}},  # trimmed; unknown keys ignored
                    {"program_id": "tâche-😀", "step_id": 2**64 - 1},
                    {"program_id": "aliases", "expected_output_tokens": 7, "kv_retention_ttl": 1e9, "deadline": 0},
                    {"program_id": "n" * 256},
                ]
                for ctx in accepted:
                    r = await post(ctx)
                    assert r.status_code == 200, (ctx, r.text)
                    r = await client.post("/v1/chat/completions", json=chat(json.dumps(ctx)))  # the string form
                    assert r.status_code == 200, (ctx, r.text)
                diag = (await client.get("/scheduling/diagnostics")).json()
                seen = programs(diag)
                assert {"12345", "spaced", "tâche-😀", "aliases", "n" * 256} <= set(seen)
                # the aliases were read, and clamped by [client_hints] (docs/config.md)
                # kv_retention_ttl 1e9 arms an acting TTL of client_hints.max_kv_retention_ttl_seconds (120 s)
                assert seen["aliases"]["status"] == "acting"
                assert 120 - BUDGET_SECONDS < seen["aliases"]["ttl_remaining_seconds"] <= 120

                refused = {
                    "program_id": [1.5, True, [], {}, "", "   ", "n" * 257, "é" * 129],
                    "parent_id": [{}],
                    "blocking_parent": ["yes"],
                    "step_id": [-1, 1.0, "1", 2**64],
                    "expected_output_tokens": [-1, 2**32, 3.5],
                    "deadline": ["5", -1],
                    "kv_retention_ttl": [-0.5, "3"],
                    "subagent_type": [5.5],
                }
                for field, values in refused.items():
                    for value in values:
                        ctx = {"program_id": "ok-id", field: value} if field != "program_id" else {field: value}
                        r = await post(ctx)
                        error = r.json()["error"]
                        assert r.status_code == 400, (field, value, r.text)
                        assert error["param"] == f"vllm_xargs.agentic_context.{field}", (field, value, error)
                        assert error["code"] == "invalid_program_identity" and field in error["message"]
            nursery.cancel_scope.cancel()


async def test_tenant_header_and_user_as_documented() -> None:
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start(nursery, ProgramWorker())
            async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:

                async def post(headers: dict[str, Any] | None = None, **extra: Any) -> httpx.Response:
                    return await client.post("/v1/chat/completions", json=chat(**extra), headers=headers or {})

                # printable ASCII with spaces inside
                assert (await post({"x-agentd-tenant": "team a"})).status_code == 200
                # blank: as absent, so the `user` field names the tenant
                assert (await post({"x-agentd-tenant": ""}, user=" alice ")).status_code == 200
                assert (await post(user="")).status_code == 200  # empty user: the default tenant
                metrics = (await client.get("/metrics")).text
                for tenant in ("team a", "alice", "default"):
                    line = (
                        f'agentd_class_requests_total{{class="interactive",outcome="completed",tenant="{tenant}"}} 1.0'
                    )
                    assert line in metrics.splitlines(), tenant

                r = await post({"x-agentd-tenant": "t" * 257})
                assert r.status_code == 400
                assert r.json()["error"]["param"] == "x-agentd-tenant"
                assert r.json()["error"]["code"] == "invalid_tenant"
                r = await post({"x-agentd-tenant": "t\u00e9am".encode()})
                assert r.status_code == 400
                assert r.json()["error"]["param"] == "headers.x-agentd-tenant"
                assert r.json()["error"]["code"] == "invalid_header"
                r = await post(user="u" * 257)
                assert r.status_code == 400 and r.json()["error"]["param"] == "user"
                assert r.json()["error"]["code"] == "invalid_user"
                r = await post(user=5)
                assert r.status_code == 400 and r.json()["error"]["param"] == "user"
                assert r.json()["error"]["code"] == "invalid_type"
            nursery.cancel_scope.cancel()


async def test_class_header_and_queue_bound_on_requests_without_identity() -> None:
    """docs/priority.md §5.2 (the class header in any case) and README / docs/program-scheduling.md
    §13 (the queue bound is validated on every request, applied to Program requests only)."""
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start(nursery, ProgramWorker())
            async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:

                async def post(headers: dict[str, str]) -> httpx.Response:
                    return await client.post("/v1/chat/completions", json=chat(), headers=headers)

                for value in ("BATCH", "Interactive", "agent"):
                    assert (await post({"x-agentd-class": value})).status_code == 200, value
                r = await post({"x-agentd-class": "vip"})
                assert r.status_code == 400 and r.json()["error"]["param"] == "x-agentd-class"
                assert r.json()["error"]["code"] == "invalid_request_class"
                # no Program identity: "do not queue" is not applied, a bad value is still a 400
                assert (await post({"x-agentd-max-queue-seconds": "0"})).status_code == 200
                r = await post({"x-agentd-max-queue-seconds": "soon"})
                assert r.status_code == 400 and r.json()["error"]["param"] == "x-agentd-max-queue-seconds"
            nursery.cancel_scope.cancel()
