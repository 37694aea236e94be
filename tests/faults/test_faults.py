"""The fault suite over real sockets (issue 14, F1-F8; F10 is test_restart.py): a daemon in front of
scriptable workers (tests/faults/fault_worker.py).  Every case ends with ``env.check_clean()``:
daemon up, no error log, capacity counters at rest, file descriptors back to the baseline."""

from __future__ import annotations

import json
import random

import httpx
import pytest
import trio
from fault_env import BUDGET_SECONDS, CHAT, STREAM, fault_env, sse_events, wait_until
from fault_worker import Act, Blackhole, FaultProxy, abort, closed_port

from daemon.health import run_health_round


def assert_openai_error(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code, error
    return str(error["message"])


def assert_stream_error_then_done(body: bytes) -> dict:
    *_, error, done = sse_events(body)
    assert done == b"data: [DONE]"
    payload = json.loads(error.removeprefix(b"data: "))
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    return dict(payload["error"])


# ---- F1 worker killed mid-response -----------------------------------------------------------------


# "At once", not after a timeout: the stream-idle and first-byte timeouts are set far beyond the
# bound, so that a loaded machine's delays cannot pass for them (with the 1 s idle timeout, a
# detection within 1 s was the only proof - a margin scheduling delays can use up).
AT_ONCE_SECONDS = 10.0
FAR_TIMEOUTS = {
    "stream_idle_timeout_seconds": 30.0,
    "first_byte_timeout_seconds": 30.0,
    "request_timeout_seconds": 60.0,
}


@pytest.mark.parametrize("kind", ["kill", "reset"])
async def test_f1_worker_killed_mid_stream_error_event_then_done_within_1s(kind: str) -> None:
    async with fault_env(1, **FAR_TIMEOUTS) as env:
        env.workers[0].script.append(Act(kind, events=5, after=3))
        body = b""
        async with env.client.stream("POST", "/v1/chat/completions", json=STREAM) as response:
            assert response.status_code == 200
            async for chunk in response.aiter_raw():
                body += chunk
        done_at = trio.current_time()
        error = assert_stream_error_then_done(body)
        assert error["code"] == "upstream_stream" and error["type"] == "upstream_error"
        assert len(sse_events(body)) == 3 + 2  # the events before the kill, error, [DONE]
        [killed_at] = env.workers[0].faulted_at
        assert done_at - killed_at < AT_ONCE_SECONDS
        await env.check_clean()


@pytest.mark.parametrize("kind", ["kill", "reset"])
async def test_f1_worker_killed_mid_json_is_502_within_1s(kind: str) -> None:
    async with fault_env(1, **FAR_TIMEOUTS) as env:
        env.workers[0].script.append(Act(kind))
        response = await env.chat(CHAT)
        [killed_at] = env.workers[0].faulted_at
        assert trio.current_time() - killed_at < AT_ONCE_SECONDS
        assert_openai_error(response, 502, "upstream_stream")
        await env.check_clean()


async def test_f1_connection_reset_by_a_proxy_mid_stream() -> None:
    """The transport dies (RST from a middlebox) rather than the worker process."""
    async with fault_env(1) as env, trio.open_nursery() as nursery:
        proxy = await nursery.start(FaultProxy(env.workers[0].port).run)
        async with fault_env(0, urls=[proxy.url]) as behind:
            env.workers[0].default = Act("ok", events=50)
            proxy.mode, proxy.limit = "reset_after", 600  # the head and a few events
            response = await behind.chat(STREAM)
            assert response.status_code == 200
            assert assert_stream_error_then_done(response.content)["code"] == "upstream_stream"
            proxy.mode = "pass"
            assert (await behind.chat(STREAM)).status_code == 200
            await behind.check_clean()
        nursery.cancel_scope.cancel()
        await env.check_clean()


# ---- F2 stall mid-stream ------------------------------------------------------------------------------


async def test_f2_stalled_stream_errors_after_the_idle_timeout() -> None:
    """Idle timeout 1 s: the error event follows the last event after 1 s (>= 0.9 s always; the
    upper bound only tells the idle timeout from the 30 s request timeout, with room for a loaded
    machine - test_timeouts_virtual.py checks the time exactly)."""
    async with fault_env(1, stream_idle_timeout_seconds=1.0) as env:
        env.workers[0].script.append(Act("stall", events=5, after=3))
        last_data = error_at = None
        body = b""
        async with env.client.stream("POST", "/v1/chat/completions", json=STREAM) as response:
            assert response.status_code == 200
            async for chunk in response.aiter_raw():
                body += chunk
                if b'"error"' in chunk:
                    error_at = trio.current_time()
                elif b'"delta"' in chunk:
                    last_data = trio.current_time()
        assert last_data is not None and error_at is not None
        assert 0.9 <= error_at - last_data <= 10.0
        error = assert_stream_error_then_done(body)
        assert "no data from the worker for 1 s" in error["message"]
        await env.check_clean()


async def test_f2_stall_behind_a_proxy_and_a_slow_drip_that_is_no_stall() -> None:
    async with fault_env(1) as env, trio.open_nursery() as nursery:
        proxy = await nursery.start(FaultProxy(env.workers[0].port).run)
        async with fault_env(0, urls=[proxy.url], stream_idle_timeout_seconds=1.0) as behind:
            proxy.mode, proxy.limit = "stall_after", 400
            response = await behind.chat(STREAM)
            assert assert_stream_error_then_done(response.content)["code"] == "upstream_stream"
            proxy.mode, proxy.drip_seconds = "drip", 0.002  # bytes trickle, never 1 s apart
            env.workers[0].default = Act("ok", events=2)
            drip = await behind.chat(STREAM)
            assert drip.status_code == 200 and drip.content.endswith(b"data: [DONE]\n\n")
            assert b'"error"' not in drip.content
            proxy.mode = "pass"
            await behind.check_clean()
        nursery.cancel_scope.cancel()
        await env.check_clean()


# ---- F3 refused / blackholed / unresolvable worker with a healthy peer --------------------------------


@pytest.mark.parametrize("fault", ["refused", "blackholed", "unresolvable"])
async def test_f3_unreachable_worker_with_a_healthy_peer_no_client_error(fault: str) -> None:
    with Blackhole() as hole:
        bad = {
            "refused": f"http://127.0.0.1:{closed_port()}",
            "blackholed": f"http://127.0.0.1:{hole.port}",
            "unresolvable": "http://no-such-worker.invalid:8000",
        }[fault]
        # the bad worker is listed first and round robin starts there; it passed its first health
        # check (forced below), so the first request is sent to it and must fail over.  A blackhole
        # holds the start's check and the confirming probe of its connect timeout (docs/operations.md
        # §11.3) for the whole health check timeout: 5 s, not the environment's 10
        routing = {"health_check_timeout_seconds": 5.0} if fault == "blackholed" else {}
        async with fault_env(1, urls=[bad], connect_timeout_seconds=0.5, **routing) as env:
            for _ in range(env.handles.config.routing.health_successes_to_restore):
                env.handles.health.record_check(bad, True, "ok", trio.current_time())
            assert len(env.handles.health.healthy_targets()) == 2
            responses = [await env.chat(CHAT if i % 2 else STREAM) for i in range(10)]
            assert [r.status_code for r in responses] == [200] * 10
            assert all(r.content.endswith(b"data: [DONE]\n\n") for r in responses[::2])
            assert len(env.workers[0].generation_requests()) == 10
            if fault == "blackholed":  # suspect, then ejected when the probe times out
                assert await wait_until(lambda: not env.handles.health.worker(bad).healthy)
            target = bad
            value = env.handles.registry.get_sample_value
            assert value("agentd_proxy_failovers_total", {"target": target}) == 1.0
            assert value("agentd_health_target_healthy", {"target": target}) == 0.0
            [ejected] = [e for e in env.log.events("health_change") if e.get("source") == "outlier"]
            assert ejected["worker"] == bad
            await env.check_clean()


async def test_f3_worker_that_dies_is_ejected_and_its_requests_fail_over() -> None:
    """A worker process that exits: its listening port refuses; nothing in flight, nothing lost."""
    async with fault_env(2) as env:
        assert [(await env.chat(CHAT)).status_code for _ in range(4)] == [200] * 4
        dead = env.workers[0]
        dead.die()
        env.workers.remove(dead)
        responses = [await env.chat(STREAM) for _ in range(6)]
        assert [r.status_code for r in responses] == [200] * 6
        assert not env.handles.health.worker(dead.url).healthy
        await env.check_clean()


# ---- F4 keep-alive race -------------------------------------------------------------------------------


async def test_f4_keepalive_race_no_502() -> None:
    """Workers close idle connections after 0.5 s (uvicorn does after 5 s); agentd expires its idle
    connections after 0.4 s; clients pause around 0.5 s between requests.  Zero 502s."""
    async with fault_env(2, keepalive_expiry_seconds=0.4) as env:
        for w in env.workers:
            w.idle_timeout = 0.5
        statuses: list[int] = []

        async def client(seed: int) -> None:
            for i in range(6):
                statuses.append((await env.chat(STREAM if (seed + i) % 2 else CHAT)).status_code)
                await trio.sleep(0.42 + 0.02 * ((seed * 7 + i) % 8))  # 0.42 .. 0.56 s

        async with trio.open_nursery() as nursery:
            for seed in range(4):
                nursery.start_soon(client, seed)
        assert statuses == [200] * 24
        await env.check_clean()


async def test_f4_request_crossing_the_idle_close_is_sent_again_once() -> None:
    """The worker closes a reused connection as the request arrives (the race itself, forced): the
    request is sent once more on a new connection; the client sees one 200."""
    async with fault_env(1, keepalive_expiry_seconds=30.0) as env:
        worker = env.workers[0]
        assert (await env.chat(CHAT)).status_code == 200
        worker.script.append(Act("drop_request"))
        response = await env.chat(STREAM)
        assert response.status_code == 200 and response.content.endswith(b"data: [DONE]\n\n")
        first, dropped, resent = worker.generation_requests()
        assert dropped.connection == first.connection and resent.connection != first.connection
        assert env.pool.stale_retries_count == 1
        await env.check_clean()


async def test_f4_a_reused_connection_dropped_late_is_the_worker_failing_not_resent() -> None:
    """Closed 1.5 s after the request arrived: the worker had it (not the race), so a 502."""
    async with fault_env(1, keepalive_expiry_seconds=30.0) as env:
        worker = env.workers[0]
        assert (await env.chat(CHAT)).status_code == 200
        worker.script.append(Act("drop_request", delay=1.5))
        assert_openai_error(await env.chat(CHAT), 502, "upstream_stream")
        assert len(worker.generation_requests()) == 2
        assert env.pool.stale_retries_count == 0
        await env.check_clean()


async def test_f4_a_new_connection_dropped_is_never_resent() -> None:
    async with fault_env(1) as env:
        env.workers[0].script.append(Act("drop_request"))
        response = await env.chat(CHAT)
        assert_openai_error(response, 502, "upstream_stream")
        assert len(env.workers[0].generation_requests()) == 1
        await env.check_clean()


# ---- F5 garbage and truncated responses ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("act", "body"),
    [
        (Act("garbage"), CHAT),
        (Act("truncated"), CHAT),
        (Act("garbage"), STREAM),
    ],
)
async def test_f5_garbage_and_truncated_are_clean_502_and_the_connection_is_not_reused(act: Act, body: dict) -> None:
    async with fault_env(1) as env:
        worker = env.workers[0]
        worker.script.append(act)
        response = await env.chat(body)
        assert_openai_error(response, 502, "upstream_stream")
        assert (await env.chat(CHAT)).status_code == 200
        bad, good = worker.generation_requests()
        assert good.connection != bad.connection
        await env.check_clean()


