"""Findings of the session-43 HTTP audit, each checked on the whole daemon in process (virtual time).

An output cap (``max_tokens``, ``max_completion_tokens``, ``max_output_tokens``) is charged to a
rank's float ledger with the prompt (docs/priority.md §2): a 400-digit ``max_tokens`` on an
identity-free request overflowed the float conversion inside the scheduler and stopped the whole
daemon (every client cut off, the process exited).  Such caps are a 400 naming the field now,
bounded like ``agentic_context.expected_output_length`` (docs/operations.md §14).

An integer too large for a float where agentd checks a number is finite (the sampling fields,
``agentic_context.deadline_seconds`` and ``kv_retention_ttl_seconds``) raised OverflowError: a 500.
It is refused like ``1e400``, a 400 naming the field.

With ``[server] http1_implementation = "hypercorn"``, an error answered before the request body
arrived (a 404 for an unknown route, a 405) left the connection open but dead: hypercorn's close
ran in the app's task, which Quart-trio cancelled, and the client's next request on the connection
got no answer (docs/operations.md §13.7).  Checked over real sockets, in real time.

``POST /v1/files`` compared the media type of its ``content-type`` case-sensitively: a client
sending ``Multipart/Form-Data`` (a media type is case-insensitive, RFC 9110 §8.3.1) got a 400.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from test_program_scheduling import VIRTUAL_BUDGET_SECONDS, in_process_client
from test_program_sim import deterministic, sim_config

from actors.core.config import BatchJobsConfig
from daemon.config import HTTP1_ENV, AgentdConfig, BatchApiConfig, PrioritySection
from daemon.http.identity import MAX_TOKEN_COUNT
from daemon.supervisor import run_daemon

MESSAGES = [{"role": "user", "content": "quick question"}]
# (route, body without its cap, the cap's field)
CAPS = [
    ("/v1/chat/completions", {"messages": MESSAGES}, "max_tokens"),
    ("/v1/chat/completions", {"messages": MESSAGES}, "max_completion_tokens"),
    ("/v1/completions", {"prompt": "quick question"}, "max_tokens"),
    ("/v1/responses", {"input": "quick question"}, "max_output_tokens"),
]
# how the request is classed: identity-free (interactive), batch class, a Program
CLASSES: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "interactive": ({}, {}),
    "batch": ({}, {"x-agentd-class": "batch"}),
    "agent": ({"vllm_xargs": {"agentic_context": {"program_id": "audit"}}}, {}),
}


def audit_config() -> AgentdConfig:
    cfg = sim_config()
    return attrs.evolve(
        cfg,
        batch_jobs=BatchJobsConfig(enabled=True),
        priority=PrioritySection(interactive_scheduling=True),
    )


@pytest.mark.parametrize("cap", [10**400, MAX_TOKEN_COUNT + 1], ids=["400-digits", "2**32"])
async def test_an_output_cap_too_large_for_the_ledger_is_a_400_and_the_daemon_serves_on(
    autojump_clock: trio.testing.MockClock, cap: int
) -> None:
    answers: list[tuple[str, str, str, int, dict[str, Any]]] = []
    with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(
                partial(run_daemon, audit_config(), serve_http=False, sim_configure=deterministic)
            )
            async with in_process_client(handles) as client:
                for route, base, field in CAPS:
                    for kind, (extra, headers) in CLASSES.items():
                        payload = {"model": "sim-model", **base, **extra, field: cap}
                        r = await client.post(route, json=payload, headers=headers)
                        answers.append((route, field, kind, r.status_code, r.json()))
                ok = await client.post(
                    "/v1/chat/completions", json={"model": "sim-model", "messages": MESSAGES, "max_tokens": 8}
                )
                diag = (await client.get("/scheduling/diagnostics")).json()
            nursery.cancel_scope.cancel()
    for route, field, kind, status, body in answers:
        assert status == 400, (route, field, kind, body)
        assert body["error"]["param"] == field, (route, field, kind, body)
        assert body["error"]["code"] == "invalid_type", (route, field, kind, body)
        assert f"must be at most {MAX_TOKEN_COUNT}" in body["error"]["message"]
    assert ok.status_code == 200
    assert diag["invariants"]["at_rest"] is True
    assert diag["proxy"]["edge"]["in_flight"] == 0


SAMPLING = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
DURATIONS = ("deadline_seconds", "kv_retention_ttl_seconds")


async def test_an_integer_too_large_for_a_float_is_a_400_naming_the_field(
    autojump_clock: trio.testing.MockClock,
) -> None:
    answers: list[tuple[str, str, int, dict[str, Any]]] = []
    with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(
                partial(run_daemon, audit_config(), serve_http=False, sim_configure=deterministic)
            )
            async with in_process_client(handles) as client:
                for route, base, _ in CAPS[1:]:
                    for field in SAMPLING:
                        for sign in (1, -1):
                            payload = {"model": "sim-model", **base, field: sign * 10**400}
                            r = await client.post(route, json=payload)
                            answers.append((route, field, r.status_code, r.json()))
                for field in DURATIONS:
                    for sign in (1, -1):
                        context = {"program_id": "audit", field: sign * 10**400}
                        payload = {
                            "model": "sim-model",
                            "messages": MESSAGES,
                            "vllm_xargs": {"agentic_context": context},
                        }
                        r = await client.post("/v1/chat/completions", json=payload)
                        answers.append(("chat", f"vllm_xargs.agentic_context.{field}", r.status_code, r.json()))
                diag = (await client.get("/scheduling/diagnostics")).json()
            nursery.cancel_scope.cancel()
    for route, field, status, body in answers:
        assert status == 400, (route, field, body)
        assert body["error"]["param"] == field, (route, field, body)
    assert diag["invariants"]["at_rest"] is True


UPLOAD = (
    b'--BND\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
    b'--BND\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n'
    b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n\r\n--BND--\r\n'
)


@pytest.mark.parametrize(
    "content_type",
    ["multipart/form-data; boundary=BND", "Multipart/Form-Data; boundary=BND", "MULTIPART/FORM-DATA; BOUNDARY=BND"],
)
async def test_an_upload_s_media_type_is_case_insensitive(tmp_path: Path, content_type: str) -> None:
    # real time: the Batch API's SQLite calls run in a thread, which an autojump clock does not
    # wait for (as in tests/http/test_batch_api.py)
    cfg = attrs.evolve(audit_config(), batch_api=BatchApiConfig(database_path=str(tmp_path / "b.sqlite3")))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(
                partial(run_daemon, cfg, serve_http=False, sim_configure=deterministic, batch_executor=True)
            )
            async with in_process_client(handles) as client:
                r = await client.post("/v1/files", content=UPLOAD, headers={"content-type": content_type})
                listed = (await client.get("/v1/files")).json()
            nursery.cancel_scope.cancel()
    assert r.status_code == 200, r.text
    assert r.json()["filename"] == "in.jsonl" and r.json()["purpose"] == "batch"
    assert [f["id"] for f in listed["data"]] == [r.json()["id"]]


@pytest.mark.parametrize("http1", ["agentd", "hypercorn"])
@pytest.mark.parametrize(("method", "path", "status"), [("POST", "/no/such/route", 404), ("POST", "/v1/models", 405)])
async def test_an_error_answered_before_the_body_arrived_closes_the_connection(
    monkeypatch: pytest.MonkeyPatch, http1: str, method: str, path: str, status: int
) -> None:
    monkeypatch.setenv(HTTP1_ENV, http1)
    body = b'{"model": "sim-model", "input": "x"}'
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, audit_config(), sim_configure=deterministic))
            assert handles.http_url is not None
            host, port = handles.http_url.removeprefix("http://").rsplit(":", 1)
            async with await trio.open_tcp_stream(host, int(port)) as stream:
                # the head alone, as httpx sends it before the body: the route is answered at once
                head = f"{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n\r\n"
                await stream.send_all(head.encode())
                answer = b""
                while not answer.endswith(b"}}"):  # the JSON error, whole
                    chunk = await stream.receive_some(65536)
                    assert chunk, answer
                    answer += chunk
                assert answer.startswith(b"HTTP/1.1 %d" % status), answer
                # then the connection closes: before the fix, hypercorn's stayed open and the request
                # sent next on it (the body, then GET /health) waited for ever
                with trio.fail_after(5):
                    rest = b""
                    try:
                        await stream.send_all(body + b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
                        while chunk := await stream.receive_some(65536):
                            rest += chunk
                    except trio.BrokenResourceError:  # the server closed first (a reset)
                        pass
                assert rest == b"", rest
            nursery.cancel_scope.cancel()
