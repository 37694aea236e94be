"""A Program request that could not reach its worker fails over through a relay as it does in one
process (docs/operations.md §11.2, §13.1): the failover never goes back to the worker that refused
it, even though the Grant of the failed attempt brought a resume pass to that worker (before
session 31 the failover used that pass and was forwarded to the dead worker again: a 502
``upstream_unreachable`` for 4-6 of 24 concurrent new Programs with two relays, none with one
process).  A pass to a worker out of the relay's rotation is not used either: the request asks
the scheduler, and the relay tells it the pass was let go (``Drop``).

The relay side is a real :class:`~daemon.http.proxy.ProxyEngine` with the relay's dispatchers;
the scheduler side the real hub, ProgramDispatcher and actors, over a Unix socket pair, in one
process under virtual time; the workers are faked at the HTTP boundary."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import trio
import trio.testing
from program_fakes import daemon_config, ok, program_request
from prometheus_client import CollectorRegistry
from test_remote_dispatch import Plane, plane
from test_resume_passes import T0, T1, _admitted, granted, scripted_relay

from daemon.dataplane.relay import RemoteOutcomes
from daemon.dataplane.wire import Ask, Drop, Finish, Grant
from daemon.dispatch import NativeDispatcher
from daemon.http.proxy import ProgramRoute, ProxyEngine
from daemon.metrics import ProxyMetrics

W0, W1 = "http://w0:8000", "http://w1:8000"
ANSWER = {
    "id": "x",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14},
}


class Workers:
    """Two workers at the HTTP boundary; the first one a request is sent to is dead: every connect
    to it is refused (a SIGKILLed worker), the other answers."""

    def __init__(self) -> None:
        self.dead: str | None = None
        self.sent: list[str] = []  # the worker of each connect attempt, in order

    async def handle(self, request: httpx.Request) -> httpx.Response:
        url = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        self.sent.append(url)
        if self.dead is None:
            self.dead = url
        if url == self.dead:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return httpx.Response(200, json=ANSWER)


class Sink:
    def __init__(self) -> None:
        self.status: int | None = None
        self.body = b""
        self.ended = False

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.status = status

    async def send(self, chunk: bytes) -> None:
        self.body += chunk

    async def end(self, chunk: bytes = b"") -> None:
        self.body += chunk
        self.ended = True


def relay_engine(p: Plane, workers: Workers, enable_key: str) -> tuple[ProxyEngine, ProxyMetrics]:
    """The proxy engine of a relay process (daemon/dataplane/relay_main.py ``_engine``), its
    workers faked."""
    targets = p.view.targets
    native = NativeDispatcher(targets, "consistent_hash", p.view, random.Random(0))
    native.others_in_flight = p.view.others_in_flight
    metrics = ProxyMetrics(CollectorRegistry(), [t.target_id for t in targets])
    engine = ProxyEngine(
        client=httpx.AsyncClient(transport=httpx.MockTransport(workers.handle)),
        native=native,
        metrics=metrics,
        agentic_context_forwarding="strip",
        program=ProgramRoute(enable_key, p.remote),
        outcomes=RemoteOutcomes(p.view, p.relay_link),
    )
    return engine, metrics


async def chat(engine: ProxyEngine, program_id: str) -> Sink:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": f"hello from {program_id}"}],
        "max_tokens": 8,
        # a retention hint keeps the Program Active (and its pass valid) between its two requests: with
        # the TTL fitted from no samples it could pause in the same instant and revoke the pass
        "vllm_xargs": {"agentic_context": {"program_id": program_id, "kv_retention_ttl_seconds": 60}},
    }
    raw = json.dumps(body).encode()
    req = engine.build_request("chat", raw, {"content-type": "application/json"})
    sink = Sink()
    await engine.handle(req, sink, raw_body=raw)
    return sink


def failovers(metrics: ProxyMetrics) -> float:
    total = 0.0
    for family in metrics.failovers.collect():
        total += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return total


async def test_a_relays_failover_does_not_take_the_pass_back_to_the_worker_that_refused_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The first attempt is granted on the dead worker with a resume pass (its Program is Active
    there); the connect is refused, the relay reports it and asks again for ``<id>.failover1``:
    that request must not be forwarded to the dead worker under the pass (the old code did, and
    the client got a 502 ``upstream_unreachable``), but admitted by the scheduler, whose board
    already has the worker out of rotation, on the other worker."""
    cfg = daemon_config(workers=(W0, W1), dp=1, token_capacity_per_dp_rank=10_000)
    assert cfg.program_scheduling is not None
    async with plane(cfg) as p:
        workers = Workers()
        engine, metrics = relay_engine(p, workers, cfg.program_scheduling.program_scheduling_enable_key)
        sink = await chat(engine, "fo-1")
        assert sink.status == 200 and json.loads(sink.body) == ANSWER
        assert workers.dead is not None
        alive = W1 if workers.dead == W0 else W0
        assert workers.sent == [workers.dead, alive]  # one connect to the dead worker, never a second
        assert p.remote.counters.passes_received_count >= 1  # the failed attempt's Grant carried a pass
        assert p.remote.counters.passed_count == 0
        assert failovers(metrics) == 1.0
        assert p.board.reports[0] == (workers.dead, False, True)  # refused: ejected at once
        assert p.dispatcher is not None
        doc = await p.dispatcher.wait_diagnostics(lambda d: d["dispatcher"]["completed_count"] == 1)
        assert {k: doc["dispatcher"][k] for k in ("submitted_count", "admitted_count", "abandoned_count")} == {
            "submitted_count": 2,  # the request and its failover
            "admitted_count": 2,
            "abandoned_count": 1,  # the first attempt, released unfinished
        }
        # the Program's next request goes where its failover ran, under the pass that came with it
        again = await chat(engine, "fo-1")
        assert again.status == 200
        assert workers.sent == [workers.dead, alive, alive]
        assert p.remote.counters.passed_count == 1
        assert trio.current_time() == 0.0


async def test_a_pass_to_a_worker_out_of_the_relays_rotation_is_dropped_and_the_request_asks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A pass whose worker this relay saw refuse a connect (or the scheduler's snapshot left out) is
    not used: the Program's next request waits for the scheduler's answer like one without a pass,
    and the relay sends a ``Drop`` for the pass it let go."""
    async with scripted_relay() as (remote, scheduler):
        first = program_request("a")
        async with granted(remote, scheduler, first, T1, 5) as lease:
            lease.finish(ok())
        assert isinstance(await scheduler.next(), Finish)
        assert set(remote.passes) == {("default", "a")}
        assert remote.rotation is not None
        # another request saw the worker refuse: out of this relay's rotation before any snapshot
        remote.rotation.eject(T1.worker_url, 1)
        entered = trio.Event()

        async def second() -> None:
            async with remote.lease(program_request("a")) as lease:
                entered.set()
                assert lease.target == T0
                lease.finish(ok())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(second)
            assert await scheduler.next() == Drop(5)
            ask: Any = await scheduler.next()
            assert isinstance(ask, Ask) and (ask.pass_number, ask.pass_target) == (0, "")
            await trio.testing.wait_all_tasks_blocked()
            assert not entered.is_set()  # it waits for the answer
            scheduler.link.send(Grant(ask.lease, _admitted(ask.request.request_id, T0), 0, 0))
        c = remote.counters
        assert (c.passed_count, c.passes_dropped_count, c.asked_count) == (0, 1, 2)
