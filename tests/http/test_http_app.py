"""The Quart-Trio app through ``app.test_client()`` (no sockets)."""

from __future__ import annotations

import json

import pytest
from http_fakes import DaemonApp

CHAT = {"model": "mini", "messages": [{"role": "user", "content": "hi"}]}


async def test_http_chat_roundtrip_and_metrics(daemon_app: DaemonApp) -> None:
    client = daemon_app.app.test_client()
    response = await client.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert (await response.get_json())["choices"][0]["message"]["content"] == "a"
    # one DP target behind the worker: no rank header, vLLM places it (docs/operations.md §13.10)
    assert "x-data-parallel-rank" not in daemon_app.worker.seen[-1].headers
    metrics = await client.get("/metrics")
    text = (await metrics.get_data()).decode()
    assert metrics.status_code == 200
    assert 'agentd_proxy_requests_total{endpoint="chat",outcome="success",target="http://mini:9000"} 1.0' in text
    assert 'agentd_proxy_request_duration_seconds_count{target="http://mini:9000"} 1.0' in text
    assert 'agentd_proxy_in_flight_requests{target="http://mini:9000"} 0.0' in text
    assert 'agentd_health_target_healthy{target="http://mini:9000"} 1.0' in text


async def test_http_streaming_roundtrip(daemon_app: DaemonApp) -> None:
    client = daemon_app.app.test_client()
    response = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    assert (await response.get_data()).endswith(b"data: [DONE]\n\n")


async def test_http_health_ok_and_unavailable(daemon_app: DaemonApp) -> None:
    client = daemon_app.app.test_client()
    ok = await client.get("/health")
    assert ok.status_code == 200
    assert (await ok.get_json())["status"] == "ok"
    daemon_app.worker.healthy = False
    from daemon.health import run_health_round  # explicit rounds instead of waiting 5 s each

    for _ in range(daemon_app.handles.config.routing.health_failures_to_eject):
        assert (await client.get("/health")).status_code == 200  # within the threshold: still in rotation
        await run_health_round(daemon_app.handles.health, daemon_app.handles.client, 1.0)
    down = await client.get("/health")
    payload = await down.get_json()
    assert down.status_code == 503
    assert payload["status"] == "unavailable" and "http://mini:9000: HTTP 503" in payload["reason"]


async def test_http_diagnostics_proxy_section(daemon_app: DaemonApp) -> None:
    client = daemon_app.app.test_client()
    await client.post("/v1/chat/completions", json=CHAT)
    response = await client.get("/scheduling/diagnostics")
    payload = await response.get_json()
    assert response.status_code == 200
    assert payload["enabled"] is False
    proxy = payload["proxy"]
    assert proxy["policy"] == "round_robin"
    assert proxy["native"]["finished_count"] == 1
    [target] = proxy["targets"]
    assert target == {
        "target_id": "http://mini:9000",
        "base_url": "http://mini:9000",
        "dp_rank": None,
        "healthy": True,
        "health_reason": "ok",
        "suspect": False,
        "engine_missing": False,
        "health_checked_at": target["health_checked_at"],
        "consecutive_health_failures": 0,
        "consecutive_health_successes": 1,
        "consecutive_request_failures": 0,
        "native_in_flight_requests": 0,
        "priority_mode": "fcfs",
    }
    invariants = payload["invariants"]
    assert invariants["at_rest"] is True
    assert invariants["native_in_flight"] == invariants["proxy_in_flight"] == invariants["pending_replies"] == 0


async def test_http_models_proxied(daemon_app: DaemonApp) -> None:
    response = await daemon_app.app.test_client().get("/v1/models")
    assert response.status_code == 200
    assert (await response.get_json())["data"][0]["id"] == "mini"


async def test_http_errors_are_openai_shaped(daemon_app: DaemonApp) -> None:
    client = daemon_app.app.test_client()
    cases = [
        (await client.get("/nope"), 404, "not_found"),
        (await client.put("/v1/completions", json={}), 405, "method_not_allowed"),
        (
            await client.post("/v1/chat/completions", data=b"[", headers={"content-type": "application/json"}),
            400,
            "invalid_json",
        ),
        (await client.post("/v1/chat/completions", json={**CHAT, "x": "y" * 5000}), 413, "body_too_large"),
        (await client.post("/v1/chat/completions", json={**CHAT, "n": 0}), 400, "invalid_type"),
    ]
    for response, status, code in cases:
        body = json.loads(await response.get_data())
        assert response.status_code == status, body
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["code"] == code
    assert daemon_app.worker.seen == []


async def test_http_unexpected_error_is_500_without_traceback(daemon_app: DaemonApp) -> None:
    daemon_app.worker.explode = True
    response = await daemon_app.app.test_client().post("/v1/chat/completions", json=CHAT)
    body = await response.get_data()
    assert response.status_code == 500
    assert json.loads(body)["error"]["code"] == "internal_error"
    assert b"secret" not in body and b"Traceback" not in body


