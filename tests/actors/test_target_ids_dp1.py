"""Target ids at DP size 1: the worker URL alone, as the reference router names them
(docs/operations.md §13.10); ``<url>@<rank>`` at DP size > 1, unchanged.

The ids are the ``target`` label of the metrics, the keys of ``/scheduling/diagnostics`` and the
keys of both hash rings (native ``consistent_hash`` and the Program binding), so the rings are
checked against rings built from the plain URLs."""

from __future__ import annotations

import trio
import trio.testing
from program_fakes import daemon_config, ok, program_request, program_scheduling

from actors.core.config import BackendTarget
from actors.core.ids import TargetId
from actors.core.placement import HashRing
from daemon.config import EMBEDDED_WORKER_URL, AgentdConfig, EmbeddedConfig, RoutingConfig
from daemon.routing import ConsistentHash

W = ("http://w0:8000", "http://w1:8000", "http://w2:8000")


def test_dp_size_1_ids_are_the_urls_and_dp_size_2_ids_carry_the_rank() -> None:
    one = AgentdConfig(
        routing=RoutingConfig(worker_urls=(*W, "http://u:secret@w3:8000/"), intra_node_data_parallel_size=1)
    )
    assert [t.target_id for t in one.targets()] == [*W, "http://***@w3:8000"]
    assert [(t.dp_rank, t.shown_dp_rank, t.index) for t in one.targets()] == [(0, None, i) for i in range(4)]
    assert one.targets()[3].worker_url == "http://u:secret@w3:8000"  # still used to connect
    two = AgentdConfig(routing=RoutingConfig(worker_urls=W[:2], intra_node_data_parallel_size=2))
    assert [(t.target_id, t.shown_dp_rank) for t in two.targets()] == [
        ("http://w0:8000@0", 0),
        ("http://w0:8000@1", 1),
        ("http://w1:8000@0", 0),
        ("http://w1:8000@1", 1),
    ]


def test_embedded_workers_with_dp_size_1_are_named_by_their_urls() -> None:
    one = AgentdConfig(embedded=EmbeddedConfig(num_workers=2, dp_size=1))
    assert [t.target_id for t in one.targets()] == [f"{EMBEDDED_WORKER_URL}-0", f"{EMBEDDED_WORKER_URL}-1"]
    assert [t.shown_dp_rank for t in one.targets()] == [None, None]
    two = AgentdConfig(embedded=EmbeddedConfig(num_workers=1, dp_size=2))
    assert [t.target_id for t in two.targets()] == [f"{EMBEDDED_WORKER_URL}@0", f"{EMBEDDED_WORKER_URL}@1"]


def _keys() -> list[str]:
    return [f"session-{i}" for i in range(64)]


def test_native_consistent_hash_ring_is_keyed_on_the_plain_urls() -> None:
    targets = daemon_config(W, dp=1).targets()
    plain = [BackendTarget(u, 0, u, i) for i, u in enumerate(W)]
    suffixed = [BackendTarget(u, 0, f"{u}@0", i) for i, u in enumerate(W)]
    zero = [0] * len(W)

    def placements(ring_targets: list[BackendTarget]) -> list[int]:
        ring = ConsistentHash(ring_targets)
        return [ring.choose(targets, k, zero).index for k in _keys()]

    got = placements(list(targets))
    assert got == placements(plain)
    assert got != placements(suffixed)  # the old ids put some sessions on other workers


async def test_scheduling_diagnostics_metrics_and_program_ring_at_dp_size_1(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cfg = daemon_config(W, dp=1, token_capacity_per_dp_rank=10_000)
    assert cfg.program_scheduling is not None
    nodes = cfg.program_scheduling.hash_virtual_nodes
    programs = [f"prog-{i}" for i in range(12)]
    keys = [f"program:{p}" for p in programs]  # no session: the Program id (docs/program-scheduling.md §10)
    ring = HashRing(tuple(TargetId(u) for u in W), nodes)
    old = HashRing(tuple(TargetId(f"{u}@0") for u in W), nodes)
    assert [ring.owner(k) for k in keys] != [old.owner(k).removesuffix("@0") for k in keys]
    async with program_scheduling(cfg) as (dispatcher, registry, _):
        diag = dispatcher.diagnostics()
        assert [(r["target_id"], r["dp_rank"]) for r in diag["ranks"]] == [(u, None) for u in W]
        board = dispatcher.dashboard()
        assert [(r["target_id"], r["dp_rank"]) for r in board["ranks"]] == [(u, None) for u in W]
        for pid, key in zip(programs, keys, strict=True):
            async with dispatcher.lease(program_request(pid, tokens=100)) as lease:
                assert lease.target.target_id == ring.owner(key)
                lease.finish(ok(prompt=100))
        await trio.testing.wait_all_tasks_blocked()
        for u in W:
            admitted = sum(1 for k in keys if ring.owner(k) == u)
            value = registry.get_sample_value(
                "vllm_router_agent_aware_transitions_total", {"target": u, "reason": "program_admit"}
            )
            assert (value or 0.0) == admitted
        stale = {"target": f"{W[0]}@0", "reason": "program_admit"}
        assert registry.get_sample_value("vllm_router_agent_aware_transitions_total", stale) is None


async def test_scheduling_diagnostics_keep_ranks_at_dp_size_2(autojump_clock: trio.testing.MockClock) -> None:
    cfg = daemon_config(W[:1], dp=2, token_capacity_per_dp_rank=10_000)
    async with program_scheduling(cfg) as (dispatcher, _, _):
        diag = dispatcher.diagnostics()
        assert [(r["target_id"], r["dp_rank"]) for r in diag["ranks"]] == [(f"{W[0]}@0", 0), (f"{W[0]}@1", 1)]
        board = dispatcher.dashboard()
        assert [(r["target_id"], r["dp_rank"]) for r in board["ranks"]] == [(f"{W[0]}@0", 0), (f"{W[0]}@1", 1)]
