"""Resume passes (docs/architecture.md §9, docs/program-scheduling.md §15): with relay processes,
the Grant of a Program request whose Program stays Active carries a pass; the relay forwards the
Program's next request to the pass's target at once and its Ask says so; the scheduler revokes the
pass when the Program stops being Active there.

Two kinds of test: the relay against a scripted scheduler (the other process faked at the socket,
frame by frame: what the relay does while an answer is held back), and the relay against the real
hub, ProgramDispatcher and actors in one process under virtual time (the module
``test_remote_dispatch`` fixture)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
import trio.testing
from program_fakes import daemon_config, ok, program_request, program_scheduling
from prometheus_client import CollectorRegistry, generate_latest
from test_remote_dispatch import Board, Plane, _connected, _settled

from actors.core import invariants
from actors.core.config import BackendTarget
from actors.core.errors import NO_TARGETS
from actors.core.ids import ProgramKey
from actors.core.model import ACTIVE, PAUSED
from actors.messages import Admitted
from daemon.dataplane.link import Link
from daemon.dataplane.relay import RemoteProgramDispatcher, SnapshotView, read_scheduler_frames, run_load_reports
from daemon.dataplane.scheduler_side import DataPlaneHub
from daemon.dataplane.wire import Ask, Finish, Grant, Refuse, Release, Revoke, Snapshot


def lead() -> Any:
    """A request of the Program ``task:lead``, which acts for 30 s after each completion."""
    return program_request("task:lead", kv_retention_ttl_seconds=30)


T0 = BackendTarget("http://w0:8000", 0, "http://w0:8000@0", 0)
T1 = BackendTarget("http://w0:8000", 1, "http://w0:8000@1", 1)


# ------------------------------------------------------------------ the relay against a scripted scheduler


class Scripted:
    """The scheduler process's end of a relay's socket, driven by the test frame by frame."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.frames: trio.MemoryReceiveChannel[Any]
        self._send, self.frames = trio.open_memory_channel[Any](100)

    async def read(self) -> None:
        async for frame in self.link.frames():
            await self._send.send(frame)

    async def next(self) -> Any:
        return await self.frames.receive()


@asynccontextmanager
async def scripted_relay(*, reports: bool = False) -> AsyncIterator[tuple[RemoteProgramDispatcher, Scripted]]:
    """A relay's Program dispatcher against a scheduler scripted frame by frame (``reports``: the
    relay also sends its Load reports, docs/architecture.md §9)."""
    left, right = trio.socket.socketpair()
    scheduler = Scripted(Link(trio.SocketStream(left)))
    relay_link = Link(trio.SocketStream(right))
    view = SnapshotView((T0, T1))
    remote = RemoteProgramDispatcher(relay_link, view)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(scheduler.read)
        nursery.start_soon(scheduler.link.run_writer)
        nursery.start_soon(relay_link.run_writer)
        nursery.start_soon(read_scheduler_frames, relay_link, remote, view, lambda: "")
        scheduler.link.send(Snapshot(1, (0, 1), "", (0, 0)))
        await view.first.wait()
        if reports:
            nursery.start_soon(run_load_reports, relay_link, lambda: (0, 2), remote)
        try:
            yield remote, scheduler
        finally:
            with trio.CancelScope(shield=True):
                for link in (scheduler.link, relay_link):
                    await trio.aclose_forcefully(link.stream)
            nursery.cancel_scope.cancel()


def _admitted(request_id: str, target: BackendTarget) -> Admitted:
    return Admitted(request_id=request_id, target=target, program="p#1", queue_seconds=0.0)


@asynccontextmanager
async def granted(
    remote: RemoteProgramDispatcher, scheduler: Scripted, req: Any, target: BackendTarget, pass_number: int
) -> AsyncIterator[Any]:
    """``req``'s lease, once the scripted scheduler granted it on ``target`` with ``pass_number``."""
    async with trio.open_nursery() as nursery:

        async def grant() -> None:
            ask = await scheduler.next()
            scheduler.link.send(Grant(ask.lease, _admitted(req.request_id, target), 0, pass_number))

        nursery.start_soon(grant)
        async with remote.lease(req) as lease:
            yield lease


