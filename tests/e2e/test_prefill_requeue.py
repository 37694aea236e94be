"""Re-queueing a blocking long prefill, end to end through the proxy (docs/priority.md §3,
"Re-queueing a blocking long prefill").

The daemon runs in process in front of a fake worker (the process boundary) under
``autojump_clock``: a heavy tenant's two 30,000-token Programs arrive at t = 0 (the second waits:
one long prefill at a time), a light tenant's request at t = 1 s.  The fake worker sends an
event stream's head at once and its first token only after a 5 s "prefill".  The scheduler asks
for the first hog's prefill back; the proxy aborts it upstream (the worker sees the cancellation
at t = 1 s), the light request is answered at once, and the hog is forwarded again once the rank
is no longer kept for the light tenant.  The hog's client sees one clean stream: one head, one
content event, ``[DONE]``; the ledger and the tenants' charges are exact.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import attrs
import httpx
import trio
import trio.testing
from native_fakes import make_config

from actors.core.config import ProgramSchedulingConfig
from daemon.config import PrioritySection
from daemon.handles import DaemonHandles
from daemon.http.app import create_app
from daemon.supervisor import run_daemon

W0 = "http://w0:8000"
PREFILL_SECONDS = 5.0
DECODE_SECONDS = 0.5  # first token to the end of the answer
HOG_CHARS = 120_000  # 30,000 tokens at the estimator's starting 0.25 token per byte


class PrefillWorker:
    """One vLLM-like worker rank: a stream's head at once, its first token after a prefill time
    (``PREFILL_SECONDS`` for prompts of ``HOG_CHARS``, 0.1 s otherwise), its end
    ``DECODE_SECONDS`` later; prefills run one at a time in arrival order, so a request arriving
    behind a running prefill waits for it (decodes run beside them)."""

    def __init__(self) -> None:
        self.engine = trio.Lock()  # FIFO: one prefill at a time, as a non-preemptive engine runs them
        self.seen: list[tuple[str, float, str]] = []  # (name, time, upstream request id)
        self.aborted: list[tuple[str, float]] = []
        self.completed: list[tuple[str, float]] = []

    def client(self, cfg: Any = None) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.MockTransport(self.handler))

    async def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        if request.url.path == "/metrics":
            lines = [
                'vllm:num_requests_running{engine="0"} 0',
                'vllm:num_requests_waiting{engine="0"} 0',
                'vllm:kv_cache_usage_perc{engine="0"} 0.0',
            ]
            return httpx.Response(200, text="\n".join(lines) + "\n")
        body = json.loads(await request.aread())
        content = body["messages"][-1]["content"]
        name = content.split(" ", 1)[0]
        self.seen.append((name, trio.current_time(), request.headers.get("x-request-id", "")))
        prompt = len(content) // 4
        prefill = PREFILL_SECONDS if len(content) >= HOG_CHARS else 0.1
        worker = self

        async def events() -> AsyncIterator[bytes]:
            try:
                async with worker.engine:
                    await trio.sleep(prefill)
            except trio.Cancelled:
                worker.aborted.append((name, trio.current_time()))
                raise
            chunk = {
                "id": name,
                "object": "chat.completion.chunk",
                "model": "m",
                "choices": [{"index": 0, "delta": {"content": f"answer-{name}"}, "finish_reason": "stop"}],
            }
            yield f"data: {json.dumps(chunk)}\n\n".encode()  # the first token
            await trio.sleep(DECODE_SECONDS)  # the rest of the decode, beside other requests
            usage = {"prompt_tokens": prompt, "completion_tokens": 3, "total_tokens": prompt + 3}
            tail = {"id": name, "object": "chat.completion.chunk", "model": "m", "choices": [], "usage": usage}
            worker.completed.append((name, trio.current_time()))
            yield f"data: {json.dumps(tail)}\n\ndata: [DONE]\n\n".encode()

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events())


def request(name: str, program: str, chars: int) -> dict[str, Any]:
    text = (name + " " + "x" * chars)[: max(chars, len(name))]
    return {
        "model": "m",
        "messages": [{"role": "user", "content": text}],
        "stream": True,
        "max_tokens": 3,
        "vllm_xargs": {"agentic_context": {"program_id": program, "expected_resume": False}},
    }


@asynccontextmanager
async def daemon(worker: PrefillWorker, *, requeue: bool) -> AsyncIterator[tuple[DaemonHandles, httpx.AsyncClient]]:
    cfg = attrs.evolve(
        make_config((W0,), dp=1, policy="round_robin"),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(token_capacity_per_dp_rank=100_000, metrics_interval_seconds=0.5),
        priority=PrioritySection(
            heavy_tenant_max_active_per_rank=0,
            long_prefill_seconds=2.0,
            requeue_long_prefills=requeue,
        ),
    )
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(
                partial(run_daemon, cfg, client_factory=worker.client, rng=random.Random(1), serve_http=False)
            )
            transport = httpx.ASGITransport(create_app(handles))  # type: ignore[arg-type]
            try:
                async with httpx.AsyncClient(transport=transport, base_url="http://agentd") as client:
                    yield handles, client
            finally:
                handles.shutdown.set()


def data_events(raw: bytes) -> list[str]:
    return [e[len("data: ") :] for e in raw.decode().split("\n\n") if e.startswith("data: ")]


async def run_scenario(
    requeue: bool, light_at: float = 1.0, light_again_at: float | None = None
) -> tuple[PrefillWorker, dict[str, httpx.Response], dict[str, float], Any]:
    worker = PrefillWorker()
    responses: dict[str, httpx.Response] = {}
    ended: dict[str, float] = {}
    async with daemon(worker, requeue=requeue) as (handles, client):
        t0 = trio.current_time()

        async def send(name: str, program: str, tenant: str, chars: int, at: float) -> None:
            await trio.sleep_until(t0 + at)
            r = await client.post(
                "/v1/chat/completions", json=request(name, program, chars), headers={"x-agentd-tenant": tenant}
            )
            responses[name] = r
            ended[name] = trio.current_time() - t0

        async with trio.open_nursery() as reqs:
            reqs.start_soon(send, "hog0", "h0", "x", HOG_CHARS, 0.0)
            reqs.start_soon(send, "hog1", "h1", "x", HOG_CHARS, 0.01)
            reqs.start_soon(send, "light", "l0", "y", 400, light_at)
            if light_again_at is not None:  # the light tenant's next task (a new Program)
                reqs.start_soon(send, "light2", "l1", "y", 400, light_again_at)
        ps = handles.program_dispatcher
        assert ps is not None
        diag = await ps.wait_diagnostics(lambda d: d["retained_requests"] == 0)
        metrics = (await client.get("/metrics")).text
        return worker, responses, ended, (ps.counters, diag, metrics, ps.fairness_view())


def metric(text: str, line_start: str) -> float:
    (line,) = [ln for ln in text.splitlines() if ln.startswith(line_start)]
    return float(line.rsplit(" ", 1)[1])


async def test_a_blocking_long_prefill_is_taken_back_and_the_client_sees_one_stream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    worker, responses, ended, (counters, diag, metrics, fair) = await run_scenario(requeue=True)
    # the hog's first attempt was aborted upstream at the light request's arrival, before its first token
    assert worker.aborted == [("hog0", 1.0)]
    names = [(name, at) for name, at, _ in worker.seen]
    assert names[:2] == [("hog0", 0.0), ("light", 1.0)]
    # the light request ran alone: answered after its own 0.1 s prefill
    assert ended["light"] == 1.1 + DECODE_SECONDS
    # hog0 went again once the rank was no longer kept for the light tenant: 3 s after the last
    # pass that saw it there (the tick at 1.5 s, its request ran until 1.6 s), at the tick of
    # 4.5 s; hog1 at hog0's end (its long prefill is over), each 5 s of prefill and 0.5 s of decode
    assert names[2:] == [("hog0", 4.5), ("hog1", 10.0)]
    assert ended["hog0"] == 10.0 and ended["hog1"] == 15.5
    ids = [rid for name, _, rid in worker.seen if name == "hog0"]
    assert len(set(ids)) == 2  # the engine sees two distinct request ids (docs/operations.md §12)
    # one clean stream for the client: one head, one answer, the usage removed, one [DONE]
    hog = responses["hog0"]
    assert hog.status_code == 200 and hog.headers["content-type"].startswith("text/event-stream")
    events = data_events(hog.content)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    contents = [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]]
    assert contents == ["answer-hog0"]
    assert all(r.status_code == 200 for r in responses.values())
    # nothing leaked: every lease ended once, the ledger is empty, the accounts are exact
    assert (counters.open_leases(), counters.requeued_count, counters.completed_count) == (0, 1, 3)
    rank = diag["ranks"][0]
    assert (
        rank["router_in_flight_requests"],
        rank["router_queued_requests"],
        rank["router_active_reasoning_programs"],
    ) == (
        0,
        0,
        0,
    )
    # the first dispatch's charge was refunded: each hog is charged its estimate once (120,008
    # text bytes x 0.25); the output as reported, once per completed request
    assert fair["accounts"]["x"]["input_tokens"] == 2 * 30_002
    assert fair["accounts"]["x"]["output_tokens"] == 2 * 3
    assert metric(metrics, 'agentd_prefill_requeues_total{outcome="requeued"}') == 1.0
    assert metric(metrics, 'agentd_proxy_requeued_total{target="http://w0:8000"}') == 1.0
    assert metric(metrics, 'vllm_router_agent_aware_transitions_total{reason="prefill_requeue",target=') == 1.0


async def test_without_requeue_the_light_request_waits_for_the_prefill(
    autojump_clock: trio.testing.MockClock,
) -> None:
    worker, _responses, ended, (counters, _diag, _metrics, _fair) = await run_scenario(requeue=False)
    assert worker.aborted == [] and counters.requeued_count == 0
    assert ended["light"] == PREFILL_SECONDS + 0.1 + DECODE_SECONDS  # behind hog0's whole prefill


async def test_a_prefill_whose_answer_started_is_not_taken_back(autojump_clock: trio.testing.MockClock) -> None:
    """The core's estimate (5.742 s for 30,000 tokens) outlives the fake's 5 s prefill: the light
    request at 5.2 s makes the core ask for hog0 back, but its first token went to the client at
    5.0 s, so the proxy leaves it alone (``too_late``) and the client's stream is untouched."""
    worker, responses, ended, (counters, _diag, metrics, _fair) = await run_scenario(requeue=True, light_at=5.2)
    assert worker.aborted == [] and counters.requeued_count == 0
    assert metric(metrics, 'agentd_prefill_requeues_total{outcome="too_late"}') == 1.0
    assert metric(metrics, 'agentd_prefill_requeues_total{outcome="requeued"}') == 0.0
    assert ended["hog0"] == 5.0 + DECODE_SECONDS and ended["light"] == 5.3 + DECODE_SECONDS
    events = data_events(responses["hog0"].content)
    assert [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]] == ["answer-hog0"]
    assert counters.open_leases() == 0


