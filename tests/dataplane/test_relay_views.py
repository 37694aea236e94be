"""A relay's own view of its leases and resume passes against the scheduler's (docs/architecture.md
§9 "What a relay reports", docs/operations.md §13.3).

Three kinds of test, all in one process under virtual time:

* the hub against a scripted relay (the relay process faked at the socket, frame by frame): it
  reports counts that differ from the hub's; the hub flags the difference once it has lasted
  ``VIEW_MISMATCH_SECONDS``, not before, logs it once, counts it, and clears it when the reports
  agree again; a report taken while the hub's frames were still on the way is not compared;
* the relay against a scripted scheduler: what its ``Load`` frames say, and the ``Drop`` frames of
  the passes it lets go on its own;
* the relay against the real hub, ProgramDispatcher and actors (``test_remote_dispatch``'s fixture
  with the relay's reports on): after leases that complete, fail, are abandoned, refused or passed,
  both views agree and nothing is flagged."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from fault_env import Records
from program_fakes import daemon_config, ok, program_request, program_scheduling
from prometheus_client import CollectorRegistry, generate_latest
from test_remote_dispatch import Board, Plane, _connected, _settled
from test_resume_passes import T0, T1, Scripted, _admitted, lead, scripted_relay

from actors.core.errors import NO_TARGETS
from daemon.dataplane import relay as relay_module
from daemon.dataplane.link import Link
from daemon.dataplane.relay import (
    LOAD_SECONDS,
    RemoteProgramDispatcher,
)
from daemon.dataplane.scheduler_side import (
    SNAPSHOT_SECONDS,
    VIEW_MISMATCH_SECONDS,
    DataPlaneHub,
    RelayConnection,
    ViewCollector,
)
from daemon.dataplane.wire import (
    Ask,
    Drop,
    Finish,
    Grant,
    Hello,
    Load,
    MetricsAsk,
    Refuse,
    Release,
    Snapshot,
    WireRequest,
)
from daemon.dispatch import DispatchRejected


@pytest.fixture
def log() -> Any:
    records = Records()
    agentd = logging.getLogger("agentd")
    old = agentd.level
    agentd.setLevel(logging.INFO)
    agentd.addHandler(records)
    yield records
    agentd.removeHandler(records)
    agentd.setLevel(old)


# ------------------------------------------------------------------ the hub against a scripted relay


class ScriptedRelay:
    """A relay process's end of the socket, driven by the test: it counts the hub's frames it read."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.read: list[Any] = []

    async def run(self) -> None:
        async for frame in self.link.frames():
            self.read.append(frame)

    def report(self, leases: int, passes: int, oldest: float | None = None, *, frames_read: int | None = None) -> None:
        read = len(self.read) if frames_read is None else frames_read
        self.link.send(Load((0,), leases, passes, oldest, read))


@asynccontextmanager
async def hub_and_scripted_relay(
    dispatcher: Any = None, cfg: Any = None
) -> AsyncIterator[tuple[DataPlaneHub, RelayConnection, ScriptedRelay]]:
    """The hub (with ``dispatcher``, the scheduler's ProgramDispatcher, or none) and one scripted
    relay that has said Hello and read its first Snapshot."""
    cfg = cfg or daemon_config()
    targets = cfg.targets()
    hub = DataPlaneHub(targets, Board(targets), dispatcher)
    left, right = trio.socket.socketpair()
    conn = hub.connect(0, Link(trio.SocketStream(left)))
    relay = ScriptedRelay(Link(trio.SocketStream(right)))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(hub.run_publisher)
        nursery.start_soon(conn.serve)
        nursery.start_soon(relay.link.run_writer)
        nursery.start_soon(relay.run)
        relay.link.send(Hello(0, 77))
        await trio.testing.wait_all_tasks_blocked()
        assert [type(f) for f in relay.read] == [Snapshot]
        try:
            yield hub, conn, relay
        finally:
            with trio.CancelScope(shield=True):
                for link in (conn.link, relay.link):
                    await trio.aclose_forcefully(link.stream)
            nursery.cancel_scope.cancel()


async def _at(t: float) -> None:
    """Sleep until virtual time ``t``, then let every task run."""
    await trio.sleep(t - trio.current_time())
    await trio.testing.wait_all_tasks_blocked()