async def test_a_passed_request_is_forwarded_while_the_scheduler_holds_its_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The pass of a Grant sends the Program's next request to its target at once: the scripted
    scheduler answers that request's Ask only after the request has ended (before resume passes the
    relay waited for the Grant forever here).  The late Grant brings the next pass; a Revoke of it
    makes the third request wait for its answer again."""
    async with scripted_relay() as (remote, scheduler):
        first = lead()
        async with trio.open_nursery() as nursery:

            async def grant_first() -> None:
                ask = await scheduler.next()
                assert isinstance(ask, Ask) and (ask.pass_number, ask.pass_target) == (0, "")
                scheduler.link.send(Grant(ask.lease, _admitted(first.request_id, T1), 0, 7))

            nursery.start_soon(grant_first)
            async with remote.lease(first) as lease:
                assert lease.target == T1
                lease.finish(ok())
        finish = await scheduler.next()
        assert isinstance(finish, Finish)
        assert set(remote.passes) == {("default", "task:lead")}

        second = lead()
        async with remote.lease(second) as lease:  # no answer yet: forwarded under pass 7
            assert (lease.target, lease.program, lease.queue_seconds) == (T1, "p#1", 0.0)
            lease.finish(ok())
        assert remote.passes == {}  # one request per pass
        ask = await scheduler.next()
        assert isinstance(ask, Ask)
        assert (ask.kind, ask.request.request_id, ask.pass_number, ask.pass_target) == (
            "program",
            second.request_id,
            7,
            T1.target_id,
        )
        assert await scheduler.next() == Finish(ask.lease, ok())
        assert remote.open_leases() == 1  # kept until its answer arrives (it may bring a pass)
        scheduler.link.send(Grant(ask.lease, _admitted(second.request_id, T1), 0, 8))
        await trio.testing.wait_all_tasks_blocked()
        assert remote.open_leases() == 0 and remote.passes[("default", "task:lead")].number == 8

        scheduler.link.send(Revoke("default", "task:lead", 7))  # an older pass: nothing to drop
        scheduler.link.send(Revoke("default", "task:lead", 8))
        await trio.testing.wait_all_tasks_blocked()
        assert remote.passes == {}
        third = lead()
        entered = trio.Event()

        async def third_request() -> None:
            async with remote.lease(third) as lease:
                entered.set()
                assert lease.target == T0
                lease.finish(ok())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(third_request)
            ask = await scheduler.next()
            assert isinstance(ask, Ask) and ask.pass_number == 0
            await trio.testing.wait_all_tasks_blocked()
            assert not entered.is_set()  # waits for its answer
            scheduler.link.send(Grant(ask.lease, _admitted(third.request_id, T0), 0, 0))
        c = remote.counters
        assert (c.passes_received_count, c.passes_revoked_count, c.passed_count, c.asked_count) == (2, 1, 1, 3)
        assert trio.current_time() == 0.0


async def test_a_passed_request_refused_afterwards_sends_no_release(autojump_clock: trio.testing.MockClock) -> None:
    """The scheduler refuses a passed request when its target left the pool: the core no longer
    has it, so the relay sends neither Finish nor Release for it (the upstream call fails on its
    own); a Grant of another Program never gives a pass to this one."""
    async with scripted_relay() as (remote, scheduler):
        first = program_request("a")
        async with granted(remote, scheduler, first, T0, 3) as lease:
            lease.finish(ok())
        await scheduler.next()  # its Finish
        async with remote.lease(program_request("a")) as lease:
            ask = await scheduler.next()
            assert ask.pass_number == 3
            scheduler.link.send(Refuse(ask.lease, NO_TARGETS))
            await trio.testing.wait_all_tasks_blocked()
        assert remote.counters.passed_refused_count == 1 and remote.open_leases() == 0
        with trio.move_on_after(1):
            extra = await scheduler.next()
            raise AssertionError(f"sent {extra!r} for a refused passed request")
        assert (remote.counters.released_count, remote.counters.finished_count) == (0, 1)  # the first request


async def test_a_passed_request_released_before_its_answer_keeps_no_slot(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A passed request left unfinished (client gone) before its answer: the scheduler abandons it
    and never answers it, so the relay keeps nothing for it (a finished one waits for its Grant)."""
    async with scripted_relay() as (remote, scheduler):
        first = lead()
        async with granted(remote, scheduler, first, T0, 2) as lease:
            lease.finish(ok())
        await scheduler.next()  # its Finish
        await trio.testing.wait_all_tasks_blocked()
        try:
            async with remote.lease(lead()):
                raise KeyError("client gone")
        except KeyError:
            pass
        ask = await scheduler.next()
        assert ask.pass_number == 2
        assert await scheduler.next() == Release(ask.lease)
        assert remote.open_leases() == 0 and remote.counters.released_count == 1


