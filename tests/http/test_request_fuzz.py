"""Fuzz of the edge's request parsing: whatever JSON (or not-JSON) a client sends, parsing either
yields a request or raises an OpenAI-style 4xx ``ApiError`` naming what is wrong - never another
exception, which the server would turn into a 5xx."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.http.errors import ApiError
from daemon.http.proxy import parse_request

# Field names agentd reads, so the fuzz reaches the code that reads them.
KEYS = st.sampled_from(
    [
        "model", "stream", "stream_options", "include_usage", "messages", "role", "content", "text",
        "tool_calls", "function", "name", "arguments", "function_call", "tools", "parameters",
        "description", "prompt", "input", "instructions", "max_tokens", "n", "vllm_xargs",
        "agentic_context", "program_id", "task_id", "session_id", "agent_id", "parent_agent_id",
        "priority", "deadline_seconds", "expected_output_length", "kv_retention_ttl_seconds",
        "step_id", "blocks_parent", "expected_resume", "agent_hint", "user", "type",
    ]
)  # fmt: skip
TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=12) | st.sampled_from(["user", "system", "lead", ""])
SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | TEXT
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=5), max_leaves=25
)
BODIES = st.dictionaries(KEYS, VALUES, max_size=8)
HEADERS = st.dictionaries(
    st.sampled_from(["x-session-id", "x-claude-code-session-id", "session-id", "x-request-id", "x-user-id"]),
    TEXT,
    max_size=3,
)
ENDPOINTS = st.sampled_from(["chat", "completions", "responses"])
ENABLE_KEYS = st.sampled_from([None, "vllm_xargs.agentic_context", "auto"])


def _parse(endpoint: str, raw: bytes, headers: dict[str, str], enable_key: str | None) -> None:
    try:
        parse_request("agentd-test", endpoint, raw, headers, enable_key)
    except ApiError as error:
        assert 400 <= error.status < 500
        payload = json.loads(error.body())
        assert payload["error"]["message"]
        assert payload["error"]["code"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(endpoint=ENDPOINTS, body=BODIES, headers=HEADERS, enable_key=ENABLE_KEYS)
def test_any_json_body_is_a_request_or_a_4xx(
    endpoint: str, body: dict[str, Any], headers: dict[str, str], enable_key: str | None
) -> None:
    _parse(endpoint, json.dumps(body).encode(), headers, enable_key)


@settings(max_examples=200, deadline=None)
@given(endpoint=ENDPOINTS, raw=st.binary(max_size=64), enable_key=ENABLE_KEYS)
def test_any_bytes_are_a_request_or_a_4xx(endpoint: str, raw: bytes, enable_key: str | None) -> None:
    _parse(endpoint, raw, {}, enable_key)


def test_hostile_bodies_get_a_4xx_naming_the_problem() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    cases: list[tuple[bytes, str | None]] = [
        (b'{"model":"m","messages":' + b"[" * 100_000 + b"]" * 100_000 + b"}", None),
        (json.dumps({**chat, "tools": 7}).encode(), "tools"),
        (
            json.dumps({"model": "m", "messages": [{"role": "assistant", "tool_calls": 5}]}).encode(),
            "messages[0].tool_calls",
        ),
        (b'{"model":"m","messages":[{"role":"user","content":"\\ud800"}]}', None),
        (b'{"model":"m","messages":[{"role":"user","content":"\\udc00 after"}]}', None),
    ]
    for raw, param in cases:
        try:
            parse_request("agentd-test", "chat", raw, {}, "auto")
        except ApiError as error:
            assert error.status == 400 and error.param == param, raw[:60]
        else:
            raise AssertionError(f"accepted {raw[:60]!r}")
    # a surrogate *pair* is a valid character and is accepted
    ok = parse_request("agentd-test", "chat", b'{"messages":[{"role":"user","content":"\\ud83d\\ude00"}]}', {}, "auto")
    assert ok.prompt.text_bytes == len("user:\U0001f600".encode())