def _metrics(hub: DataPlaneHub | None) -> str:
    registry = CollectorRegistry()
    registry.register(ViewCollector(hub))
    return generate_latest(registry).decode()


async def test_a_lasting_difference_is_flagged_after_the_bound_logged_once_and_cleared(
    autojump_clock: trio.testing.MockClock, log: Records
) -> None:
    async with hub_and_scripted_relay() as (hub, conn, relay):
        t0 = trio.current_time()
        relay.report(1, 0, 2.0)  # a lease the hub does not know of (the hub holds none)
        await trio.testing.wait_all_tasks_blocked()
        views = conn.views
        assert (views.compared_count, views.mismatch_since, views.suspected) == (1, t0, False)

        await _at(t0 + VIEW_MISMATCH_SECONDS - 0.05)  # re-compared at each of the hub's ticks: not yet
        assert views.compared_count == 1 + 4 and not views.suspected
        assert hub.view_mismatches_count == 0 and log.events("relay_view_mismatch") == []

        await _at(t0 + VIEW_MISMATCH_SECONDS + 0.05)
        assert views.suspected and hub.view_mismatches_count == 1
        [event] = log.events("relay_view_mismatch", logging.WARNING)
        assert {k: event[k] for k in ("relay", "pid", "scheduler_leases", "relay_leases")} == {
            "relay": 0,
            "pid": 77,
            "scheduler_leases": 0,
            "relay_leases": 1,
        }
        assert (event["scheduler_passes"], event["relay_passes"], event["relay_native_in_flight"]) == (0, 0, 0)
        assert event["mismatch_seconds"] == pytest.approx(VIEW_MISMATCH_SECONDS)
        assert event["oldest_lease_seconds"] == pytest.approx(2.0 + VIEW_MISMATCH_SECONDS)
        doc = conn.document()["views"]
        assert doc["scheduler"] == {"leases": 0, "passes": 0}
        assert {k: doc["relay"][k] for k in ("leases", "passes", "native_in_flight")} == {
            "leases": 1,
            "passes": 0,
            "native_in_flight": 0,
        }
        assert doc["relay"]["oldest_lease_seconds"] == pytest.approx(2.0 + VIEW_MISMATCH_SECONDS + 0.05)
        assert (doc["suspected"], doc["suspected_count"]) == (True, 1)
        assert doc["mismatch_seconds"] == pytest.approx(VIEW_MISMATCH_SECONDS + 0.05)
        text = _metrics(hub)
        assert "agentd_data_plane_view_mismatches_total 1.0" in text
        assert 'agentd_data_plane_relay_view_mismatch{relay="0"} 1.0' in text
        assert 'agentd_data_plane_relay_oldest_lease_seconds{relay="0"} 2.55' in text

        await _at(t0 + 3.0)  # logged once, counted once
        assert len(log.events("relay_view_mismatch")) == 1 and hub.view_mismatches_count == 1

        relay.report(0, 0)  # the views agree again
        await trio.testing.wait_all_tasks_blocked()
        assert (views.suspected, views.mismatch_since) == (False, None)
        [cleared] = log.events("relay_view_mismatch_cleared", logging.INFO)
        assert cleared["relay"] == 0 and cleared["mismatch_seconds"] == pytest.approx(3.0)
        text = _metrics(hub)
        assert 'agentd_data_plane_relay_view_mismatch{relay="0"} 0.0' in text
        assert "agentd_data_plane_view_mismatches_total 1.0" in text  # a count of episodes
        assert 'agentd_data_plane_relay_oldest_lease_seconds{relay="0"} 0.0' in text


def test_one_process_exports_no_mismatch_and_no_relay() -> None:
    text = _metrics(None)
    assert "agentd_data_plane_view_mismatches_total 0.0" in text
    assert "# TYPE agentd_data_plane_relay_view_mismatch gauge" in text
    assert "agentd_data_plane_relay_view_mismatch{" not in text
    assert "agentd_data_plane_relay_oldest_lease_seconds{" not in text