@pytest.mark.parametrize("after", [0, 2])
async def test_f5_bad_chunk_after_the_stream_started_ends_with_error_and_done(after: int) -> None:
    """The head went to the client with the worker's: a stream cannot turn into a 502 any more."""
    async with fault_env(1) as env:
        env.workers[0].script.append(Act("bad_chunk", after=after))
        response = await env.chat(STREAM)
        assert response.status_code == 200
        assert assert_stream_error_then_done(response.content)["code"] == "upstream_stream"
        await env.check_clean()


async def test_f5_repeated_failures_eject_the_worker_and_traffic_moves() -> None:
    async with fault_env(2, outlier_consecutive_failures=3) as env:
        bad, good = env.workers
        bad.default = Act("garbage")
        statuses = [(await env.chat(CHAT)).status_code for _ in range(8)]
        # round robin: bad, good, bad, good, bad (3rd failure: ejected), then only good
        assert statuses == [502, 200, 502, 200, 502, 200, 200, 200]
        assert len(bad.generation_requests()) == 3
        assert not env.handles.health.worker(bad.url).healthy
        await env.check_clean()


# ---- F6 broken /metrics -------------------------------------------------------------------------------


async def test_f6_broken_metrics_one_fallback_log_and_one_recovery_log() -> None:
    program_identity = {"vllm_xargs": {"agentic_context": {"program_id": "p1"}}}
    async with fault_env(1, program=True) as env:
        worker = env.workers[0]
        assert (await env.chat({**CHAT, **program_identity})).status_code == 200  # polling starts
        dispatcher = env.handles.program_dispatcher

        async def rounds(n: int) -> None:
            start = worker.metrics_scrapes
            assert await wait_until(lambda: worker.metrics_scrapes >= start + n)

        await rounds(1)
        worker.metrics_broken = True
        await rounds(6)  # long enough to go stale (3 intervals) and stay broken
        worker.metrics_broken = False
        await rounds(2)
        failed = env.log.events("backend_observation_failed", 30)  # WARNING
        recovered = env.log.events("backend_observation_recovered")
        assert [f["base_url"] for f in failed] == [worker.url]
        assert [f["base_url"] for f in recovered] == [worker.url] and recovered[0]["failed_rounds"] >= 6
        fallback = env.log.events("capacity_observation_fallback")
        back = env.log.events("capacity_observation_recovered")
        assert len(fallback) == 1 and len(back) == 1
        assert dispatcher is not None
        await env.check_clean()


