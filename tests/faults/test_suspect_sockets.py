"""A connect timeout over real sockets (docs/operations.md §11.3): the worker is suspect, the
request fails over, one confirming ``GET /health`` settles it.

* a worker whose connect times out once and then accepts (a :class:`fault_worker.Gate`: a listener
  whose full accept queue drops SYNs, opened the moment the daemon logs the suspicion) is back in rotation as
  soon as the probe passed - no 503, no wait for ``health_successes_to_restore`` checks (the
  periodic round is an hour away here);
* a permanently blackholed address is ejected when the probe times out;
* the same through two relay processes (``data_plane_processes = 2``, docs/operations.md §13): the
  relay's report reaches the scheduler's board, which probes, and the verdict comes back.

Every wait is on an event or bounded by a generous ``trio.fail_after`` (a loaded 2-core machine);
no bound here is the thing measured.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

import attrs
import httpx
import trio
from fault_env import BUDGET_SECONDS, CHAT, STREAM, agentd_log, fault_config, fault_env
from fault_worker import Blackhole, FaultWorker, Gate
from prometheus_client.parser import text_string_to_metric_families

from daemon.supervisor import run_daemon

# long enough that a loopback connect to a healthy worker never misses it, even on a loaded machine
CONNECT_SECONDS = 5.0
PROBE_SECONDS = 5.0  # health_check_timeout_seconds: bounds the confirming probe


class OnEvent(logging.Handler):
    """Calls ``action(fields)`` for every log event called ``name`` (in the logging task, at once)
    and sets ``seen`` with the trio time of the first."""

    def __init__(self, name: str, action: Callable[[dict[str, Any]], None] = lambda fields: None) -> None:
        super().__init__(logging.DEBUG)
        self.name = name
        self.action = action
        self.seen = trio.Event()
        self.at: float | None = None
        self.fields: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "agentd_event", None) != self.name:
            return
        fields = dict(getattr(record, "agentd_fields", {}))
        self.fields.append(fields)
        if self.at is None:
            self.at = trio.current_time()
        self.action(fields)
        self.seen.set()


class Watching:
    """``OnEvent`` handlers on the ``agentd`` logger for the length of a ``with``."""

    def __init__(self, *handlers: OnEvent) -> None:
        self.handlers = handlers

    def __enter__(self) -> Watching:
        for h in self.handlers:
            logging.getLogger("agentd").addHandler(h)
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.handlers:
            logging.getLogger("agentd").removeHandler(h)


async def test_a_worker_whose_connect_times_out_once_is_back_right_after_the_probe() -> None:
    async with trio.open_nursery() as outer:
        behind = await outer.start(FaultWorker().run)
        gate = Gate(behind.port)
        try:
            gate.open(outer)  # open at start: the start's health check passes
            suspect = OnEvent(
                "health_suspect", lambda fields: gate.open(outer) if fields["worker"] == gate.url else None
            )
            restored = OnEvent("health_suspect_restored")
            with Watching(suspect, restored):
                async with fault_env(
                    1,
                    urls=[gate.url],
                    connect_timeout_seconds=CONNECT_SECONDS,
                    health_check_timeout_seconds=PROBE_SECONDS,
                ) as env:
                    board = env.handles.health
                    assert [t.worker_url for t in board.healthy_targets()] == [env.workers[0].url, gate.url]
                    gate.shut()
                    env.pool.close_idle()  # the next request to the gate must open a connection
                    statuses = []
                    with trio.fail_after(BUDGET_SECONDS):
                        for _ in range(2):  # round robin: the gate's turn comes within two requests
                            statuses.append((await env.chat(STREAM)).status_code)
                            if suspect.seen.is_set():
                                break
                        assert suspect.seen.is_set(), env.log.events("health_change")
                        await restored.seen.wait()
                    assert statuses[-1] == 200  # failed over to the peer: the client saw nothing
                    assert suspect.at is not None and restored.at is not None
                    assert 0 <= restored.at - suspect.at < PROBE_SECONDS  # the probe passed within its timeout
                    [fields] = suspect.fields
                    assert "ConnectTimeout" in fields["detail"] and fields["others_in_rotation"] == 1
                    assert restored.fields[0]["worker"] == gate.url and restored.fields[0]["probe"] == "ok"
                    # back in rotation now, through the probe alone (no health round ran since the start)
                    assert board.rounds_count == 1
                    assert [t.worker_url for t in board.healthy_targets()] == [env.workers[0].url, gate.url]
                    before = len(behind.generation_requests())
                    responses = [await env.chat(CHAT if i % 2 else STREAM) for i in range(4)]
                    assert [r.status_code for r in responses] == [200] * 4  # no 503 at any point
                    assert len(behind.generation_requests()) == before + 2
                    value = env.handles.registry.get_sample_value
                    assert value("agentd_proxy_failovers_total", {"target": gate.url}) == 1.0
                    assert value("agentd_health_suspects_total", {"target": gate.url, "outcome": "restored"}) == 1.0
                    assert value("agentd_health_ejections_total", {"target": gate.url, "source": "outlier"}) in (
                        None,
                        0.0,
                    )
                    assert value("agentd_health_target_healthy", {"target": gate.url}) == 1.0
                    assert env.log.events("health_change", logging.WARNING) == []
                    assert (await env.client.get("/scheduling/diagnostics")).json()["proxy"]["targets"][1][
                        "suspect"
                    ] is False
                    await env.check_clean()
        finally:
            gate.close()
            outer.cancel_scope.cancel()


async def test_a_blackholed_worker_is_ejected_when_the_probe_times_out() -> None:
    with Blackhole() as hole:
        bad = f"http://127.0.0.1:{hole.port}"
        ejected = OnEvent("health_change")
        with Watching(ejected):
            async with fault_env(
                1, urls=[bad], connect_timeout_seconds=CONNECT_SECONDS, health_check_timeout_seconds=PROBE_SECONDS
            ) as env:
                board = env.handles.health
                ejected.seen = trio.Event()  # the start's health_change events do not count
                ejected.fields.clear()
                ejected.at = None
                # the blackhole failed its start's check: make it pass, so that it is in rotation
                for _ in range(env.handles.config.routing.health_successes_to_restore):
                    board.record_check(bad, True, "ok", trio.current_time())
                assert len(board.healthy_targets()) == 2
                statuses = []
                with trio.fail_after(BUDGET_SECONDS):
                    while not board.worker(bad).suspect and board.worker(bad).healthy:
                        statuses.append((await env.chat(STREAM)).status_code)
                    suspect_at = board.worker(bad).suspect_since
                    assert suspect_at is not None
                    await ejected.seen.wait()
                assert statuses == [200] * len(statuses) and len(statuses) <= 2
                assert ejected.at is not None and ejected.at - suspect_at + 0.001 >= PROBE_SECONDS
                [change] = ejected.fields
                assert change["worker"] == bad and change["healthy"] is False and change["source"] == "outlier"
                assert change["reason"].startswith("ejected: connect timeout (timeout: ConnectTimeout")
                assert change["reason"].endswith("then the confirming /health probe failed: timeout")
                responses = [await env.chat(CHAT) for _ in range(4)]
                assert [r.status_code for r in responses] == [200] * 4
                value = env.handles.registry.get_sample_value
                assert value("agentd_health_suspects_total", {"target": bad, "outcome": "ejected"}) == 1.0
                assert value("agentd_health_ejections_total", {"target": bad, "source": "outlier"}) == 1.0
                assert value("agentd_health_target_healthy", {"target": bad}) == 0.0
                await env.check_clean()


async def test_through_relay_processes_the_suspect_is_probed_by_the_scheduler_and_comes_back() -> None:
    with agentd_log() as log:
        async with trio.open_nursery() as outer:
            peer = await outer.start(FaultWorker().run)
            behind = await outer.start(FaultWorker().run)
            gate = Gate(behind.port)
            try:
                gate.open(outer)
                suspect = OnEvent(
                    "health_suspect", lambda fields: gate.open(outer) if fields["worker"] == gate.url else None
                )
                restored = OnEvent("health_suspect_restored")
                with Watching(suspect, restored):
                    cfg = fault_config(
                        [peer.url, gate.url],
                        connect_timeout_seconds=CONNECT_SECONDS,
                        health_check_timeout_seconds=PROBE_SECONDS,
                    )
                    cfg = attrs.evolve(cfg, server=attrs.evolve(cfg.server, data_plane_processes=2))
                    async with trio.open_nursery() as nursery:
                        handles = await nursery.start(partial(run_daemon, cfg))
                        assert handles.data_plane is not None
                        gate.shut()  # the next connection to the gate times out
                        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
                            statuses: list[int] = []
                            with trio.fail_after(BUDGET_SECONDS):
                                # until a relay opens a new connection to the gate (each relay's
                                # round robin alternates; a pooled connection may serve first)
                                for _ in range(20):
                                    response = await client.post("/v1/chat/completions", json=STREAM)
                                    statuses.append(response.status_code)
                                    if suspect.seen.is_set():
                                        break
                                assert suspect.seen.is_set(), log.events("health_change")
                                await restored.seen.wait()
                            assert set(statuses) == {200}  # the relay failed over: no client error
                            # the relays learn it from the next snapshot: the gate's worker serves again
                            before = len(behind.generation_requests())
                            with trio.fail_after(BUDGET_SECONDS):
                                while len(behind.generation_requests()) == before:
                                    response = await client.post("/v1/chat/completions", json=CHAT)
                                    assert response.status_code == 200, response.text
                            metrics = (await client.get("/metrics")).text
                            restored = [
                                sample.value
                                for family in text_string_to_metric_families(metrics)
                                for sample in family.samples
                                if sample.name == "agentd_health_suspects_total"
                                and sample.labels == {"target": gate.url, "outcome": "restored"}
                            ]
                            assert restored == [1.0]
                            assert [e for e in log.events("health_change") if not e["healthy"]] == []
                            assert log.errors() == []
                        handles.request_shutdown()
            finally:
                gate.close()
                outer.cancel_scope.cancel()
