"""Every worker in rotation is suspect and a Program's worker times out on connect
(docs/operations.md §11.3, docs/program-scheduling.md §9.1): the Program request's failover goes
to the other worker and succeeds, in one process and through two relay processes.

Two :class:`~fault_worker.FaultWorker` processes behind :class:`~fault_worker.Gate` addresses.
A Program's first request runs on one of them (its *home*); then the home's gate shuts (a full
accept queue: connecting times out) and both workers are made suspect on the health board, with
their confirming probes held (the home's cannot connect, the other's ``/health`` answer is held),
so the suspicion outlasts the case: the suspects are routed to, and the scheduling core keeps
both as targets.  The Program's next request is placed on its home, times out on connect and
fails over: before session 32 the failover went to the home again (a second connect timeout, a
504 ``upstream_timeout`` for the client); now it avoids the worker it could not reach.

Real sockets, real connect timeouts: every wait is bounded by a generous ``trio.fail_after`` (a
loaded 2-core machine); no bound here is the thing measured.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import attrs
import httpx
import trio
from fault_env import BUDGET_SECONDS, STREAM, agentd_log, await_diagnostics, fault_config, fault_env
from fault_worker import FaultWorker, Gate
from prometheus_client.parser import text_string_to_metric_families

from daemon.health import HealthBoard
from daemon.supervisor import run_daemon

# long enough that a loopback connect to a healthy worker never misses it, even on a loaded machine
CONNECT_SECONDS = 5.0
# the confirming probes' bound: the home's probe cannot connect and would eject it after this long;
# the case is over well before (its only slow step is one connect timeout)
PROBE_SECONDS = 120.0
PROGRAM = {**STREAM, "vllm_xargs": {"agentic_context": {"program_id": "agent-1", "kv_retention_ttl_seconds": 60}}}


@attrs.define
class Pair:
    """Two workers behind gates; ``home`` is the one a Program ran on (set by ``settle_home``)."""

    workers: list[FaultWorker]
    gates: list[Gate]
    home: int = -1

    @property
    def urls(self) -> list[str]:
        return [g.url for g in self.gates]

    def settle_home(self) -> None:
        [self.home] = [i for i, w in enumerate(self.workers) if w.generation_requests()]

    @property
    def peer(self) -> int:
        return 1 - self.home


@asynccontextmanager
async def gated_pair() -> AsyncIterator[tuple[Pair, trio.Nursery]]:
    async with trio.open_nursery() as outer:
        workers = [await outer.start(FaultWorker().run) for _ in range(2)]
        gates = [Gate(w.port) for w in workers]
        try:
            for g in gates:
                g.open(outer)
            yield Pair(workers, gates), outer
        finally:
            for w in workers:
                if w.health_hold is not None:
                    w.health_hold.set()
            for g in gates:
                g.close()
            outer.cancel_scope.cancel()


def all_suspect(board: HealthBoard, pair: Pair) -> None:
    """Shut the home's gate and make both workers suspect, their probes held past the case."""
    pair.gates[pair.home].shut()
    pair.workers[pair.peer].health_hold = trio.Event()
    for url in pair.urls:
        assert board.report_failure(url, "ConnectTimeout (the test's)", suspect=True)
    assert all(board.worker(url).suspect for url in pair.urls)
    assert sorted(t.worker_url for t in board.healthy_targets()) == sorted(pair.urls)  # routed to: no 503