# ---- F7 health flapping within thresholds -------------------------------------------------------------


async def test_f7_health_flapping_within_thresholds_never_ejects() -> None:
    async with fault_env(2, health_failures_to_eject=3, health_successes_to_restore=2) as env:
        board, client = env.handles.health, env.handles.client
        flappy = env.workers[0]
        env.log.records.clear()  # the first round's verdicts
        # fail, fail, pass, repeated: never three failures in a row
        flappy.health.extend([503, 503, 200] * 10)
        for _ in range(30):
            await run_health_round(board, client, 1.0)
            assert len(board.healthy_targets()) == 2
        assert env.log.events("health_change") == []
        # three in a row eject; one pass does not restore, two do
        flappy.health.extend([503, 503, 503, 200, 503, 200, 200])
        verdicts = []
        for _ in range(7):
            await run_health_round(board, client, 1.0)
            verdicts.append(board.worker(flappy.url).healthy)
        assert verdicts == [True, True, False, False, False, False, True]
        assert [e["healthy"] for e in env.log.events("health_change")] == [False, True]
        await env.check_clean()


# ---- F8 client disconnects at random points -----------------------------------------------------------


async def _disconnect(url: str, mode: str, rng_value: float, body: dict) -> None:
    host, port = url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    raw = json.dumps(body if mode != "json" else {**body, "stream": False}).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(raw)}\r\n\r\n"
    ).encode()
    try:
        if mode == "upload":  # gone during the body upload
            await stream.send_all(head + raw[: int(len(raw) * rng_value)])
        elif mode == "head":  # gone before the head is complete
            await stream.send_all(head[: max(1, int(len(head) * rng_value))])
        else:  # gone while queued, waiting for the answer or reading it
            await stream.send_all(head + raw)
            if rng_value > 0.3:
                await stream.receive_some(200 if rng_value > 0.6 else 1)
    except (trio.BrokenResourceError, OSError):
        pass
    if rng_value > 0.5:
        abort(stream)
    else:
        await stream.aclose()


