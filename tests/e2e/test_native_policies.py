"""Native policies and health transitions through the daemon's no-HTTP entry point.

The daemon runs with ``serve_http=False`` (as ``agentd simulate`` does): requests enter through
``handles.handle`` and reach the fake worker through the daemon's own httpx client, so the
whole dispatch/forward/health path runs, under ``autojump_clock`` where time matters.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from functools import partial

import pytest
import trio
import trio.testing
from native_fakes import FakeWorker, make_config

from daemon.handles import DaemonHandles
from daemon.supervisor import run_daemon


async def start(nursery: trio.Nursery, worker: FakeWorker, seed: int = 11, **cfg_kwargs: object) -> DaemonHandles:
    cfg = make_config(worker.worker_urls, **cfg_kwargs)  # type: ignore[arg-type]
    return await nursery.start(
        partial(run_daemon, cfg, transport_factory=worker.transport, serve_http=False, rng=random.Random(seed))
    )


def chat(system: str = "you are helpful", user: str = "hi") -> bytes:
    return json.dumps(
        {"model": "fake-model", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    ).encode()


async def send(handles: DaemonHandles, raw: bytes, headers: dict[str, str] | None = None) -> tuple[int, str]:
    req = handles.build_request("chat", raw, headers or {})
    sink = await handles.handle_collect(req)
    assert sink.status is not None
    return sink.status, dict(sink.headers).get("content-type", "")


def targets_hit(worker: FakeWorker) -> list[str]:
    """The target id a request went to: ``URL@rank``, or the URL alone for a worker with one DP
    target, which gets no rank header (docs/operations.md §13.10)."""
    return [
        r.base_url if (rank := r.headers.get("x-data-parallel-rank")) is None else f"{r.base_url}@{rank}"
        for r in worker.generation_requests()
    ]


async def test_native_round_robin_cycles_targets_in_order(fake_worker: FakeWorker) -> None:
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker, dp=2, policy="round_robin")
        for _ in range(8):
            assert (await send(handles, chat()))[0] == 200
        handles.request_shutdown()
    order = [t.target_id for t in handles.targets]
    assert targets_hit(fake_worker) == order + order


async def test_native_random_uses_injected_seed(fake_worker: FakeWorker) -> None:
    runs = []
    for _ in range(2):
        worker = FakeWorker(fake_worker.worker_urls)
        async with trio.open_nursery() as nursery:
            handles = await start(nursery, worker, seed=5, dp=2, policy="random")
            for _ in range(40):
                await send(handles, chat())
            handles.request_shutdown()
        runs.append(targets_hit(worker))
    assert runs[0] == runs[1]  # same seed, same choices
    assert set(runs[0]) == {t.target_id for t in handles.targets}  # every target gets traffic


async def test_native_power_of_two_prefers_fewer_in_flight(fake_worker: FakeWorker) -> None:
    fake_worker.hold_streams = True
    stream = json.dumps(
        {"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "stream": True}
    ).encode()
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker, policy="power_of_two")  # two targets
        async with trio.open_nursery() as requests:
            for _ in range(6):
                requests.start_soon(send, handles, stream)
                await trio.testing.wait_all_tasks_blocked()
            native = handles.native_dispatcher
            # with two targets both are always sampled: load alternates and stays balanced
            assert [native.in_flight(t) for t in handles.targets] == [3, 3]
            fake_worker.release.set()
        handles.request_shutdown()


async def test_native_consistent_hash_keys(fake_worker: FakeWorker) -> None:
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker, dp=2, policy="consistent_hash")
        for i in range(6):  # same session header -> same target whatever the body
            await send(handles, chat(user=f"q{i}"), {"x-session-id": "sess-A"})
        assert len(set(targets_hit(fake_worker))) == 1
        fake_worker.requests.clear()
        for i in range(6):  # claude code session header is a key too
            await send(handles, chat(user=f"q{i}"), {"x-claude-code-session-id": "cc-1"})
        assert len(set(targets_hit(fake_worker))) == 1
        fake_worker.requests.clear()
        for i in range(40):  # no session: system prompt + first user message; never one constant key
            await send(handles, chat(system=f"agent {i}", user="same question"))
        spread = Counter(targets_hit(fake_worker))
        assert len(spread) == 4
        fake_worker.requests.clear()
        for _ in range(3):  # identical conversation start -> identical target
            await send(handles, chat(system="fixed", user="fixed"))
        assert len(set(targets_hit(fake_worker))) == 1
        handles.request_shutdown()


async def test_native_health_transitions_leave_and_rejoin_rotation(
    fake_worker: FakeWorker, autojump_clock: trio.testing.MockClock
) -> None:
    async with trio.open_nursery() as nursery:
        handles = await start(
            nursery,
            fake_worker,
            policy="round_robin",
            health_interval_seconds=5.0,
            health_failures_to_eject=1,
            health_successes_to_restore=1,
        )
        t0 = trio.current_time()
        assert len(handles.health.healthy_targets()) == 2
        fake_worker.healthy["http://w0:8000"] = False
        await trio.sleep(4.9)
        assert len(handles.health.healthy_targets()) == 2  # not re-checked yet
        await trio.sleep(0.2)  # the check at t0 + 5 sees it failing
        assert [t.target_id for t in handles.health.healthy_targets()] == ["http://w1:8000"]
        assert handles.registry.get_sample_value("agentd_health_target_healthy", {"target": "http://w0:8000"}) == 0.0
        fake_worker.requests.clear()
        for _ in range(4):
            await send(handles, chat())
        assert targets_hit(fake_worker) == ["http://w1:8000"] * 4
        fake_worker.healthy["http://w1:8000"] = False
        await trio.sleep_until(t0 + 10.0 + 0.1)
        status, _ = await send(handles, chat())
        assert status == 503
        fake_worker.healthy["http://w0:8000"] = True
        await trio.sleep_until(t0 + 15.0 + 0.1)
        assert [t.target_id for t in handles.health.healthy_targets()] == ["http://w0:8000"]
        fake_worker.requests.clear()
        await send(handles, chat())
        assert targets_hit(fake_worker) == ["http://w0:8000"]
        # one /health per worker per round, at t0, t0+5, t0+10, t0+15
        assert Counter(fake_worker.health_checks) == {"http://w0:8000": 4, "http://w1:8000": 4}
        handles.request_shutdown()


@pytest.mark.parametrize("policy", ["round_robin", "random", "power_of_two", "consistent_hash"])
async def test_native_every_policy_skips_unhealthy_target(fake_worker: FakeWorker, policy: str) -> None:
    fake_worker.healthy["http://w1:8000"] = False
    async with trio.open_nursery() as nursery:
        handles = await start(nursery, fake_worker, dp=2, policy=policy)
        for i in range(12):
            await send(handles, chat(system=f"s{i}"))
        assert {t.split("@")[0] for t in targets_hit(fake_worker)} == {"http://w0:8000"}
        handles.request_shutdown()