async def test_http_over_long_id_header_is_a_json_431_never_forwarded(daemon_app: DaemonApp) -> None:
    client = daemon_app.app.test_client()
    response = await client.post("/v1/chat/completions", json=CHAT, headers={"x-session-id": "s" * 10_000})
    body = json.loads(await response.get_data())
    assert response.status_code == 431
    assert body["error"]["code"] == "header_too_large" and body["error"]["param"] == "headers.x-session-id"
    assert daemon_app.worker.seen == []


async def test_http_plain_text_worker_error_is_wrapped(daemon_app: DaemonApp) -> None:
    daemon_app.worker.plain_error = "Bad Request: too long"
    response = await daemon_app.app.test_client().post("/v1/chat/completions", json=CHAT)
    body = json.loads(await response.get_data())
    assert response.status_code == 400 and response.headers["content-type"] == "application/json"
    assert body["error"]["code"] == "upstream_status"
    assert "HTTP 400: Bad Request: too long" in body["error"]["message"]


async def test_http_unexpected_error_names_the_request_id_and_logs_once(
    daemon_app: DaemonApp, caplog: pytest.LogCaptureFixture
) -> None:
    daemon_app.worker.explode = True
    with caplog.at_level("ERROR"):
        response = await daemon_app.app.test_client().post("/v1/chat/completions", json=CHAT)
    body = json.loads(await response.get_data())
    rid = response.headers["x-request-id"]
    assert response.status_code == 500 and rid.startswith("agentd-")
    assert rid in body["error"]["message"]
    errors = [r for r in caplog.records if getattr(r, "agentd_event", None) == "internal_error"]
    assert len(errors) == 1 and errors[0].agentd_fields["request_id"] == rid  # type: ignore[attr-defined]
    stats = daemon_app.handles.native_dispatcher.statistics()
    assert daemon_app.handles.native_dispatcher.total_in_flight() == 0 and stats.abandoned_count == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_http_response_carries_the_request_id(daemon_app: DaemonApp, stream: bool) -> None:
    """Every proxied answer names its request in ``x-request-id``: the client's own id echoed as
    the reference router does, else agentd's (docs/operations.md §12)."""
    client = daemon_app.app.test_client()
    mine = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream}, headers={"x-request-id": "c-1"})
    assert mine.status_code == 200 and mine.headers.get_all("x-request-id") == ["c-1"]
    assert daemon_app.worker.seen[-1].headers["x-request-id"].startswith("c-1-agentd-")  # the worker's is unique
    await mine.get_data()
    theirs = await client.post("/v1/chat/completions", json={**CHAT, "stream": stream})
    (rid,) = theirs.headers.get_all("x-request-id")
    assert rid.startswith("agentd-") and daemon_app.worker.seen[-1].headers["x-request-id"] == rid


async def test_http_error_answers_carry_the_request_id(daemon_app: DaemonApp) -> None:
    daemon_app.worker.plain_error = "Bad Request: too long"
    client = daemon_app.app.test_client()
    response = await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "c-2"})
    assert response.status_code == 400 and response.headers.get_all("x-request-id") == ["c-2"]
    daemon_app.worker.plain_error = None
    daemon_app.worker.explode = True
    response = await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "c-3"})
    body = json.loads(await response.get_data())
    assert response.status_code == 500 and response.headers.get_all("x-request-id") == ["c-3"]
    assert "agentd-" in body["error"]["message"]  # the message names agentd's own id for the log


async def test_http_answers_before_parsing_echo_the_clients_request_id(daemon_app: DaemonApp) -> None:
    client = daemon_app.app.test_client()
    bad = await client.post(
        "/v1/chat/completions",
        data=b"{not json",
        headers={"content-type": "application/json", "x-request-id": "c-4"},
    )
    assert bad.status_code == 400 and bad.headers.get_all("x-request-id") == ["c-4"]
    anonymous = await client.post(
        "/v1/chat/completions", data=b"{not json", headers={"content-type": "application/json"}
    )
    assert anonymous.status_code == 400 and "x-request-id" not in anonymous.headers  # no id yet, none made up
    too_long = await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "r" * 1025})
    assert too_long.status_code == 431 and "x-request-id" not in too_long.headers  # never sent back


async def test_http_one_model_from_the_list(daemon_app: DaemonApp) -> None:
    """``GET /v1/models/{id}`` (the openai client's ``models.retrieve``) answers from the list."""
    client = daemon_app.app.test_client()
    found = await client.get("/v1/models/mini")
    assert found.status_code == 200
    assert (await found.get_json())["id"] == "mini"
    missing = await client.get("/v1/models/org/other")  # ids may hold slashes
    assert missing.status_code == 404
    assert (await missing.get_json())["error"] == {
        "message": "The model 'org/other' does not exist",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