async def test_a_failed_request_drops_its_programs_pass_at_the_relay(autojump_clock: trio.testing.MockClock) -> None:
    """A failed request pauses its Program (``request_failed``): the relay drops the pass itself
    when the request ends, instead of racing the Revoke with the Program's next request."""
    async with scripted_relay() as (remote, scheduler):
        first = lead()
        async with granted(remote, scheduler, first, T0, 5) as lease:
            await trio.testing.wait_all_tasks_blocked()
            assert remote.passes
            lease.finish(attrs.evolve(ok(), success=False))
        assert remote.passes == {}


# ------------------------------------------------------------------ the relay against the real scheduler


@asynccontextmanager
async def plane(cfg: Any) -> AsyncIterator[tuple[Plane, CollectorRegistry]]:
    targets = cfg.targets()
    board = Board(targets)
    async with program_scheduling(cfg, health=board) as (dispatcher, registry, _):
        async with _connected(targets, board, dispatcher) as p:
            yield p, registry


def _program(p: Plane, program_id: str) -> Any:
    assert p.dispatcher is not None
    return p.dispatcher.scheduler.state.programs.get(ProgramKey("default", program_id))


def _consistent(p: Plane) -> None:
    """The ledger, the in-flight counts and the Programs agree (the core's own invariants)."""
    assert p.dispatcher is not None
    handle = p.dispatcher.scheduler
    assert invariants.check(handle.state, handle.cfg) == []
    assert not handle.state.in_flight and len(handle.state.pool) == 0
    assert p.hub.open_leases() == 0


