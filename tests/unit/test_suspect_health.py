"""A connect timeout makes a worker suspect, not ejected: one confirming ``GET /health`` settles it
(docs/operations.md §11.3).  Exact virtual times: the daemon runs in-process under the autojump
clock; the workers are faked at the HTTP boundary (a transport that honours the request's connect
timeout as daemon.h1client does)."""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Iterator
from functools import partial

import attrs
import httpx
import pytest
import trio
import trio.testing
from log_capture import EventLog, attached

from actors.core.config import BackendTarget
from daemon.config import AgentdConfig, BatchApiConfig, RoutingConfig, ServerConfig
from daemon.handles import DaemonHandles
from daemon.health import HealthBoard, check_worker
from daemon.supervisor import run_daemon

W0, W1 = "http://w0:8000", "http://w1:8000"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
CONNECT = 0.5  # connect_timeout_seconds
PROBE = 2.0  # health_check_timeout_seconds


class Worker:
    """One fake worker: ``connect_delays`` is consumed one per connection (then ``connect_delay``);
    a connect slower than the request's connect timeout raises ``ConnectTimeout`` at that timeout,
    as daemon.h1client does; ``health_delay`` is how long ``/health`` takes to answer (None: never)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.connect_delays: list[float] = []
        self.connect_delay = 0.0
        self.health_delay: float | None = 0.0
        self.health_at: list[float] = []  # trio time of each /health request
        self.served_at: list[float] = []  # trio time of each generation request answered

    async def handle(self, request: httpx.Request) -> httpx.Response:
        delay = self.connect_delays.pop(0) if self.connect_delays else self.connect_delay
        limit = (request.extensions.get("timeout") or {}).get("connect")
        if limit is not None and delay > limit:
            await trio.sleep(limit)
            raise httpx.ConnectTimeout(f"connecting took more than {limit:g} s", request=request)
        await trio.sleep(delay)
        if request.url.path == "/health":
            self.health_at.append(trio.current_time())
            if self.health_delay is None:
                await trio.sleep_forever()
            await trio.sleep(self.health_delay)
            return httpx.Response(200, json={})
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m", "object": "model"}]})
        if request.url.path == "/metrics":
            return httpx.Response(404)
        self.served_at.append(trio.current_time())
        return httpx.Response(200, json={"choices": [{"index": 0, "message": {"content": "ok"}}], "usage": None})


class Cluster:
    def __init__(self, *urls: str) -> None:
        self.workers = {url: Worker(url) for url in urls}

    async def handler(self, request: httpx.Request) -> httpx.Response:
        return await self.workers[f"http://{request.url.host}:{request.url.port}"].handle(request)

    def transport(self, cfg: AgentdConfig) -> httpx.AsyncBaseTransport:
        return httpx.MockTransport(self.handler)


def config(urls: tuple[str, ...] = (W0, W1), **routing: float) -> AgentdConfig:
    settings: dict[str, float] = {
        "connect_timeout_seconds": CONNECT,
        "health_check_timeout_seconds": PROBE,
        "health_check_interval_seconds": 3600.0,  # no periodic round unless a test says so
        **routing,
    }
    return AgentdConfig(
        server=ServerConfig(port=0),
        routing=RoutingConfig(worker_urls=urls, policy="round_robin", **settings),  # type: ignore[arg-type]
        batch_api=BatchApiConfig(enabled=False),
    )


class HealthLog(EventLog):
    """The daemon's log events, with a wait for the next one."""

    def __init__(self) -> None:
        super().__init__()
        self._logged = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        self._logged.set()

    async def wait_for(self, name: str, count: int = 1) -> list[tuple[float, dict]]:
        """The events called ``name`` once there are ``count`` of them (virtual time: bounded)."""
        with trio.fail_after(3600):
            while len(self.named(name)) < count:
                self._logged = trio.Event()
                await self._logged.wait()
        return self.named(name)


@pytest.fixture
def health_log() -> Iterator[HealthLog]:
    handler = HealthLog()
    with attached(handler, "agentd", logging.INFO):
        yield handler


async def chat(handles: DaemonHandles) -> tuple[int | None, dict]:
    sink = await handles.handle_collect(handles.build_request("chat", json.dumps(CHAT).encode(), {}))
    return sink.status, json.loads(sink.body)


def sample(handles: DaemonHandles, name: str, **labels: str) -> float:
    return handles.registry.get_sample_value(name, labels) or 0.0