async def test_a_difference_shorter_than_the_bound_is_not_flagged(
    autojump_clock: trio.testing.MockClock, log: Records
) -> None:
    async with hub_and_scripted_relay() as (hub, conn, relay):
        t0 = trio.current_time()
        relay.report(0, 2)
        await _at(t0 + VIEW_MISMATCH_SECONDS - 0.15)
        assert conn.views.mismatch_since == t0
        relay.report(0, 0)
        await _at(t0 + 5.0)
        assert conn.views.mismatch_since is None and not conn.views.suspected
        assert hub.view_mismatches_count == 0 and log.events("relay_view_mismatch") == []
        assert conn.views.compared_count > 10  # compared at every tick while nothing moved


async def test_a_report_taken_while_the_hubs_frames_were_on_the_way_is_not_compared(
    autojump_clock: trio.testing.MockClock, log: Records
) -> None:
    """The relay had not read every frame the hub sent when it took its counts: a Grant or Revoke
    in flight explains any difference, so nothing is concluded, however long it stays so."""
    async with hub_and_scripted_relay() as (hub, conn, relay):
        conn.send_quiet(MetricsAsk(9))  # the relay reads it, but reports as if it had not
        await trio.testing.wait_all_tasks_blocked()
        relay.report(3, 1, frames_read=1)
        await _at(trio.current_time() + 5.0)
        assert conn.views.compared_count == 0 and conn.views.mismatch_since is None
        assert hub.view_mismatches_count == 0
        doc = conn.document()["views"]
        assert doc["compared_seconds_ago"] is None and doc["relay"]["leases"] == 3
        relay.report(0, 0)  # now with every frame read: compared, and equal
        await trio.testing.wait_all_tasks_blocked()
        assert conn.views.compared_count == 1 and conn.views.mismatch_since is None