async def test_an_active_programs_next_request_uses_its_pass_and_is_dispatched_there(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The second request of a Program acting within its TTL is forwarded before the scheduler
    stepped its Ask; the core dispatches it on the same target (the decision one process makes)."""
    async with plane(daemon_config(token_capacity_per_dp_rank=10_000, max_acting_ttl_seconds=60.0)) as (p, reg):
        assert p.dispatcher is not None
        scheduler = p.dispatcher.scheduler
        async with p.remote.lease(lead()) as lease:
            target = lease.target
            lease.finish(ok())
        await _settled(p, lambda d: d["dispatcher"]["completed_count"] == 1)
        assert _program(p, "task:lead").state == ACTIVE
        assert set(p.remote.passes) == {("default", "task:lead")}
        steps = scheduler.steps_count
        async with p.remote.lease(lead()) as lease:
            assert scheduler.steps_count == steps  # not answered yet: no step ran
            assert lease.target == target
            await _settled(p, lambda d: d["dispatcher"]["admitted_count"] == 2)
            assert p.dispatcher.scheduler.state.in_flight[lease.request_id].target_id == target.target_id
            lease.finish(ok())
        await _settled(p, lambda d: d["dispatcher"]["completed_count"] == 2)
        await trio.testing.wait_all_tasks_blocked()
        assert p.hub.passes_document() == {
            "outstanding": 1,
            "issued_count": 2,
            "revoked_count": 0,
            "passed_count": 1,
            "crossed_count": 0,
            "races_count": 0,
            "dropped_count": 0,
        }
        assert p.remote.counters.passed_count == 1 and p.remote.open_leases() == 0
        _consistent(p)
        text = generate_latest(reg).decode()
        assert "agentd_data_plane_passed_requests_total 1.0" in text
        assert "agentd_data_plane_pass_races_total 0.0" in text


async def test_a_ttl_pause_revokes_the_pass_and_the_next_request_waits_for_its_grant(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with plane(daemon_config(token_capacity_per_dp_rank=10_000, max_acting_ttl_seconds=60.0)) as (p, _):
        async with p.remote.lease(lead()) as lease:
            lease.finish(ok())
        await _settled(p, lambda d: d["dispatcher"]["completed_count"] == 1)
        assert p.remote.passes
        await trio.sleep(31.0)  # past the acting TTL: paused
        assert _program(p, "task:lead").state == PAUSED
        await trio.testing.wait_all_tasks_blocked()
        assert p.remote.passes == {} and p.remote.counters.passes_revoked_count == 1
        assert p.hub.passes_document()["revoked_count"] == 1 and not p.hub.passes
        async with p.remote.lease(lead()) as lease:
            lease.finish(ok())
        await _settled(p, lambda d: d["dispatcher"]["completed_count"] == 2)
        assert p.remote.counters.passed_count == 0
        assert p.hub.pass_counters.passed_count == 0
        _consistent(p)


async def test_a_program_that_ends_at_completion_gets_no_pass_left(autojump_clock: trio.testing.MockClock) -> None:
    """``expected_resume: false`` ends the Program when its request completes: its Grant carries
    no pass."""
    async with plane(daemon_config(token_capacity_per_dp_rank=10_000)) as (p, _):
        async with p.remote.lease(program_request("sub", expected_resume=False)) as lease:
            lease.finish(ok())
        await _settled(p, lambda d: d["dispatcher"]["completed_count"] == 1)
        await trio.testing.wait_all_tasks_blocked()
        assert _program(p, "sub") is None
        assert p.remote.passes == {} and not p.hub.passes
        assert p.remote.counters.passes_received_count == 0  # none given: it would race its Revoke
        _consistent(p)


async def _held_pass(p: Plane) -> Any:
    """Run one request of ``task:lead`` and return the pass the relay holds afterwards."""
    async with p.remote.lease(lead()) as lease:
        lease.finish(ok())
    await _settled(p, lambda d: d["dispatcher"]["completed_count"] >= 1)
    await trio.testing.wait_all_tasks_blocked()
    return dict(p.remote.passes)


async def test_a_passed_request_crossing_the_revoke_is_admitted_where_it_is(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The race: the scheduler revoked the pass (the TTL expired) while the relay used it.  The
    revoke is made to cross the Ask by giving the relay its pass back after the Revoke frame was
    read (what a Revoke still in the socket looks like to both sides).  The core admits the request
    on the pass's target as it stands; afterwards the ledger, the in-flight counts and the
    Program agree, and the race is counted."""
    async with plane(daemon_config(token_capacity_per_dp_rank=10_000, max_acting_ttl_seconds=60.0)) as (p, reg):
        held = await _held_pass(p)
        [pas] = held.values()
        await trio.sleep(31.0)
        await trio.testing.wait_all_tasks_blocked()
        assert p.remote.passes == {} and _program(p, "task:lead").state == PAUSED
        p.remote.passes.update(held)  # the Revoke is still on its way
        async with p.remote.lease(lead()) as lease:
            assert lease.target == pas.target
            await _settled(p, lambda d: d["dispatcher"]["admitted_count"] == 2)
            prog = _program(p, "task:lead")
            assert (prog.state, prog.placement, prog.in_flight) == (ACTIVE, pas.target.target_id, 1)
            lease.finish(ok())
        doc = await _settled(p, lambda d: d["dispatcher"]["completed_count"] == 2)
        await trio.testing.wait_all_tasks_blocked()
        assert doc["dispatcher"]["rejected_count"] == 0
        counters = p.hub.pass_counters
        assert (counters.passed_count, counters.crossed_count, counters.races_count) == (1, 1, 1)
        assert _program(p, "task:lead").state == ACTIVE  # acting within its new TTL
        _consistent(p)
        text = generate_latest(reg).decode()
        assert "agentd_data_plane_pass_races_total 1.0" in text
        assert 'vllm_router_agent_aware_transitions_total{reason="pass_race_admit"' in text


async def test_a_passed_request_whose_target_is_gone_is_refused_and_leaks_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with plane(daemon_config(token_capacity_per_dp_rank=10_000, max_acting_ttl_seconds=60.0)) as (p, _):
        held = await _held_pass(p)
        [pas] = held.values()
        p.board.unhealthy_urls.add(pas.target.worker_url)  # its only worker: every target is gone
        await trio.sleep(31.0)
        await trio.testing.wait_all_tasks_blocked()
        p.remote.passes.update(held)
        # the relay has not learnt yet that the target is gone (the snapshot saying so crosses the
        # request): since session 31 a relay does not use a pass to a worker out of its rotation
        p.remote.rotation = None
        async with p.remote.lease(lead()) as lease:
            await _settled(p, lambda d: d["dispatcher"]["rejected_count"] == 1)
            await trio.testing.wait_all_tasks_blocked()
            lease.finish(ok())  # the upstream answered anyway: nothing to account
        await trio.testing.wait_all_tasks_blocked()
        assert p.remote.counters.passed_refused_count == 1
        counters = p.hub.pass_counters
        assert (counters.passed_count, counters.crossed_count, counters.races_count) == (1, 1, 1)
        doc = await _settled(p, lambda d: True)
        assert doc["dispatcher"]["completed_count"] == 1  # the first request only
        _consistent(p)


async def test_a_relay_killed_with_a_pass_outstanding_abandons_its_passed_lease(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with plane(daemon_config(token_capacity_per_dp_rank=10_000, max_acting_ttl_seconds=60.0)) as (p, _):
        await _held_pass(p)
        forwarded = trio.Event()

        async def passed_request() -> None:
            async with p.remote.lease(lead()):
                forwarded.set()
                await trio.sleep_forever()

        async with trio.open_nursery() as relay_tasks:
            relay_tasks.start_soon(passed_request)
            await forwarded.wait()
            await _settled(p, lambda d: d["dispatcher"]["admitted_count"] == 2)
            assert p.hub.passes  # the Grant of the passed request gave the next pass
            await p.relay_link.stream.aclose()  # SIGKILL
            doc = await _settled(
                p,
                lambda d: d["dispatcher"]["abandoned_count"] == 1 and d["scheduler"]["pending_replies_count"] == 0,
            )
            relay_tasks.cancel_scope.cancel()
        assert not p.hub.passes and p.conn.abandoned_on_close_count == 1
        assert doc["dispatcher"]["completed_count"] == 1
        _consistent(p)


async def test_a_pass_moves_to_the_relay_that_carried_the_last_request(autojump_clock: trio.testing.MockClock) -> None:
    """Two relays: the Program's request through the second relay gives it the pass and revokes
    the first relay's."""
    cfg = daemon_config(token_capacity_per_dp_rank=10_000, max_acting_ttl_seconds=60.0)
    targets = cfg.targets()
    board = Board(targets)
    async with program_scheduling(cfg, health=board) as (dispatcher, _, _):
        async with _connected(targets, board, dispatcher) as one:
            hub: DataPlaneHub = one.hub
            async with _connected(targets, board, dispatcher, hub=hub, index=1) as two:
                async with one.remote.lease(lead()) as lease:
                    lease.finish(ok())
                await _settled(one, lambda d: d["dispatcher"]["completed_count"] == 1)
                await trio.testing.wait_all_tasks_blocked()
                assert one.remote.passes and not two.remote.passes
                async with two.remote.lease(lead()) as lease:
                    lease.finish(ok())
                await _settled(one, lambda d: d["dispatcher"]["completed_count"] == 2)
                await trio.testing.wait_all_tasks_blocked()
                assert not one.remote.passes and two.remote.passes
                assert hub.pass_counters.revoked_count == 1
                assert one.remote.counters.passes_revoked_count == 1


async def test_one_process_never_passes(autojump_clock: trio.testing.MockClock) -> None:
    """Without a hub nothing listens to the scheduler's Program changes (one process, the simulator)."""
    cfg = daemon_config(token_capacity_per_dp_rank=10_000)
    async with program_scheduling(cfg, health=Board(cfg.targets())) as (dispatcher, _, _):
        assert dispatcher.scheduler.router is not None
        assert dispatcher.scheduler.router.on_program_change is None
