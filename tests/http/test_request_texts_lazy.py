"""A request's prompt size and routing text are worked out when a dispatcher first reads them
(docs/benchmarks.md §10.2.8): an identity-free request routed round robin never walks its body for
them; whoever reads them gets what ``request_texts`` gives, worked out once."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from http_fakes import DaemonApp

import daemon.http.proxy as proxy_module
from daemon.dispatch import ProxyRequest
from daemon.http.proxy import parse_request
from daemon.http.requests import PromptSize, request_texts

BODY = {
    "model": "mini",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hé, plan it"},
        {"role": "assistant", "content": "ok"},
    ],
    "tools": [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}],
}
RAW = (
    b'{"model":"mini","messages":[{"role":"system","content":"You are terse."},'
    b'{"role":"user","content":"h\xc3\xa9, plan it"},{"role":"assistant","content":"ok"}],'
    b'"tools":[{"type":"function","function":{"name":"ls","parameters":{"type":"object"}}}]}'
)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []

    def counting(endpoint: str, body: Any) -> tuple[str, PromptSize]:
        seen.append(endpoint)
        return request_texts(endpoint, body)

    monkeypatch.setattr(proxy_module, "request_texts", counting)
    return seen


async def test_a_round_robin_request_never_works_out_its_texts(daemon_app: DaemonApp, calls: list[str]) -> None:
    client = daemon_app.app.test_client()
    response = await client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 200
    assert daemon_app.worker.bodies  # it was forwarded
    assert calls == []


def test_the_texts_are_request_texts_worked_out_once(calls: list[str]) -> None:
    req = parse_request("r1", "chat", RAW, {}, None)
    assert calls == []
    routing, prompt = request_texts("chat", BODY)
    assert req.routing_text == routing
    assert req.prompt == prompt
    assert req.prompt.text_bytes > 0
    assert calls == ["chat"]  # once for both
    # a copy for a failover keeps them (no second walk) and compares equal to one built whole
    again = attrs.evolve(req, request_id="r1.failover1")
    assert again.prompt == prompt and again.routing_text == routing
    assert calls == ["chat"]
    whole = ProxyRequest(
        request_id="r1",
        endpoint="chat",
        body=req.body,
        headers={},
        model="mini",
        stream=False,
        prompt=prompt,
        routing_text=routing,
    )
    assert whole == attrs.evolve(req, texts=None)


def test_given_texts_are_kept_and_a_request_without_either_says_so() -> None:
    given = ProxyRequest(
        request_id="r2",
        endpoint="chat",
        body={},
        headers={},
        model=None,
        stream=False,
        prompt=PromptSize(7),
        routing_text="x",
        texts=lambda: pytest.fail("given texts are not worked out again"),
    )
    assert given.prompt == PromptSize(7) and given.routing_text == "x"
    bare = ProxyRequest(request_id="r3", endpoint="chat", body={}, headers={}, model=None, stream=False)
    with pytest.raises(AttributeError, match="texts"):
        bare.prompt  # noqa: B018