async def test_a_connect_timeout_makes_the_worker_suspect_and_a_passed_probe_restores_it_at_once(
    autojump_clock: trio.testing.MockClock, health_log: HealthLog
) -> None:
    cluster = Cluster(W0, W1)
    w0 = cluster.workers[W0]
    w0.health_delay = 0.25
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(
            partial(run_daemon, config(), transport_factory=cluster.transport, serve_http=False, rng=random.Random(1))
        )
        board = handles.health
        t0 = trio.current_time()
        w0.connect_delays = [60.0]  # the next connection to w0 times out (once)
        status, _ = await chat(handles)  # round robin starts at w0: fails over to w1
        assert status == 200
        assert cluster.workers[W1].served_at == [t0 + CONNECT]
        # suspect at t0 + CONNECT: out of rotation, a probe sent at once
        [(t_suspect, fields)] = health_log.named("health_suspect")
        assert t_suspect == t0 + CONNECT
        assert fields["worker"] == W0 and "ConnectTimeout" in fields["detail"] and fields["others_in_rotation"] == 1
        assert board.worker(W0).suspect and board.worker(W0).healthy
        assert board.worker(W0).reason.startswith("suspect: connect timeout (timeout: ConnectTimeout")
        assert [t.worker_url for t in board.healthy_targets()] == [W1]
        # the probe answered 0.25 s later: back in rotation then, without the restore threshold
        [(t_restored, restored)] = await health_log.wait_for("health_suspect_restored")
        assert t_restored == t0 + CONNECT + 0.25
        assert restored == {
            "worker": W0,
            "probe": "ok",
            "suspect_seconds": 0.25,
            "detail": fields["detail"],
        }
        assert w0.health_at == [0.0, t0 + CONNECT]  # the start's check, then the probe at once
        assert [t.worker_url for t in board.healthy_targets()] == [W0, W1]
        assert board.worker(W0).reason == "ok"
        assert [f for _, f in health_log.named("health_change") if not f["healthy"]] == []
        assert sample(handles, "agentd_health_suspects_total", target=W0, outcome="restored") == 1.0
        assert sample(handles, "agentd_health_suspects_total", target=W0, outcome="ejected") == 0.0
        assert sample(handles, "agentd_health_ejections_total", target=W0, source="outlier") == 0.0
        assert sample(handles, "agentd_proxy_failovers_total", target=W0) == 1.0
        assert sample(handles, "agentd_health_target_healthy", target=W0) == 1.0
        # served again right away
        before = len(w0.served_at)
        assert [(await chat(handles))[0] for _ in range(2)] == [200, 200]
        assert len(w0.served_at) == before + 1
        nursery.cancel_scope.cancel()


async def test_a_failed_probe_ejects_the_worker_after_the_health_check_timeout(
    autojump_clock: trio.testing.MockClock, health_log: HealthLog
) -> None:
    cluster = Cluster(W0, W1)
    w0 = cluster.workers[W0]
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(
            partial(run_daemon, config(), transport_factory=cluster.transport, serve_http=False, rng=random.Random(1))
        )
        board = handles.health
        t0 = trio.current_time()
        w0.connect_delay = 60.0  # blackholed from now on: the probe's connect never completes either
        assert (await chat(handles))[0] == 200
        [(t_ejected, change)] = [e for e in await health_log.wait_for("health_change", 3) if not e[1]["healthy"]]
        # the probe's only bound is health_check_timeout_seconds (not the 0.5 s connect timeout)
        assert t_ejected == t0 + CONNECT + PROBE
        assert change["healthy"] is False and change["source"] == "outlier"
        assert change["reason"] == (
            f"ejected: connect timeout (timeout: ConnectTimeout: connecting took more than {CONNECT:g} s), "
            "then the confirming /health probe failed: timeout"
        )
        assert not board.worker(W0).healthy and not board.worker(W0).suspect
        assert sample(handles, "agentd_health_suspects_total", target=W0, outcome="ejected") == 1.0
        assert sample(handles, "agentd_health_ejections_total", target=W0, source="outlier") == 1.0
        assert sample(handles, "agentd_health_target_healthy", target=W0) == 0.0
        nursery.cancel_scope.cancel()