async def test_a_light_tenant_back_during_the_second_prefill_takes_it_back_once_more(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """hog0's second forward (at 4.5 s, above) is taken back too when the light tenant comes back
    at 6 s while it prefills (docs/priority.md §3: at most twice per request); its third forward
    runs to its end, and its client still sees one clean stream."""
    worker, responses, ended, (counters, _diag, metrics, fair) = await run_scenario(requeue=True, light_again_at=6.0)
    assert worker.aborted == [("hog0", 1.0), ("hog0", 6.0)]
    assert ended["light2"] == 6.1 + DECODE_SECONDS  # not behind hog0's second prefill (9.5 s)
    names = [(name, at) for name, at, _ in worker.seen]
    # the third forward 3 s after the last pass that saw light2 in flight (the tick at 6.5 s; it
    # ran until 6.6 s), hog1 at its end
    assert names == [("hog0", 0.0), ("light", 1.0), ("hog0", 4.5), ("light2", 6.0), ("hog0", 9.5), ("hog1", 15.0)]
    assert ended["hog0"] == 15.0 and ended["hog1"] == 20.5
    ids = [rid for name, _, rid in worker.seen if name == "hog0"]
    assert len(set(ids)) == 3
    events = data_events(responses["hog0"].content)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    assert [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]] == ["answer-hog0"]
    assert all(r.status_code == 200 for r in responses.values())
    assert (counters.open_leases(), counters.requeued_count, counters.completed_count) == (0, 2, 4)
    assert fair["accounts"]["x"]["input_tokens"] == 2 * 30_002  # both refunds exact
    assert metric(metrics, 'agentd_prefill_requeues_total{outcome="requeued"}') == 2.0