async def test_a_frame_read_after_the_report_that_changes_the_hubs_view_stops_the_comparison(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An Ask read after the relay's last report: the report no longer describes the hub's present
    (the relay's next report will), so the hub's ticks compare nothing until it arrives."""
    cfg = daemon_config(token_capacity_per_dp_rank=10_000)
    async with program_scheduling(cfg, health=Board(cfg.targets())) as (dispatcher, _, _):
        async with hub_and_scripted_relay(dispatcher, cfg) as (hub, conn, relay):
            relay.report(0, 0)
            await trio.testing.wait_all_tasks_blocked()
            assert conn.views.compared_count == 1
            relay.link.send(Ask(1, "program", WireRequest.of(lead(), None)))
            await _at(trio.current_time() + 1.0)
            assert [type(f) for f in relay.read] == [Snapshot, Grant]
            assert conn.scheduler_view() == (1, 1)  # admitted, with a pass
            assert conn.views.compared_count == 1 and conn.views.mismatch_since is None
            relay.report(1, 1)
            await trio.testing.wait_all_tasks_blocked()
            assert conn.views.compared_count == 2 and conn.views.mismatch_since is None
            relay.link.send(Finish(1, ok()))
            relay.report(0, 1)
            await _at(trio.current_time() + 1.0)
            assert conn.views.mismatch_since is None and conn.scheduler_view() == (0, 1)
            assert conn.views.compared_count > 2 and conn.views.differed_count == 0


async def test_a_relay_whose_socket_ended_is_not_compared_while_it_waits_to_be_reaped(
    autojump_clock: trio.testing.MockClock, log: Records
) -> None:
    """A relay process that dies with a lease and a pass open: the hub abandons them at once, but
    the connection stays registered until the process is reaped (docs/operations.md §13), which
    takes seconds on a loaded machine.  The dead relay's last report (one lease, one pass) is not
    a leak; it was flagged as one after 0.5 s (found by F11 under load)."""
    cfg = daemon_config(token_capacity_per_dp_rank=10_000)
    async with program_scheduling(cfg, health=Board(cfg.targets())) as (dispatcher, _, _):
        async with hub_and_scripted_relay(dispatcher, cfg) as (hub, conn, relay):
            relay.link.send(Ask(1, "program", WireRequest.of(lead(), None)))
            await _at(trio.current_time() + 1.0)
            assert conn.scheduler_view() == (1, 1)
            relay.report(1, 1)
            await trio.testing.wait_all_tasks_blocked()
            assert conn.views.compared_count >= 1 and conn.views.differed_count == 0
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(relay.link.stream)  # the relay process is gone
            await _at(trio.current_time() + 5.0)  # not reaped yet: still among the hub's connections
            assert hub.connections == {0: conn}
            assert conn.scheduler_view() == (0, 0)  # abandoned, its pass dropped
            assert not conn.views.suspected and conn.views.differed_count == 0
            assert hub.view_mismatches_count == 0 and log.events("relay_view_mismatch") == []


# ------------------------------------------------------------------ the relay against a scripted scheduler


async def _next_of(scheduler: Scripted, kind: type) -> Any:
    while True:
        frame = await scheduler.next()
        if isinstance(frame, kind):
            return frame


async def test_the_relays_reports_follow_its_leases_and_passes(autojump_clock: trio.testing.MockClock) -> None:
    async with scripted_relay(reports=True) as (remote, scheduler):
        assert await scheduler.next() == Load((0, 2), 0, 0, None, 1)  # at once: the snapshot was read
        first = lead()
        async with trio.open_nursery() as nursery:

            async def answer_later() -> None:
                ask = await _next_of(scheduler, Ask)
                load = await _next_of(scheduler, Load)
                assert (load.leases, load.passes, load.frames_read) == (1, 0, 1)
                assert 0.0 <= load.oldest_lease_seconds <= LOAD_SECONDS  # at the next tick
                await trio.sleep(3.0)
                scheduler.link.send(Grant(ask.lease, _admitted(first.request_id, T1), 0, 4))

            nursery.start_soon(answer_later)
            async with remote.lease(first) as lease:
                load = await _next_of(scheduler, Load)  # the Grant was read: a new report
                assert (load.leases, load.passes, load.frames_read) == (1, 1, 2)
                assert 3.0 <= load.oldest_lease_seconds <= 3.0 + 2 * LOAD_SECONDS  # aged on the relay's clock
                lease.finish(ok())
        assert isinstance(await scheduler.next(), Finish)
        assert await _next_of(scheduler, Load) == Load((0, 2), 0, 1, None, 2)
        await _at(trio.current_time() + 1.0)  # nothing changed: nothing sent
        assert scheduler.frames.statistics().current_buffer_used == 0

        # a refused lease stops counting when the Refuse is read, before its task ends
        async with trio.open_nursery() as nursery:

            async def refused() -> None:
                with pytest.raises(DispatchRejected):
                    async with remote.lease(program_request("other")):
                        raise AssertionError("granted")

            nursery.start_soon(refused)
            ask = await _next_of(scheduler, Ask)
            assert (await _next_of(scheduler, Load)).leases == 1
            scheduler.link.send(Refuse(ask.lease, NO_TARGETS))
        assert await _next_of(scheduler, Load) == Load((0, 2), 0, 1, None, 3)


@asynccontextmanager
async def _granted(
    remote: RemoteProgramDispatcher, scheduler: Scripted, req: Any, target: Any, pass_number: int
) -> AsyncIterator[Any]:
    """``req``'s lease, once the scripted scheduler granted it on ``target`` with ``pass_number``."""
    async with trio.open_nursery() as nursery:

        async def grant() -> None:
            ask = await _next_of(scheduler, Ask)
            scheduler.link.send(Grant(ask.lease, _admitted(req.request_id, target), 0, pass_number))

        nursery.start_soon(grant)
        async with remote.lease(req) as lease:
            yield lease


async def test_a_pass_the_relay_lets_go_on_its_own_is_dropped_with_a_frame(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three ways a relay loses a pass without a Revoke, each followed by a ``Drop`` naming it so
    that the scheduler stops counting it: a Grant that arrives for a lease already released (the
    Release crossed it), a full map of passes, a failed request."""
    monkeypatch.setattr(relay_module, "MAX_PASSES", 1)
    async with scripted_relay(reports=True) as (remote, scheduler):
        # the client leaves before the answer; the Grant (with a pass) crossed the Release
        async with trio.open_nursery() as nursery:

            async def left() -> None:
                async with remote.lease(lead()):
                    raise AssertionError("granted")

            nursery.start_soon(left)
            ask = await _next_of(scheduler, Ask)
            nursery.cancel_scope.cancel()  # the client is gone
        assert await _next_of(scheduler, Release) == Release(ask.lease)
        scheduler.link.send(Grant(ask.lease, _admitted("x", T0), 0, 11))
        assert await _next_of(scheduler, Drop) == Drop(11)
        assert remote.passes == {}

        # a second Program's pass pushes the first one's out of a full map
        async with _granted(remote, scheduler, program_request("a"), T0, 12) as lease:
            lease.finish(ok())
        async with _granted(remote, scheduler, program_request("b"), T1, 13) as lease:
            lease.finish(ok())
        assert await _next_of(scheduler, Drop) == Drop(12)
        assert [p.number for p in remote.passes.values()] == [13]

        # a failed request of Program b drops its pass (the Program pauses; the pass would race)
        async with remote.lease(program_request("b")) as lease:  # forwarded under pass 13
            passed = await _next_of(scheduler, Ask)
            assert passed.pass_number == 13
            scheduler.link.send(Grant(passed.lease, _admitted("y", T1), 0, 14))
            await trio.testing.wait_all_tasks_blocked()
            assert remote.passes[("default", "b")].number == 14
            lease.finish(attrs.evolve(ok(), success=False))
        assert await _next_of(scheduler, Drop) == Drop(14)
        assert remote.passes == {} and remote.counters.passes_dropped_count == 3


# ------------------------------------------------------------------ the relay against the real scheduler


@asynccontextmanager
async def reporting_plane(cfg: Any) -> AsyncIterator[tuple[Plane, CollectorRegistry]]:
    targets = cfg.targets()
    board = Board(targets)
    async with program_scheduling(cfg, health=board) as (dispatcher, registry, _):
        async with _connected(targets, board, dispatcher, reports=True) as p:
            registry.register(ViewCollector(p.hub))
            yield p, registry


async def _agreed(p: Plane) -> dict[str, Any]:
    """The views once a comparison made after this instant found them equal."""
    views = p.conn.views
    start = trio.current_time()
    with trio.fail_after(60):
        while True:
            await trio.testing.wait_all_tasks_blocked()
            if views.compared_at is not None and views.compared_at > start and views.mismatch_since is None:
                return p.conn.document()["views"]
            await trio.sleep(SNAPSHOT_SECONDS / 2)


async def test_after_every_kind_of_lease_both_views_agree(autojump_clock: trio.testing.MockClock) -> None:
    cfg = daemon_config(token_capacity_per_dp_rank=10_000, max_acting_ttl_seconds=60.0)
    async with reporting_plane(cfg) as (p, registry):
        async with p.remote.lease(lead()) as lease:  # completed: its Grant gives a pass
            lease.finish(ok())
        await _settled(p, lambda d: d["dispatcher"]["completed_count"] == 1)
        doc = await _agreed(p)
        assert doc["scheduler"] == {"leases": 0, "passes": 1} and doc["relay"]["passes"] == 1

        # a lease held open: both count it; the relay's oldest lease ages
        entered = trio.Event()

        async def held_open() -> None:
            async with p.remote.lease(program_request("slow")):
                entered.set()
                await trio.sleep(10.0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(held_open)
            await entered.wait()
            opened = trio.current_time()
            doc = await _agreed(p)
            assert doc["scheduler"]["leases"] == doc["relay"]["leases"] == 1
            await trio.sleep(5.0)
            doc = p.conn.document()["views"]
            assert doc["relay"]["oldest_lease_seconds"] == pytest.approx(trio.current_time() - opened)
        # left without finish: abandoned
        await _settled(p, lambda d: d["dispatcher"]["abandoned_count"] == 1)
        doc = await _agreed(p)
        assert doc["scheduler"]["leases"] == 0 and doc["relay"]["oldest_lease_seconds"] is None

        # passed requests of lead, one of them failing while another of its requests runs: the
        # Program stays Active (not idle), so only the relay's Drop makes the hub forget the pass
        second_cm = p.remote.lease(lead())
        second = await second_cm.__aenter__()  # under the pass of the first request
        await _settled(p, lambda d: d["dispatcher"]["admitted_count"] == 3)
        await trio.testing.wait_all_tasks_blocked()
        third_cm = p.remote.lease(lead())
        third = await third_cm.__aenter__()  # under the pass the second one's Grant gave
        await _settled(p, lambda d: d["dispatcher"]["admitted_count"] == 4)
        await trio.testing.wait_all_tasks_blocked()
        assert p.remote.counters.passed_count == 2 and p.remote.passes  # the third one's Grant: the next pass
        second.finish(attrs.evolve(ok(), success=False))
        await second_cm.__aexit__(None, None, None)
        await trio.testing.wait_all_tasks_blocked()
        assert p.remote.passes == {} and p.hub.passes == {}
        assert p.hub.passes_dropped_count == 1
        doc = await _agreed(p)
        assert doc["scheduler"] == {"leases": 1, "passes": 0} == {k: doc["relay"][k] for k in ("leases", "passes")}
        third.finish(ok())
        await third_cm.__aexit__(None, None, None)
        await _settled(p, lambda d: d["dispatcher"]["completed_count"] == 3)
        doc = await _agreed(p)
        assert doc["scheduler"]["leases"] == 0 and doc["relay"]["leases"] == 0
        assert doc["scheduler"]["passes"] == doc["relay"]["passes"]

        # refused: the pool's only worker is gone
        p.board.unhealthy_urls.add(cfg.targets()[0].worker_url)
        await trio.sleep(61.0)  # lead pauses: its pass is revoked
        with pytest.raises(DispatchRejected):
            async with p.remote.lease(program_request("refused")):
                raise AssertionError("granted")
        doc = await _agreed(p)
        assert doc["scheduler"] == {"leases": 0, "passes": 0} and doc["relay"]["passes"] == 0
        assert (doc["suspected_count"], doc["differed_count"], p.hub.view_mismatches_count) == (0, 0, 0)
        assert doc["comparisons_count"] > 10
        assert "agentd_data_plane_view_mismatches_total 0.0" in generate_latest(registry).decode()


async def test_a_relay_that_keeps_a_pass_after_its_revoke_is_flagged(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch, log: Records
) -> None:
    """The leak the comparison is for, made on purpose: a relay whose Revoke handling is broken
    keeps the pass of a Program that paused.  Each side's count looks plausible alone; together
    they differ, and the hub flags it."""
    cfg = daemon_config(token_capacity_per_dp_rank=10_000, max_acting_ttl_seconds=60.0)
    async with reporting_plane(cfg) as (p, registry):
        monkeypatch.setattr(p.remote, "on_revoke", lambda frame: None)
        async with p.remote.lease(lead()) as lease:
            lease.finish(ok())
        await _settled(p, lambda d: d["dispatcher"]["completed_count"] == 1)
        await _agreed(p)
        await trio.sleep(31.0)  # past the acting TTL: paused, the pass revoked (and kept)
        await trio.testing.wait_all_tasks_blocked()
        assert p.hub.pass_counters.revoked_count == 1 and len(p.remote.passes) == 1
        doc = p.conn.document()["views"]
        assert doc["scheduler"]["passes"] == 0 and doc["relay"]["passes"] == 1
        assert doc["suspected"] and p.hub.view_mismatches_count == 1
        [event] = log.events("relay_view_mismatch")
        assert (event["scheduler_passes"], event["relay_passes"]) == (0, 1)
        assert "agentd_data_plane_view_mismatches_total 1.0" in generate_latest(registry).decode()


async def test_a_relay_that_forgets_a_lease_without_releasing_it_is_flagged(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch, log: Records
) -> None:
    """The other direction: a relay that drops a lease it was relaying without sending its
    Release (the scheduler keeps its capacity): the hub counts one lease more than the relay."""
    cfg = daemon_config(token_capacity_per_dp_rank=10_000)
    async with reporting_plane(cfg) as (p, _):
        pending = p.remote._pending
        monkeypatch.setattr(p.remote, "_end", lambda number, lease, refused: pending.pop(number))  # no Release
        async with p.remote.lease(program_request("p")):
            await _agreed(p)
        await trio.sleep(1.0)
        doc = p.conn.document()["views"]
        assert (doc["scheduler"]["leases"], doc["relay"]["leases"]) == (1, 0)
        assert doc["suspected"] and doc["suspected_count"] == 1
        [event] = log.events("relay_view_mismatch")
        assert (event["scheduler_leases"], event["relay_leases"]) == (1, 0)