async def test_when_every_worker_is_suspect_requests_go_to_the_suspects_not_a_503(
    autojump_clock: trio.testing.MockClock, health_log: HealthLog
) -> None:
    """Both workers miss one connect each (a starved proxy): the first request gets the second
    timeout's 504 as before, but the next is served by a suspect instead of a 503."""
    cluster = Cluster(W0, W1)
    for worker in cluster.workers.values():
        worker.health_delay = 1.0  # the probes settle only after the next request
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(
            partial(run_daemon, config(), transport_factory=cluster.transport, serve_http=False, rng=random.Random(1))
        )
        board = handles.health
        t0 = trio.current_time()
        for worker in cluster.workers.values():
            worker.connect_delays = [60.0]
        status, _ = await chat(handles)
        assert status == 504  # both attempts timed out at connect (one failover per other worker)
        assert trio.current_time() == t0 + 2 * CONNECT
        assert board.worker(W0).suspect and board.worker(W1).suspect
        [(_, first), (_, second)] = health_log.named("health_suspect")
        assert (first["others_in_rotation"], second["others_in_rotation"]) == (1, 0)
        assert [t.worker_url for t in board.healthy_targets()] == [W0, W1]  # the last resort
        status, _ = await chat(handles)
        assert status == 200
        assert trio.current_time() == t0 + 2 * CONNECT  # served at once, before either probe settled
        await health_log.wait_for("health_suspect_restored", 2)
        assert [t.worker_url for t in board.healthy_targets()] == [W0, W1]
        assert board.suspects_count == {"ejected": 0, "restored": 2}
        nursery.cancel_scope.cancel()