@pytest.mark.parametrize("program", [False, True], ids=["native", "program"])
async def test_f8_client_disconnects_at_random_points_counters_return_to_zero(program: bool) -> None:
    """Native: 1,600 disconnects; Program scheduling with room for about one request per rank, so
    most of its 400 wait in the queue and many leave from there."""
    rng = random.Random(8)
    total = 1600 if not program else 400
    async with fault_env(2, program=program, capacity=64) as env:
        for w in env.workers:
            w.default = Act("ok", events=20, delay=0.002)  # streams last ~40 ms: disconnects land mid-way
        limiter = trio.CapacityLimiter(40)
        url = env.handles.http_url
        assert url is not None

        async def one(i: int) -> None:
            body = dict(STREAM)
            if program:  # one Program per request: each is admitted on its own
                body["vllm_xargs"] = {"agentic_context": {"program_id": f"agent-{i}"}}
                body["messages"] = [{"role": "user", "content": "x" * 160}]  # about 40 tokens
            async with limiter:
                await _disconnect(url, rng.choice(["head", "upload", "stream", "stream", "json"]), rng.random(), body)

        with trio.fail_after(BUDGET_SECONDS * 3):
            async with trio.open_nursery() as nursery:
                for i in range(total):
                    nursery.start_soon(one, i)
        # the daemon still serves, and every counter returns to rest
        body = {**STREAM, "vllm_xargs": {"agentic_context": {"program_id": "after"}}} if program else STREAM
        assert (await env.chat(body)).status_code == 200
        doc = await env.check_clean()
        if program:
            counters = env.handles.program_dispatcher.counters  # type: ignore[union-attr]
            left_while_queued = counters.submitted_count - counters.admitted_count - counters.rejected_count
            assert left_while_queued > 0, counters
            assert doc["pending_replies"] == 0 and doc["program_open_leases"] == 0


# ---- a Program whose worker dies is rebound -----------------------------------------------------------


async def test_program_whose_worker_dies_is_rebound_without_a_client_error() -> None:
    async with fault_env(2, program=True) as env:
        body = {**STREAM, "vllm_xargs": {"agentic_context": {"program_id": "agent-1"}}}
        assert (await env.chat(body)).status_code == 200
        [home] = [w for w in env.workers if w.generation_requests()]
        home.die()
        env.workers.remove(home)
        responses = [await env.chat(body) for _ in range(3)]
        assert [r.status_code for r in responses] == [200] * 3
        assert all(r.content.endswith(b"data: [DONE]\n\n") for r in responses)
        [peer] = env.workers
        assert len(peer.generation_requests()) == 3
        assert not env.handles.health.worker(home.url).healthy
        [failover] = env.log.events("upstream_failover")
        assert failover["target"] == home.url
        doc = await env.check_clean()
        assert doc["program_open_leases"] == 0 and doc["pending_replies"] == 0
