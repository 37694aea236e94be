"""Queue ETA in front of a slow worker whose engine waiting gate stays closed (docs/program-scheduling.md
§13, "The waiting gate"), in process and in virtual time.

The fake worker (an ``httpx.MockTransport`` handler, the process boundary) is one engine that runs
one request at a time, each for exactly ``SERVICE`` seconds, first come first served, and reports
its running and waiting counts on ``/metrics``.  Four Programs sent at once are all admitted by the
first pass (no observation yet), so the engine queues three of them: its waiting count closes
agentd's waiting gate (``admission_waiting_request_threshold = 1``) at every scrape until the last
one runs.  A Program arriving meanwhile fits the rank (count and tokens), so before this fix it was
told "the next tick" (under a second) and waited until the engine's queue had drained (session 31's
operator walk: told 0.6-1.0 s, waited about 10 s).
"""

from __future__ import annotations

import json
from functools import partial

import attrs
import httpx
import pytest
import trio
import trio.testing
from native_fakes import make_config
from test_program_scheduling import PROMPT_TOKENS, ProgramWorker, chat, configured_daemon

from actors.core.config import ProgramSchedulingConfig

SERVICE = 2.4  # seconds one request occupies the engine (no completion at the instant of a scrape)
HEADER = "x-agentd-max-queue-seconds"