async def test_a_failover_among_suspects_does_not_go_back_to_the_worker_it_left(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Three workers, all suspect (the last resort), consistent hashing: a request that times out
    on its worker fails over to another one, not to the same worker again by the same hash."""
    w2 = "http://w2:8000"
    cluster = Cluster(W0, W1, w2)
    cfg = config((W0, W1, w2))
    cfg = attrs.evolve(cfg, routing=attrs.evolve(cfg.routing, policy="consistent_hash"))
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(
            partial(run_daemon, cfg, transport_factory=cluster.transport, serve_http=False, rng=random.Random(1))
        )
        board = handles.health
        assert (await chat(handles))[0] == 200
        [home] = [w for w in cluster.workers.values() if w.served_at]  # where the request's hash lands
        for worker in cluster.workers.values():
            worker.health_delay = 100.0  # the probes settle long after the request
        for url in (W0, W1, w2):
            assert board.report_failure(url, "timeout: ConnectTimeout", suspect=True) is True
        assert [t.worker_url for t in board.healthy_targets()] == [W0, W1, w2]
        home.connect_delays = [60.0]
        t0 = trio.current_time()
        status, _ = await chat(handles)
        assert status == 200
        assert trio.current_time() == t0 + CONNECT  # one connect timeout, then another worker
        assert len(home.served_at) == 1
        assert sum(len(w.served_at) for w in cluster.workers.values()) == 2
        nursery.cancel_scope.cancel()


async def test_refused_still_ejects_at_once(autojump_clock: trio.testing.MockClock, health_log: HealthLog) -> None:
    cluster = Cluster(W0, W1)
    original = cluster.handler

    async def refusing(request: httpx.Request) -> httpx.Response:
        if request.url.host == "w0" and request.url.path != "/health":
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return await original(request)

    cluster.handler = refusing  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(
            partial(run_daemon, config(), transport_factory=cluster.transport, serve_http=False, rng=random.Random(1))
        )
        assert (await chat(handles))[0] == 200
        assert not handles.health.worker(W0).healthy and not handles.health.worker(W0).suspect
        assert health_log.named("health_suspect") == []
        assert cluster.workers[W0].health_at == [0.0]  # the start's check only: no probe
        nursery.cancel_scope.cancel()


async def test_the_check_is_bounded_by_its_own_timeout_not_the_clients_connect_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A connect slower than connect_timeout_seconds but within the check's timeout passes: with
    a connect timeout set low for fast failover, a check (and a probe) is not failed by it."""
    cluster = Cluster(W0)
    cluster.workers[W0].connect_delay = 0.8  # > CONNECT, < PROBE
    async with httpx.AsyncClient(
        transport=cluster.transport(config()), timeout=httpx.Timeout(600, connect=CONNECT)
    ) as c:
        t0 = trio.current_time()
        assert await check_worker(c, W0, PROBE) == (True, "ok")
        assert trio.current_time() == t0 + 0.8
        cluster.workers[W0].connect_delay = 5.0
        assert await check_worker(c, W0, PROBE) == (False, "timeout")
        assert trio.current_time() == t0 + 0.8 + PROBE


# ---- the board's rules (synchronous where no time is involved) -------------------------------------


def board(*urls: str, **kwargs: int) -> HealthBoard:
    targets = [BackendTarget(worker_url=u, dp_rank=0, target_id=f"{u}@0", index=i) for i, u in enumerate(urls)]
    b = HealthBoard(targets, **kwargs)
    for url in urls:
        b.record_check(url, True, "ok", 0.0)
    return b


def probes(b: HealthBoard) -> list[str]:
    out = []
    while True:
        try:
            out.append(b.probe_requests.receive_nowait())
        except trio.WouldBlock:
            return out


async def test_a_second_connect_timeout_while_suspect_changes_nothing() -> None:
    b = board(W0, W1, outlier_failures=2)
    assert b.report_failure(W0, "timeout: a", suspect=True) is True
    assert b.report_failure(W0, "timeout: b", suspect=True) is False
    assert b.report_failure(W0, "timeout: c", suspect=True) is False
    assert probes(b) == [W0]  # one probe in flight per worker
    assert b.worker(W0).suspect_detail == "timeout: a" and b.worker(W0).outlier_failures_count == 0
    assert b.settle_suspect(W0, True, "ok", probe_started=b.worker(W0).suspect_since or 0.0) is True
    assert not b.worker(W0).suspect and [t.worker_url for t in b.healthy_targets()] == [W0, W1]


async def test_refused_or_the_outlier_threshold_while_suspect_eject_and_the_late_probe_is_ignored() -> None:
    b = board(W0, W1, outlier_failures=2)
    b.report_failure(W0, "timeout: a", suspect=True)
    started = trio.current_time()
    assert b.report_failure(W0, "unreachable: refused", eject_now=True) is True
    assert not b.worker(W0).healthy and not b.worker(W0).suspect
    assert b.worker(W0).reason == "ejected: unreachable: refused"
    assert b.suspects_count == {"ejected": 1, "restored": 0}
    assert b.settle_suspect(W0, True, "ok", probe_started=started) is False  # late: changes nothing
    assert not b.worker(W0).healthy
    b = board(W0, W1, outlier_failures=2)
    b.report_failure(W1, "timeout: a", suspect=True)
    assert [b.report_failure(W1, "stream: reset") for _ in range(2)] == [False, True]
    assert b.suspects_count == {"ejected": 1, "restored": 0}


async def test_periodic_checks_count_while_suspect_but_only_the_probe_settles() -> None:
    b = board(W0, W1, failures_to_eject=3)
    b.report_failure(W0, "timeout: a", suspect=True)
    reason = b.worker(W0).reason
    assert b.record_check(W0, True, "ok", 1.0) is False
    assert b.worker(W0).suspect and b.worker(W0).reason == reason  # a passed check does not settle it
    assert [t.worker_url for t in b.healthy_targets()] == [W1]
    assert [b.record_check(W0, False, "timeout", float(t)) for t in (2, 3, 4)] == [False, False, True]
    assert not b.worker(W0).healthy and not b.worker(W0).suspect  # the thresholds still eject
    assert b.suspects_count == {"ejected": 1, "restored": 0}


async def test_a_probe_older_than_the_suspicion_is_not_its_verdict(autojump_clock: trio.testing.MockClock) -> None:
    """Ejected while its probe was in flight, restored by checks, suspect again: the old probe's
    answer asks for a new probe instead of settling the new suspicion."""
    b = board(W0, W1, successes_to_restore=1)
    b.report_failure(W0, "timeout: a", suspect=True)
    old_probe = trio.current_time()
    b.report_failure(W0, "unreachable: refused", eject_now=True)
    b.record_check(W0, True, "ok", 1.0)
    await trio.sleep(1.0)
    assert b.report_failure(W0, "timeout: b", suspect=True) is True
    assert probes(b) == [W0]  # the first probe's request; it is still in flight
    assert b.settle_suspect(W0, True, "ok", probe_started=old_probe) is False
    assert b.worker(W0).suspect
    assert probes(b) == [W0]  # probed again
    assert b.settle_suspect(W0, False, "timeout", probe_started=trio.current_time()) is True
    assert not b.worker(W0).healthy
