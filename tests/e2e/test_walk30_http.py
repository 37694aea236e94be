"""The session-30 walk's HTTP findings: the quick start's daemon and its bad input.

Before session 30 the OpenAI sampling and output fields agentd forwards without reading
(``temperature``, ``stop``, ``tool_choice``, ``logprobs``, ``metadata``, ...) passed through with
any JSON type: the quick start's embedded simulator answered ``"temperature": "hot"`` with a 200,
and in front of real workers a Program request waited in agentd's queue before the worker refused
it.  They are now a 400 naming the field (docs/operations.md §12), for the official ``openai``
client an ``openai.BadRequestError`` whose ``.param`` is the field; the scheduler is left with
nothing in flight or queued.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing

from daemon.config import AgentdConfig, BatchApiConfig
from daemon.config_loading import config_from_dict, config_warnings, load_config
from daemon.http.app import create_app
from daemon.supervisor import DaemonHandles, run_daemon

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "user", "content": "hi"}]
PROGRAM = {"vllm_xargs": {"agentic_context": {"program_id": "walk30:lead", "task_id": "walk30"}}}


@asynccontextmanager
async def quickstart(
    tmp_path: Path, cfg: AgentdConfig | None = None
) -> AsyncIterator[tuple[DaemonHandles, httpx.AsyncClient]]:
    """configs/quickstart.toml (or ``cfg``) in process (its own Batch API database), in virtual time."""
    if cfg is None:
        cfg = load_config(ROOT / "configs" / "quickstart.toml")
    cfg = attrs.evolve(cfg, batch_api=BatchApiConfig(database_path=str(tmp_path / "b.sqlite3")))
    with trio.fail_after(600):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(
                partial(
                    run_daemon,
                    cfg,
                    serve_http=False,
                    sim_configure=lambda c: attrs.evolve(c, deterministic=True),
                )
            )
            transport = httpx.ASGITransport(create_app(handles))  # type: ignore[arg-type]
            try:
                async with httpx.AsyncClient(transport=transport, base_url="http://agentd") as client:
                    yield handles, client
            finally:
                handles.request_shutdown()


BAD_FIELDS: list[tuple[str, Any]] = [
    ("temperature", "hot"),
    ("temperature", -1),
    ("top_p", 1.5),
    ("top_p", "x"),
    ("presence_penalty", "x"),
    ("frequency_penalty", 3),
    ("seed", "x"),
    ("seed", 1.5),
    ("stop", 5),
    ("stop", [5]),
    ("logprobs", "yes"),
    ("top_logprobs", "x"),
    ("top_logprobs", -1),
    ("tool_choice", 5),
    ("tool_choice", "maybe"),
    ("metadata", "x"),
    ("metadata", [1]),
    ("logit_bias", "x"),
    ("response_format", "json"),
    ("parallel_tool_calls", "yes"),
]


@pytest.mark.parametrize("program", [False, True], ids=["identity-free", "program"])
async def test_a_wrong_sampling_field_is_a_400_naming_it_and_nothing_is_left_in_flight(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, program: bool
) -> None:
    extra = PROGRAM if program else {}
    async with quickstart(tmp_path) as (_, client):
        for field, value in BAD_FIELDS:
            for stream in (False, True):
                body = {"model": "agentd-sim", "messages": MESSAGES, "max_tokens": 2, "stream": stream, **extra}
                r = await client.post("/v1/chat/completions", json={**body, field: value})
                assert r.status_code == 400, (field, value, r.text)
                error = r.json()["error"]
                assert set(error) == {"message", "type", "param", "code"}
                assert error["param"] == field
                assert (error["code"], error["type"]) == ("invalid_type", "invalid_request_error")
                assert field in error["message"]
        assert_nothing_in_flight((await client.get("/scheduling/diagnostics")).json())
        # the good values of the same fields are served
        good = {
            "temperature": 0.7,
            "top_p": 1,
            "presence_penalty": -2,
            "frequency_penalty": 0.5,
            "seed": 7,
            "stop": ["\n"],
            "logprobs": False,
            "top_logprobs": 0,
            "tool_choice": "auto",
            "metadata": {"k": "v"},
            "logit_bias": {},
            "response_format": {"type": "text"},
            "parallel_tool_calls": True,
        }
        body = {"model": "agentd-sim", "messages": MESSAGES, "max_tokens": 2, **extra, **good}
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200


def assert_nothing_in_flight(diagnostics: dict[str, Any]) -> None:
    assert diagnostics["in_flight_requests"] == 0
    assert all(r["router_in_flight_requests"] == r["router_queued_requests"] == 0 for r in diagnostics["ranks"])
    assert all(c["waiting_requests"] == 0 for c in diagnostics["priority"]["classes"])


async def test_a_json_nan_or_infinity_is_no_sampling_value(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with quickstart(tmp_path) as (_, client):
        for literal in (b"NaN", b"Infinity", b"-Infinity"):
            raw = b'{"model": "agentd-sim", "messages": [{"role": "user", "content": "hi"}], "temperature": ' + literal
            r = await client.post(
                "/v1/chat/completions", content=raw + b"}", headers={"content-type": "application/json"}
            )
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == "temperature"


async def test_the_legacy_completions_logprobs_is_a_count(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with quickstart(tmp_path) as (_, client):
        body = {"model": "agentd-sim", "prompt": "once", "max_tokens": 2}
        assert (await client.post("/v1/completions", json={**body, "logprobs": 2})).status_code == 200
        r = await client.post("/v1/completions", json={**body, "logprobs": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"
        r = await client.post("/v1/completions", json={**body, "stop": {"x": 1}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "stop"


async def test_admin_keys_alone_leave_the_operator_routes_open_which_the_configuration_warns_of(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Why ``admin_keys_without_api_keys`` warns (tests/e2e/test_walk30_config.py): with admin keys
    and no API key, the operator routes answer a request without any key."""
    cfg = config_from_dict({"auth": {"admin_keys": [hashlib.sha256(b"admin").hexdigest()]}})
    assert [w.event for w in config_warnings(cfg)] == ["admin_keys_without_api_keys"]
    async with quickstart(tmp_path, cfg) as (_, client):
        assert (await client.get("/scheduling/diagnostics")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
