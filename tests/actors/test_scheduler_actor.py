"""Scheduler actor + Program actors + rank actor over the real core, under the autojump clock.

Exact virtual times: a Program paused by its acting TTL at the armed deadline, released by the
paused retention after 1800 s, force-resumed at its deadline; ticks on the metrics grid; stale
observations -> one fallback event -> one recovery event."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from program_fakes import FakeHealth, daemon_config, ok, program_request, program_scheduling

from actors.core.events import RequestAbandoned, RequestSubmitted
from actors.core.ids import RequestId
from actors.messages import Admitted, Submission
from daemon.dispatch import DispatchRejected


def _program(diag: dict, target: str | None = None) -> list[dict]:
    return [p for r in diag["ranks"] if target in (None, r["target_id"]) for p in r["programs"]]


async def test_first_program_request_is_admitted_and_polling_starts_lazily(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cfg = daemon_config(token_capacity_per_dp_rank=10_000)
    async with program_scheduling(cfg) as (dispatcher, registry, workers):
        await trio.sleep(5)
        assert workers.scrapes == []  # no Program request yet: no backend polling
        diag = dispatcher.diagnostics()
        assert [r["target_id"] for r in diag["ranks"]] == ["http://w0:8000@0", "http://w0:8000@1"]
        assert all(r["capacity_accounting_source"] == "router_ledger_missing_observation" for r in diag["ranks"])
        assert diag["backend_polling_started"] is False
        t0 = trio.current_time()
        async with dispatcher.lease(program_request("task-a:lead", tokens=200)) as lease:
            assert lease.target.target_id in ("http://w0:8000@0", "http://w0:8000@1")
            assert lease.wants_usage is True
            lease.finish(ok(prompt=200))
        await trio.testing.wait_all_tasks_blocked()
        assert [t - t0 for t, _ in workers.scrapes] == [0.0]
        await trio.sleep(2.5)
        assert [t - t0 for t, _ in workers.scrapes] == [0.0, 1.0, 2.0]
        diag = dispatcher.diagnostics()
        progs = _program(diag)
        assert len(progs) == 1
        # warm-up: TTL 0 -> paused right after the completion (reason ttl_expired)
        assert (progs[0]["state"], progs[0]["status"], progs[0]["pause_reason"]) == ("paused", "acting", "ttl_expired")
        assert all(r["router_estimated_used_tokens"] == 0 for r in diag["ranks"])
        assert (
            registry.get_sample_value(
                "vllm_router_agent_aware_transitions_total",
                {"target": lease.target.target_id, "reason": "program_admit"},
            )
            == 1.0
        )
        assert (
            registry.get_sample_value(
                "vllm_router_agent_aware_transitions_total", {"target": lease.target.target_id, "reason": "ttl_expired"}
            )
            == 1.0
        )


SINGLE = ("http://w0:8000",)
T0 = "http://w0:8000"  # DP size 1: the URL alone (docs/operations.md §13.10)


async def test_acting_ttl_expires_exactly_at_armed_deadline(autojump_clock: trio.testing.MockClock, event_log) -> None:
    cfg = daemon_config(SINGLE, dp=1, token_capacity_per_dp_rank=10_000)
    async with program_scheduling(cfg) as (dispatcher, registry, _):
        t0 = trio.current_time()
        await trio.sleep(0.25)
        async with dispatcher.lease(program_request("p1", kv_retention_ttl_seconds=4.5)) as lease:
            lease.finish(ok())
        await trio.sleep_until(t0 + 0.25 + 4.5 - 0.001)
        (prog,) = _program(dispatcher.diagnostics())
        assert (prog["state"], prog["status"]) == ("active", "acting")
        assert prog["ttl_remaining_seconds"] == pytest.approx(0.001)
        await trio.sleep_until(t0 + 4.75)
        await trio.testing.wait_all_tasks_blocked()
        (prog,) = _program(dispatcher.diagnostics())
        assert (prog["state"], prog["pause_reason"]) == ("paused", "ttl_expired")
        pauses = event_log.named("program_pause")
        assert [(t - t0, f["reason"]) for t, f in pauses] == [(4.75, "ttl_expired")]
        armed = event_log.named("ttl_armed")
        assert [(t - t0, f["request_ttl_seconds"], f["source"]) for t, f in armed] == [(0.25, 4.5, "request_hint")]
        assert (
            registry.get_sample_value(
                "vllm_router_agent_aware_armed_ttl_seconds_count", {"target": T0, "source": "request_hint"}
            )
            == 1.0
        )


async def test_paused_retention_releases_after_1800_seconds(autojump_clock: trio.testing.MockClock, event_log) -> None:
    cfg = daemon_config(SINGLE, dp=1, metrics_interval_seconds=60.0)  # few ticks: the timer releases it
    async with program_scheduling(cfg) as (dispatcher, registry, _):
        t0 = trio.current_time()
        await trio.sleep(0.5)
        async with dispatcher.lease(program_request("p1")) as lease:
            lease.finish(ok())
        # warm-up TTL is 0: paused at t0+0.5, retention deadline t0+1800.5
        await trio.sleep_until(t0 + 1800.5 - 0.01)
        assert len(_program(dispatcher.diagnostics())) == 1
        await trio.sleep_until(t0 + 1800.5)
        await trio.testing.wait_all_tasks_blocked()
        assert _program(dispatcher.diagnostics()) == []
        releases = [
            (t - t0, f["reason"])
            for t, f in event_log.named("program_transition")
            if f["reason"] == "paused_retention_release"
        ]
        assert releases == [(1800.5, "paused_retention_release")]
        assert (
            registry.get_sample_value(
                "vllm_router_agent_aware_transitions_total", {"target": T0, "reason": "paused_retention_release"}
            )
            == 1.0
        )
        assert dispatcher.diagnostics()["channels"][1]["live_program_actors"] == 0


async def test_force_resume_at_its_deadline_and_disconnect_while_queued_frees_everything(
    autojump_clock: trio.testing.MockClock, event_log
) -> None:
    # capacity 500: A (200 + 100 decode buffer = 300) fits, B (300 more) does not.
    cfg = daemon_config(SINGLE, dp=1, token_capacity_per_dp_rank=500, metrics_interval_seconds=7.0)
    async with program_scheduling(cfg) as (dispatcher, registry, _):
        t0 = trio.current_time()
        admitted: dict[str, float] = {}
        release_a = trio.Event()

        async def run(pid: str, start: float, hold: trio.Event | None) -> None:
            await trio.sleep_until(start)
            async with dispatcher.lease(program_request(pid, tokens=200)) as lease:
                admitted[pid] = trio.current_time() - t0
                if hold is not None:
                    await hold.wait()
                lease.finish(ok(prompt=200))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "A", t0, release_a)
            nursery.start_soon(run, "B", t0 + 0.25, None)
            c_scope = trio.CancelScope()
            nursery.start_soon(_cancellable, c_scope, run, "C", t0 + 0.5)
            await trio.sleep_until(t0 + 10.0)
            diag = dispatcher.diagnostics()
            assert diag["retained_requests"] == 2
            assert diag["ranks"][0]["router_queued_programs"] == 2
            c_scope.cancel()  # C's client disconnects while queued
            await trio.testing.wait_all_tasks_blocked()
            assert dispatcher.diagnostics()["retained_requests"] == 1
            await trio.sleep_until(t0 + 300.25 - 0.001)
            assert "B" not in admitted
            await trio.sleep_until(t0 + 300.25)
            await trio.testing.wait_all_tasks_blocked()
            assert admitted == {"A": 0.0, "B": 300.25}
            release_a.set()
        admits = [(t - t0, f["forced"]) for t, f in event_log.named("program_admit")]
        assert admits == [(0.0, False), (300.25, True)]
        assert (
            registry.get_sample_value(
                "vllm_router_agent_aware_transitions_total", {"target": T0, "reason": "force_resume"}
            )
            == 1.0
        )
        await trio.testing.wait_all_tasks_blocked()
        diag = dispatcher.diagnostics()
        rank = diag["ranks"][0]
        assert diag["retained_requests"] == 0
        assert rank["router_active_programs"] == 0
        assert rank["router_in_flight_requests"] == 0
        assert rank["router_estimated_used_tokens"] == 0
        assert diag["dispatcher"]["abandoned_count"] == 1


async def _cancellable(scope: trio.CancelScope, fn, *args) -> None:
    with scope:
        await fn(*args, None)


async def test_stale_observation_falls_back_once_then_recovers_once(
    autojump_clock: trio.testing.MockClock, event_log
) -> None:
    cfg = daemon_config(SINGLE, dp=1, token_capacity_per_dp_rank=10_000, metrics_interval_seconds=1.0)
    async with program_scheduling(cfg) as (dispatcher, registry, workers):
        t0 = trio.current_time()
        async with dispatcher.lease(program_request("p1")) as lease:
            lease.finish(ok())
        # scrapes at t0+0..3 succeed; the worker fails from t0+3.5 to t0+10.5
        await trio.sleep_until(t0 + 3.5)
        workers.failing.add("http://w0:8000")
        await trio.sleep_until(t0 + 6.0)
        await trio.testing.wait_all_tasks_blocked()
        rank = dispatcher.diagnostics()["ranks"][0]
        assert (rank["observation_age_seconds"], rank["observation_fresh"]) == (3.0, True)
        assert rank["capacity_accounting_source"] == "backend_observation"
        assert rank["last_scrape_error"] == "HTTP 500"
        await trio.sleep_until(t0 + 10.5)
        workers.failing.clear()
        await trio.sleep_until(t0 + 20.0)
        await trio.testing.wait_all_tasks_blocked()
        fallback = [
            (
                t - t0,
                f["previous_capacity_accounting_source"],
                f["capacity_accounting_source"],
                f["observation_age_seconds"],
                f["freshness_threshold_seconds"],
            )
            for t, f in event_log.named("capacity_observation_fallback")
        ]
        assert fallback == [(7.0, "backend_observation", "router_ledger_stale_observation", 4.0, 3.0)]
        recovered = [
            (t - t0, f["previous_capacity_accounting_source"], f["capacity_accounting_source"])
            for t, f in event_log.named("capacity_observation_recovered")
        ]
        assert recovered == [(11.0, "router_ledger_stale_observation", "backend_observation")]
        failures = [t - t0 for t, _ in event_log.named("backend_observation_failed")]
        assert failures == [4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]
        assert registry.get_sample_value("vllm_router_agent_aware_capacity_observation_fresh", {"target": T0}) == 1.0


async def test_without_token_capacity_exactly_one_fallback_per_target(
    autojump_clock: trio.testing.MockClock, event_log
) -> None:
    cfg = daemon_config(("http://w0:8000", "http://w1:8000"), dp=2)
    async with program_scheduling(cfg) as (dispatcher, _, workers):
        t0 = trio.current_time()
        async with dispatcher.lease(program_request("p1")) as lease:
            lease.finish(ok())
        await trio.sleep(29.5)  # between two ticks: the 30th scrape round (t0+29) is the last one seen
        fallback = sorted(
            (t - t0, f["target"], f["capacity_accounting_source"])
            for t, f in event_log.named("capacity_observation_fallback")
        )
        assert fallback == [
            (0.0, f"http://w{w}:8000@{r}", "router_ledger_missing_token_estimate") for w in (0, 1) for r in (0, 1)
        ]
        assert event_log.named("capacity_observation_recovered") == []
        # one scrape per worker URL per interval, shared by both DP ranks
        assert sorted(u for t, u in workers.scrapes if t == t0) == ["http://w0:8000", "http://w1:8000"]
        assert [t - t0 for t, _ in workers.scrapes] == [float(k) for k in range(30) for _ in range(2)]


async def test_forced_resume_goes_through_the_waiting_gate_at_the_exact_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # the waiting gate holds ordinary resumes; a due force-resume deadline goes through it
    # (docs/program-scheduling.md §10, D6 fix), so the request is admitted, not timed out
    cfg = daemon_config(SINGLE, dp=1, queue_timeout_seconds=20.0, force_resume_timeout_seconds=10.0)
    async with program_scheduling(cfg) as (dispatcher, registry, workers):
        t0 = trio.current_time()
        async with dispatcher.lease(program_request("warm")) as lease:
            lease.finish(ok())
        workers.waiting[("http://w0:8000", 0)] = 3
        await trio.sleep_until(t0 + 1.5)
        rank = dispatcher.diagnostics()["ranks"][0]
        assert rank["vllm_waiting_requests"] == 3
        async with dispatcher.lease(program_request("late")) as lease:
            assert trio.current_time() - t0 == 11.5
            lease.finish(ok())
        rank = dispatcher.diagnostics()["ranks"][0]
        assert rank["vllm_waiting_requests"] == 3  # the gate was closed all along
        diag = dispatcher.diagnostics()
        assert diag["retained_requests"] == 0
        assert diag["forced_admissions"] == 1


async def test_an_actor_crash_stops_program_scheduling(autojump_clock: trio.testing.MockClock) -> None:
    cfg = daemon_config(SINGLE, dp=1)
    with pytest.raises(BaseExceptionGroup) as info:
        async with program_scheduling(cfg) as (dispatcher, _, workers):
            async with dispatcher.lease(program_request("p1")) as lease:  # rank poller + Program actor running
                lease.finish(ok())
            await dispatcher.scheduler.inbox.send.send("not a scheduler message")  # type: ignore[arg-type]
            await trio.sleep(3600)
    assert info.group_contains(TypeError, match="unknown event type", depth=None)
    assert trio.current_time() < 3600  # the crash cancelled everything at once


async def test_log_events_of_the_seed_document(autojump_clock: trio.testing.MockClock, event_log) -> None:
    cfg = daemon_config(SINGLE, dp=1, token_capacity_per_dp_rank=10_000)
    async with program_scheduling(cfg) as (dispatcher, registry, workers):
        t0 = trio.current_time()
        async with dispatcher.lease(program_request("p1", tokens=900, kv_retention_ttl_seconds=10)) as lease:
            lease.finish(ok(prompt=1000, cached=0))
        await trio.sleep(1.5)
        async with dispatcher.lease(program_request("p1", tokens=1000, kv_retention_ttl_seconds=10)) as lease:
            lease.finish(ok(prompt=1100, cached=0))  # the KV kept for p1 was not hit: a discontinuity
        await trio.sleep(0.5)
    names = {e for _, e, _ in event_log.events}
    assert {
        "program_admit",
        "request_dispatch",
        "ttl_armed",
        "cache_observation",
        "continuity_sample",
        "capacity_observation",
        "unexpected_cache_discontinuity",
    } <= names
    (disc,) = [f for _, f in event_log.named("unexpected_cache_discontinuity")]
    assert (disc["prompt_tokens"], disc["cached_prompt_tokens"], disc["previous_context_tokens"]) == (1100, 0, 1000)
    assert disc["placement_start_request"] is False
    (sample,) = [(t - t0, f["interval_seconds"]) for t, f in event_log.named("continuity_sample")]
    assert sample == (1.5, 1.5)
    observations = [f for _, f in event_log.named("cache_observation")]
    assert [(o["prompt_tokens"], o["uncached_prompt_tokens"]) for o in observations] == [(1000, 1000), (1100, 1100)]
    assert all(len(o["program"]) == 16 for o in observations)  # redacted ids only, never the raw id
    assert all("p1" not in str(f) for _, _, f in event_log.events)
    assert registry.get_sample_value("vllm_router_agent_aware_request_interval_seconds_count", {"target": T0}) == 1.0


async def test_unhealthy_worker_leaves_program_scheduling_and_programs_fail_over(
    autojump_clock: trio.testing.MockClock, event_log
) -> None:
    cfg = daemon_config(("http://w0:8000", "http://w1:8000"), dp=1)
    health = FakeHealth(cfg.targets())
    async with program_scheduling(cfg, health=health) as (dispatcher, registry, _):
        async with dispatcher.lease(program_request("p")) as lease:
            home = lease.target
            lease.finish(ok())
        health.unhealthy_urls.add(home.worker_url)
        await trio.sleep(1.5)  # the next tick re-syncs the targets
        diag = dispatcher.diagnostics()
        assert [r["target_id"] for r in diag["ranks"]] != [] and home.target_id not in [
            r["target_id"] for r in diag["ranks"]
        ]
        async with dispatcher.lease(program_request("p")) as lease:
            assert lease.target.target_id != home.target_id
            lease.finish(ok())
        health.unhealthy_urls.clear()
        await trio.sleep(1.0)
        assert len(dispatcher.diagnostics()["ranks"]) == 2
        health.unhealthy_urls.update({"http://w0:8000", "http://w1:8000"})
        await trio.sleep(1.0)
        with pytest.raises(DispatchRejected) as info:
            async with dispatcher.lease(program_request("q")):
                raise AssertionError("no target can admit")
        assert (info.value.rejection.status_hint, info.value.rejection.reason) == (503, "no_targets")
    assert event_log.named("stale_capacity_observation_dropped") == []


async def test_capacity_repair_runs_on_the_tick_after_pressure_is_observed(
    autojump_clock: trio.testing.MockClock, event_log
) -> None:
    cfg = daemon_config(SINGLE, dp=1, token_capacity_per_dp_rank=1000)
    async with program_scheduling(cfg) as (dispatcher, registry, workers):
        t0 = trio.current_time()
        async with dispatcher.lease(program_request("a", tokens=500, kv_retention_ttl_seconds=100)) as lease:
            lease.finish(ok(prompt=600))
        await trio.testing.wait_all_tasks_blocked()
        (prog,) = _program(dispatcher.diagnostics())
        assert (prog["state"], prog["status"]) == ("active", "acting")  # holds its KV for 100 s
        await trio.sleep_until(t0 + 2.5)
        workers.kv[("http://w0:8000", 0)] = 1.0  # the backend fills up
        await trio.sleep_until(t0 + 10)
        pauses = [(t - t0, f["reason"]) for t, f in event_log.named("program_pause")]
        assert pauses == [(3.0, "capacity_repair")]  # the scrape and tick at t0+3
        assert (
            registry.get_sample_value(
                "vllm_router_agent_aware_transitions_total", {"target": T0, "reason": "capacity_repair"}
            )
            == 1.0
        )


@pytest.mark.parametrize("settle", [None, trio.testing.wait_all_tasks_blocked], ids=["arrival", "settle"])
@pytest.mark.parametrize("sent_first", ["a", "b"])
async def test_same_instant_submissions_are_handled_in_content_order_with_settle(
    autojump_clock: trio.testing.MockClock, settle, sent_first: str
) -> None:
    """Two Programs arrive at one instant on a rank with room for one.  On a real clock (no
    ``settle``) the first message in the inbox is admitted; with ``settle`` (deterministic virtual
    time) the actor takes the instant's messages together and handles them by content, so the
    same Program is admitted whichever was sent first (docs/architecture.md §7)."""
    cfg = daemon_config(SINGLE, dp=1, token_capacity_per_dp_rank=1_000)
    async with program_scheduling(cfg, settle=settle) as (dispatcher, _, _):
        await trio.sleep(1)
        replies = {}
        for program in (sent_first, "b" if sent_first == "a" else "a"):
            req = program_request(program, tokens=600)
            assert req.identity is not None
            event = RequestSubmitted(RequestId(req.request_id), req.identity.identity, estimated_prompt_tokens=600)
            send, replies[program] = trio.open_memory_channel(1)
            dispatcher.scheduler.inbox.send.send_nowait(Submission(event, send))
        await trio.sleep(0.001)  # (the actor's own idle wait wakes with any other: let the instant pass)
        admitted = []
        for program, recv in replies.items():
            try:
                reply = recv.receive_nowait()
            except trio.WouldBlock:
                continue
            assert isinstance(reply, Admitted)
            admitted.append(program)
        assert admitted == [sent_first if settle is None else "a"]


class _TaskSteps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.tasks: list[str] = []

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.tasks.append(task.name)


async def test_an_idle_scheduler_handles_a_request_in_its_task_and_a_backlog_keeps_the_actor_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """docs/architecture.md §3, "Handled in the sender's task": with the actor waiting on an empty
    inbox, the submission and the completion are stepped in the request's task (no checkpoint
    between the request and its admission); with a message queued before it, the request goes
    through the inbox and is handled after that message."""
    cfg = daemon_config(SINGLE, dp=1, token_capacity_per_dp_rank=10_000)
    async with program_scheduling(cfg) as (dispatcher, _, _):
        scheduler = dispatcher.scheduler
        await trio.testing.wait_all_tasks_blocked()
        steps = scheduler.steps_count
        lease_cm = dispatcher.lease(program_request("p1"))
        stepped = _TaskSteps()
        trio.lowlevel.add_instrument(stepped)
        try:
            lease = await lease_cm.__aenter__()
        finally:
            trio.lowlevel.remove_instrument(stepped)
        assert stepped.tasks == []  # no task ran (not even this one again): the admission never yielded
        assert lease.target.target_id == T0
        assert scheduler.steps_count == steps + 1
        assert scheduler.direct_count == 1
        lease.finish(ok())
        assert scheduler.steps_count == steps + 1  # reported when the lease is left
        await lease_cm.__aexit__(None, None, None)
        assert scheduler.steps_count == steps + 2
        assert scheduler.direct_count == 2
        assert dispatcher.diagnostics()["scheduler"]["handled_in_sender_count"] == 2

        # a backlog: the abandon of an unknown request waits in the inbox, so the next submission
        # must not overtake it
        order: list[str] = []
        original = scheduler.receive

        def spy(item, now):  # type: ignore[no-untyped-def]
            order.append(type(item).__name__)
            original(item, now)

        scheduler.receive = spy  # type: ignore[method-assign]
        scheduler.inbox.send.send_nowait(RequestAbandoned(request_id=RequestId("nobody")))
        async with dispatcher.lease(program_request("p2")) as lease2:
            lease2.finish(ok())
        await trio.testing.wait_all_tasks_blocked()
        assert order[:2] == ["RequestAbandoned", "Submission"]  # the submission did not overtake it


async def test_a_step_that_fails_in_the_request_task_stops_program_scheduling(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A step run by ``handle_now`` that raises is the actor's failure, as when the actor steps:
    the actor raises it and Program scheduling stops at once (the request sees it too)."""
    cfg = daemon_config(SINGLE, dp=1)
    seen: list[BaseException] = []
    with pytest.raises(BaseExceptionGroup) as info:
        async with program_scheduling(cfg) as (dispatcher, _, _):
            await trio.testing.wait_all_tasks_blocked()

            def broken(event, now):  # type: ignore[no-untyped-def]
                raise RuntimeError("broken step")

            dispatcher.scheduler.apply = broken  # type: ignore[method-assign]
            try:
                async with dispatcher.lease(program_request("p1")):
                    pass
            except RuntimeError as exc:
                seen.append(exc)
            await trio.sleep(3600)
    assert [str(e) for e in seen] == ["broken step"]
    assert info.group_contains(RuntimeError, match="broken step", depth=None)
    assert trio.current_time() < 3600


async def test_with_settle_every_message_goes_through_the_actor(autojump_clock: trio.testing.MockClock) -> None:
    """Deterministic virtual time orders same-instant messages in the actor: nothing is handled in
    the sender's task."""
    cfg = daemon_config(SINGLE, dp=1, token_capacity_per_dp_rank=10_000)
    async with program_scheduling(cfg, settle=trio.testing.wait_all_tasks_blocked) as (dispatcher, _, _):
        async with dispatcher.lease(program_request("p1")) as lease:
            lease.finish(ok())
        await trio.testing.wait_all_tasks_blocked()
        assert dispatcher.scheduler.direct_count == 0
        assert dispatcher.counters.completed_count == 1
        assert dispatcher.scheduler.direct is False