def programs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The Programs of a diagnostics document (listed under their rank)."""
    return [p for rank in doc["ranks"] for p in rank["programs"]]


def counter(metrics_text: str, name: str, labels: dict[str, str]) -> float:
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


async def test_a_program_failover_among_suspects_goes_to_the_other_worker() -> None:
    async with gated_pair() as (pair, outer):
        async with fault_env(
            0,
            urls=pair.urls,
            program=True,
            forwarders=pair.gates,  # the /metrics polling's idle connections go through them
            connect_timeout_seconds=CONNECT_SECONDS,
            health_check_timeout_seconds=PROBE_SECONDS,
        ) as env:
            with trio.fail_after(BUDGET_SECONDS):
                first = await env.chat(PROGRAM)
                assert first.status_code == 200, first.text
                pair.settle_home()
                home, peer = pair.urls[pair.home], pair.urls[pair.peer]
                board = env.handles.health
                all_suspect(board, pair)
                env.pool.close_idle()  # the next request to the home must open a connection
                served = len(pair.workers[pair.peer].generation_requests())
                second = await env.chat(PROGRAM)
            assert second.status_code == 200, second.text  # before: 504 upstream_timeout
            assert second.content.endswith(b"data: [DONE]\n\n")
            assert len(pair.workers[pair.peer].generation_requests()) == served + 1
            assert len(pair.workers[pair.home].generation_requests()) == 1  # only the first request
            assert board.worker(home).suspect and board.worker(peer).suspect  # the corner, throughout
            [failover] = env.log.events("upstream_failover")
            assert failover["target"] == home and failover["attempt"] == 1
            value = env.handles.registry.get_sample_value
            assert value("agentd_proxy_failovers_total", {"target": home}) == 1.0
            assert value("agentd_proxy_failovers_total", {"target": peer}) in (None, 0.0)
            # the Program moved with its request: its next one goes to the peer directly
            [program] = programs((await env.client.get("/scheduling/diagnostics")).json())
            assert program["last_target"] == peer, program
            third = await env.chat(PROGRAM)
            assert third.status_code == 200 and len(pair.workers[pair.peer].generation_requests()) == served + 2
            # settle the suspicions: the peer's probe answers, the home's gate opens
            restored = _Restored(2)
            logging.getLogger("agentd").addHandler(restored)
            try:
                assert pair.workers[pair.peer].health_hold is not None
                pair.workers[pair.peer].health_hold.set()
                pair.gates[pair.home].open(outer)
                with trio.fail_after(BUDGET_SECONDS):
                    await restored.all_seen.wait()
            finally:
                logging.getLogger("agentd").removeHandler(restored)
            assert sorted(restored.workers) == sorted(pair.urls)
            assert not board.worker(home).suspect and not board.worker(peer).suspect
            await env.check_clean()


class _Restored(logging.Handler):
    """Collects the workers of ``health_suspect_restored`` events; ``all_seen`` once ``count`` came."""

    def __init__(self, count: int) -> None:
        super().__init__(logging.INFO)
        self.count = count
        self.workers: list[str] = []
        self.all_seen = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "agentd_event", None) == "health_suspect_restored":
            self.workers.append(dict(getattr(record, "agentd_fields", {}))["worker"])
            if len(self.workers) >= self.count:
                self.all_seen.set()


async def test_through_relay_processes_a_program_failover_among_suspects_goes_to_the_other_worker() -> None:
    with agentd_log() as log:
        async with gated_pair() as (pair, _):
            cfg = fault_config(
                pair.urls,
                program=True,
                connect_timeout_seconds=CONNECT_SECONDS,
                health_check_timeout_seconds=PROBE_SECONDS,
            )
            cfg = attrs.evolve(cfg, server=attrs.evolve(cfg.server, data_plane_processes=2))
            async with trio.open_nursery() as nursery:
                handles = await nursery.start(partial(run_daemon, cfg))
                assert handles.data_plane is not None
                async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
                    with trio.fail_after(BUDGET_SECONDS):
                        first = await client.post("/v1/chat/completions", json=PROGRAM)
                        assert first.status_code == 200, first.text
                        pair.settle_home()
                        home, peer = pair.urls[pair.home], pair.urls[pair.peer]
                        board = handles.health
                        all_suspect(board, pair)
                        served = len(pair.workers[pair.peer].generation_requests())
                        second = await client.post("/v1/chat/completions", json=PROGRAM)
                        assert second.status_code == 200, second.text  # before: 504 upstream_timeout
                        assert second.content.endswith(b"data: [DONE]\n\n")
                        assert len(pair.workers[pair.peer].generation_requests()) == served + 1
                        assert len(pair.workers[pair.home].generation_requests()) == 1
                        assert board.worker(home).suspect and board.worker(peer).suspect
                        metrics = (await client.get("/metrics")).text
                        assert counter(metrics, "agentd_proxy_failovers_total", {"target": home}) == 1.0
                        assert counter(metrics, "agentd_proxy_failovers_total", {"target": peer}) == 0.0
                        doc = await await_diagnostics(client, lambda d: d["invariants"]["program_open_leases"] == 0)
                        [program] = programs(doc)
                        assert program["last_target"] == peer, program
                    assert log.errors() == []
                    hold = pair.workers[pair.peer].health_hold
                    assert hold is not None
                    hold.set()  # the peer's probe answers before the daemon stops
                handles.request_shutdown()
