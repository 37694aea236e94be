"""The session-35 walk of priorities and tenants, against the quick start's daemon (in process).

Before session 35: a duplicated tenant header made a tenant named ``"alice, bob"``; the OpenAI
``user`` field put a raw NUL (or a newline, a bidirectional override) into the tenant, its
``/metrics`` label and diagnostics; ``agentic_context.priority`` of the wrong type was
``invalid_program_identity`` with Program scheduling and ``invalid_priority`` without; a
non-ASCII header value was quoted as its latin-1 reading (``zo\\u00c3\\u00ab`` for ``zoë``).
docs/priority.md §5.1, §5.3; docs/operations.md §12.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_walk30_http import MESSAGES, PROGRAM, quickstart

from daemon.config_loading import config_from_dict


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "agentd-sim", "messages": MESSAGES, "max_tokens": 4, **extra}


def error(response: Any) -> tuple[int, str, str]:
    e = response.json()["error"]
    return response.status_code, e["code"], e["param"]


async def test_bad_tenants_are_refused_and_reach_no_label(tmp_path: Path) -> None:
    async with quickstart(tmp_path) as (handles, client):
        twice = await client.post(
            "/v1/chat/completions",
            json=chat(),
            headers=[("x-agentd-tenant", "alice"), ("x-agentd-tenant", "bob")],
        )
        assert error(twice) == (400, "invalid_tenant", "x-agentd-tenant")
        for user in ("a\u0000b", "new\nline", "a\u202eb"):
            bad = await client.post("/v1/chat/completions", json=chat(user=user))
            assert error(bad) == (400, "invalid_user", "user"), user
        ok = await client.post("/v1/chat/completions", json=chat(user="zo\u00eb"))
        assert ok.status_code == 200
        metrics = (await client.get("/metrics")).text
        assert 'tenant="zo\u00eb"' in metrics
        assert "alice, bob" not in metrics and "a\u0000b" not in metrics and "new\nline" not in metrics
        diagnostics = (await client.get("/scheduling/diagnostics")).json()
        assert diagnostics["invariants"]["at_rest"] is True


async def test_a_non_ascii_header_is_quoted_as_sent(tmp_path: Path) -> None:
    async with quickstart(tmp_path) as (_, client):
        r = await client.post("/v1/chat/completions", json=chat(), headers=[(b"x-agentd-tenant", "zo\u00eb".encode())])
        assert error(r) == (400, "invalid_header", "headers.x-agentd-tenant")
        assert "got 'zo\u00eb'" in r.json()["error"]["message"]


@pytest.mark.parametrize("program_scheduling", [True, False])
async def test_a_wrong_context_priority_is_invalid_priority(tmp_path: Path, program_scheduling: bool) -> None:
    cfg = config_from_dict({"enable_program_scheduling": program_scheduling})
    context = {"vllm_xargs": {"agentic_context": {**PROGRAM["vllm_xargs"]["agentic_context"], "priority": "1"}}}
    async with quickstart(tmp_path, cfg) as (_, client):
        r = await client.post("/v1/chat/completions", json=chat(**context))
        assert error(r) == (400, "invalid_priority", "vllm_xargs.agentic_context.priority")
