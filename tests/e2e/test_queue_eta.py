"""Queue ETA at the edge (docs/program-scheduling.md §13), in process and in virtual time.

One rank admits one Program at a time (``max_active_programs_per_target = 1``); the fake worker
holds the first Program's request, so a second Program waits.  Its ETA is the prior, 5 s per
position (no rank knows its throughput yet).  The SSE test drives the daemon's ASGI app directly
and records the virtual time of every message it sends.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing
from native_fakes import make_config
from test_program_scheduling import ProgramWorker, chat, configured_daemon

from actors.core.config import ProgramSchedulingConfig
from daemon.config import LimitsConfig
from daemon.handles import DaemonHandles
from daemon.http.app import create_app

HEADER = "x-agentd-max-queue-seconds"


@asynccontextmanager
async def daemon(
    worker: ProgramWorker, sse_keepalive_seconds: float | None = None
) -> AsyncIterator[tuple[DaemonHandles, httpx.AsyncClient]]:
    cfg = attrs.evolve(
        make_config(worker.urls, policy="round_robin"),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(max_active_programs_per_target=1),
        limits=LimitsConfig(sse_keepalive_seconds=sse_keepalive_seconds),
    )
    async with configured_daemon(worker, cfg) as pair:
        yield pair


async def hold_first(worker: ProgramWorker, client: httpx.AsyncClient, nursery: trio.Nursery) -> dict[str, Any]:
    """Program A's request reaches the worker and is held there: A holds the rank's one slot."""
    worker.hold("first")
    out: dict[str, Any] = {}

    async def send() -> None:
        out["first"] = await client.post("/v1/chat/completions", json=chat("first", "A"))

    nursery.start_soon(send)
    await worker.arrival("first").wait()
    return out


async def test_bound_zero_refuses_at_once_with_retry_after_from_the_eta(
    autojump_clock: trio.testing.MockClock,
) -> None:
    worker = ProgramWorker()
    async with daemon(worker) as (handles, client), trio.open_nursery() as nursery:
        await hold_first(worker, client, nursery)
        t0 = trio.current_time()
        # blocked (the one slot is taken): the time to the next tick + 1 position x 5 s (the prior)
        to_tick = handles.program_dispatcher.diagnostics()["queue_eta"]["next_tick_in_seconds"]
        assert 0 < to_tick <= 1.0
        expected = to_tick + 5.0
        refused = await client.post("/v1/chat/completions", json=chat("second", "B"), headers={HEADER: "0"})
        assert trio.current_time() == t0  # answered at once, never queued
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == str(math.ceil(expected))
        error = refused.json()["error"]
        assert error["code"] == "queue_wait_exceeds_bound" and error["type"] == "rate_limit_error"
        assert f"expected queue wait {expected:.1f}s (position 1)" in error["message"]
        diag = handles.program_dispatcher.diagnostics()
        assert diag["queue_eta"]["bound_rejections_count"] == 1 and diag["retained_requests"] == 0
        worker.release("first")


async def test_bound_the_eta_meets_queues_normally(autojump_clock: trio.testing.MockClock) -> None:
    worker = ProgramWorker()
    async with daemon(worker) as (handles, client), trio.open_nursery() as nursery:
        first = await hold_first(worker, client, nursery)
        out: dict[str, httpx.Response] = {}

        async def send() -> None:
            out["second"] = await client.post("/v1/chat/completions", json=chat("second", "B"), headers={HEADER: "60"})

        nursery.start_soon(send)
        ps = handles.program_dispatcher
        to_tick = ps.diagnostics()["queue_eta"]["next_tick_in_seconds"]
        await ps.wait_diagnostics(lambda d: d["retained_requests"] == 1)
        t_queued = trio.current_time()
        await trio.sleep(3.0)
        worker.release("first")
        await worker.arrival("second").wait()
        assert worker.at("second") - t_queued == pytest.approx(3.0)
        await ps.wait_diagnostics(lambda d: d["queue_eta"]["samples_count"] == 1)
        eta = ps.diagnostics()["queue_eta"]
        # first ETA: to the next tick + 5 s (the prior); actual wait 3 s
        assert eta["median_relative_error"] == pytest.approx((to_tick + 5.0 - 3.0) / 3.0)
    assert first["first"].status_code == 200 and out["second"].status_code == 200


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf", "", "1_0", "1e3", "+2", "0x10"])
async def test_malformed_bound_is_a_400_naming_the_header(autojump_clock: trio.testing.MockClock, value: str) -> None:
    worker = ProgramWorker()
    async with daemon(worker) as (_handles, client):
        resp = await client.post("/v1/chat/completions", json=chat("x", "A"), headers={HEADER: value})
        assert resp.status_code == 400
        error = resp.json()["error"]
        assert error["param"] == HEADER and error["code"] == "invalid_header"
        assert worker.seen == []


async def asgi_post(app: Any, body: dict[str, Any]) -> list[tuple[float, dict[str, Any]]]:
    """POST ``body`` through the ASGI app; every message it sends with its virtual time."""
    raw = json.dumps(body).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("agentd", 80),
    }
    done = trio.Event()
    delivered = False
    messages: list[tuple[float, dict[str, Any]]] = []

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        messages.append((trio.current_time(), message))
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            done.set()

    await app(scope, receive, send)
    done.set()
    return messages


async def test_sse_comments_carry_position_and_eta_while_queued(autojump_clock: trio.testing.MockClock) -> None:
    worker = ProgramWorker()
    async with daemon(worker, sse_keepalive_seconds=2.0) as (handles, client), trio.open_nursery() as nursery:
        await hold_first(worker, client, nursery)
        app = create_app(handles)
        out: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        t0 = trio.current_time()

        async def send() -> None:
            out["second"] = await asgi_post(app, chat("second", "B", stream=True))

        nursery.start_soon(send)
        await handles.program_dispatcher.wait_diagnostics(lambda d: d["retained_requests"] == 1)
        await trio.sleep(7.0)  # comments at t0 + 2, 4, 6
        worker.release("first")
        await worker.arrival("second").wait()
        t_admitted = trio.current_time()
        await handles.program_dispatcher.wait_diagnostics(lambda d: d["dispatcher"]["completed_count"] == 2)
    messages = out["second"]
    head = messages[0][1]
    assert head["type"] == "http.response.start" and head["status"] == 200
    comments = [(round(t - t0, 6), m["body"]) for t, m in messages if m.get("body", b"").startswith(b":")]
    # every tick (1 s) re-tells the ETA: 1 s to the next tick + 1 position x 5 s (the prior)
    comment = b": queued position=1 eta=6.0s\n\n"
    assert comments == [(2.0, comment), (4.0, comment), (6.0, comment)]
    assert t_admitted - t0 == pytest.approx(7.0)
    rest = b"".join(m.get("body", b"") for _t, m in messages[1:])
    assert b'"content": "ok"' in rest and rest.endswith(b"data: [DONE]\n\n")


async def test_sse_keepalive_after_admission_is_the_plain_comment(autojump_clock: trio.testing.MockClock) -> None:
    """Admitted at once (nothing ahead), the worker holds the stream: plain keep-alive comments."""
    worker = ProgramWorker()
    async with daemon(worker, sse_keepalive_seconds=2.0) as (handles, _client), trio.open_nursery() as nursery:
        worker.hold("only")
        app = create_app(handles)
        out: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        t0 = trio.current_time()

        async def send() -> None:
            out["only"] = await asgi_post(app, chat("only", "A", stream=True))

        nursery.start_soon(send)
        await worker.arrival("only").wait()
        await trio.sleep(3.0)
        worker.release("only")
        await handles.program_dispatcher.wait_diagnostics(lambda d: d["dispatcher"]["completed_count"] == 1)
    comments = [(round(t - t0, 6), m["body"]) for t, m in out["only"] if m.get("body", b"").startswith(b":")]
    assert comments == [(2.0, b": keep-alive\n\n")]


def test_a_bound_is_a_plain_decimal_number_of_seconds() -> None:
    """float() took "1_0" as 10 and "1e3" as 1000 (session 34's edge walk): only digits and one point."""
    from daemon.http.queue_eta import max_queue_bound

    assert [max_queue_bound({HEADER: v}) for v in ("0", " 2 ", "2.5", ".5", "3.")] == [0.0, 2.0, 2.5, 0.5, 3.0]
    assert max_queue_bound({}) is None
    # the refusal states that rule: "1e3" and "1e308" are finite numbers, which the message said
    # was what it took; the value shown is cut as the other header checks cut it
    from daemon.http.errors import ApiError

    for value in ("1e3", "1e308", "1" * 900):
        with pytest.raises(ApiError) as caught:
            max_queue_bound({HEADER: value})
        message = str(caught.value)
        assert "plain decimal digits" in message and "at most 32 characters" in message
        assert len(message) < 200