class SerialEngine(ProgramWorker):
    """One engine, one request at a time (FCFS), ``SERVICE`` seconds each."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = trio.Lock()  # fair: FIFO
        self.running = 0
        self.queued = 0
        self.started: dict[str, float] = {}

    async def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            self.metrics_scrapes += 1
            text = (
                f'vllm:num_requests_running{{engine="0"}} {self.running}\n'
                f'vllm:num_requests_waiting{{engine="0"}} {self.queued}\n'
                'vllm:kv_cache_usage_perc{engine="0"} 0.0\n'
            )
            return httpx.Response(200, text=text)
        if request.url.path != "/v1/chat/completions":
            return await super().handler(request)
        body = json.loads(await request.aread())
        name = body["messages"][-1]["content"]
        self.arrival(name).set()
        self.queued += 1
        async with self.lock:
            self.queued -= 1
            self.running += 1
            self.started[name] = trio.current_time()
            await trio.sleep(SERVICE)
            self.running -= 1
        usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 2, "total_tokens": PROMPT_TOKENS + 2}
        message = {"role": "assistant", "content": "ok"}
        return httpx.Response(
            200,
            json={
                "id": "c",
                "object": "chat.completion",
                "model": "m",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": usage,
            },
        )


async def test_a_program_behind_a_closed_waiting_gate_is_told_when_the_engine_drains(
    autojump_clock: trio.testing.MockClock,
) -> None:
    engine = SerialEngine()
    cfg = attrs.evolve(
        make_config(engine.urls, policy="round_robin"),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(admission_waiting_request_threshold=1),
    )
    answers: dict[str, httpx.Response] = {}
    async with configured_daemon(engine, cfg) as (handles, client), trio.open_nursery() as nursery:
        ps = handles.program_dispatcher

        async def send(name: str) -> None:
            answers[name] = await client.post("/v1/chat/completions", json=chat(name, name))

        nursery.start_soon(send, "a")  # the first Program request starts the observation rounds:
        await engine.arrival("a").wait()
        start = trio.current_time()  # ticks and scrapes at start + 0, 1, 2, ...
        await trio.sleep(0.5)  # the scrape at start showed nothing waiting: the gate is open
        for name in ("b", "c", "d"):
            nursery.start_soon(send, name)
        for name in ("b", "c", "d"):
            await engine.arrival(name).wait()
        assert trio.current_time() == start + 0.5  # admitted at once; the engine queues them
        # the engine runs a (0-2.4), then b, c and d 2.4 s each (-4.8, -7.2, -9.6): the scrapes
        # at 1 and 2 show 3 requests waiting, those at 3 and 4 show 2, then 1 from 5 to 7, none at 8
        await ps.wait_diagnostics(lambda d: d["dispatcher"]["completed_count"] == 1)
        assert trio.current_time() == start + SERVICE
        await trio.sleep(0.5)  # start + 2.9
        diag = ps.diagnostics()
        (rank,) = diag["ranks"]
        assert (rank["vllm_running_requests"], rank["vllm_waiting_requests"]) == (1, 3)
        (line,) = diag["queue_eta"]["lines"]
        assert line["waiting_gate_lasting"] is True
        assert line["engine_completion_interval_seconds"] == pytest.approx(SERVICE)
        # The gate was closed at two scrapes in a row.  The engine's queue now: 3 waiting at the
        # scrape at 2, minus a's completion since = 2, so 2 completions open it (1 waiting is still
        # the threshold).  One completion every 2.4 s (a's service time: the engine runs one
        # request at a time), the first 2.4 s after a's (1.9 s from now), the second 2.4 s later:
        # 4.3 s from now (7.2), and the scrape of the first tick from then (8) shows it open.
        expected = 5.1
        # a client that waits at most 2 s is refused at once (was queued: told the next tick, 0.1 s)
        refused = await client.post("/v1/chat/completions", json=chat("q", "q"), headers={HEADER: "2"})
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "6"
        assert f"expected queue wait {expected:.1f}s (position 1)" in refused.json()["error"]["message"]
        # the same request without a bound waits, and is admitted when the ETA said
        t_queued = trio.current_time()
        nursery.start_soon(send, "e")
        await engine.arrival("e").wait()
        assert trio.current_time() - t_queued == pytest.approx(expected)
        await ps.wait_diagnostics(lambda d: d["queue_eta"]["samples_count"] == 1)
        assert ps.diagnostics()["queue_eta"]["median_relative_error"] == pytest.approx(0.0, abs=1e-9)
    assert [answers[n].status_code for n in "abcde"] == [200] * 5
    assert sorted(engine.started.values()) == pytest.approx([start + k * SERVICE for k in range(5)])


class QueueingEngine(SerialEngine):
    """Each request waits ``START`` seconds in the engine's queue (counted as waiting on
    ``/metrics``), then runs ``RUN`` seconds."""

    START, RUN = 1.5, 0.2

    async def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/chat/completions":
            return await super().handler(request)
        body = json.loads(await request.aread())
        name = body["messages"][-1]["content"]
        self.arrival(name).set()
        self.queued += 1
        await trio.sleep(self.START)
        self.queued -= 1
        self.running += 1
        await trio.sleep(self.RUN)
        self.running -= 1
        usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 2, "total_tokens": PROMPT_TOKENS + 2}
        message = {"role": "assistant", "content": "ok"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        return httpx.Response(
            200, json={"id": "c", "object": "chat.completion", "model": "m", "choices": [choice], "usage": usage}
        )


async def test_do_not_queue_on_an_idle_cluster_right_after_a_request(autojump_clock: trio.testing.MockClock) -> None:
    """``x-agentd-max-queue-seconds: 0`` right after the previous request finished, the cluster
    idle: served (docs/program-scheduling.md §3, §13).  The last scrape still showed that request
    waiting in the engine, so the waiting gate held the next one until the next scrape, and a
    bound of 0 refused it with a 429 (before session 33)."""
    engine = QueueingEngine()
    cfg = attrs.evolve(
        make_config(engine.urls, policy="round_robin"),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(admission_waiting_request_threshold=1),
    )
    async with configured_daemon(engine, cfg) as (handles, client):
        ps = handles.program_dispatcher
        first = await client.post("/v1/chat/completions", json=chat("a", "a"))
        assert first.status_code == 200
        # a waited 1.5 s in the engine: the scrape at 1.0 saw it waiting, the next one is at 2.0
        assert trio.current_time() == pytest.approx(QueueingEngine.START + QueueingEngine.RUN)
        (rank,) = ps.diagnostics()["ranks"]
        assert (rank["vllm_running_requests"], rank["vllm_waiting_requests"]) == (0, 1)
        again = await client.post("/v1/chat/completions", json=chat("q", "q"), headers={HEADER: "0"})
        assert again.status_code == 200, again.text
        # and, with something of agentd's in flight, the scrape's count holds the gate as before
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(client.post, "/v1/chat/completions", json=chat("b", "b")))
            await engine.arrival("b").wait()
            await ps.wait_diagnostics(lambda d: d["ranks"][0]["vllm_waiting_requests"] == 1)
            held = await client.post("/v1/chat/completions", json=chat("r", "r"), headers={HEADER: "0"})
            assert held.status_code == 429 and held.json()["error"]["code"] == "queue_wait_exceeds_bound"
