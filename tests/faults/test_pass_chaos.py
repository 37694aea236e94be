"""F11: resume passes under chaos, over real sockets (docs/operations.md §11.6, docs/architecture.md
§9 "Resume passes").

A daemon with two real relay processes (``data_plane_processes = 2``) and Program scheduling in
front of two :class:`FaultWorker` processes' worth of fake workers.  Programs send requests back to
back on their own keep-alive connection (so the relay that carried a Program's last request holds
its pass and forwards the next one at once), with a mix of:

* requests that complete (streamed and JSON);
* clients that drop mid-stream (the connection closed after the first bytes of the answer) and
  mid-upload (a raw connection closed, or reset, part way through the body);
* acting TTLs of 5-60 ms for most Programs, with gaps of the same order between their requests,
  so a Program often pauses (its pass revoked) while its next request is on its way: the passed
  ``Ask`` crosses the ``Revoke`` (the race of docs/program-scheduling.md §15);
* one relay process SIGKILLed part way (the supervisor starts a new one; its clients lose their
  connections and its leases are abandoned by the scheduler).

At rest: every lease released (the ``data_plane`` diagnostics and the Program dispatcher's counters
balance), the core's structural invariants and the capacity counters at rest, passes outstanding
only for Programs still Active on the pass's target under the same placement, no ERROR line from
any process, this process's file descriptors back to the baseline, and the daemon still serves.

Nothing asserts a duration: waits are bounded by generous budgets (a loaded 2-core machine)."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
from typing import Any

import attrs
import httpx
import pytest
import trio
from fault_env import (
    BUDGET_SECONDS,
    STREAM,
    Records,
    _sockets,
    await_diagnostics,
    diagnostics,
    fault_config,
    fd_table,
    open_fds,
    relay_views_agree,
    wait_until,
)
from fault_worker import Act, FaultWorker, abort
from prometheus_client.parser import text_string_to_metric_families

from actors.core import invariants
from actors.core.model import ACTIVE
from daemon.invariants import capacity_invariants
from daemon.supervisor import run_daemon

PROGRAMS = 10
ROUNDS = 14  # requests per Program (some dropped)
LONG_TTL_PROGRAMS = 2  # acting TTL 60 s: Active at rest, so they may keep a pass
PROCESS_START_BUDGET_SECONDS = 180.0
# tokens per rank: Programs wait for room now and then (capacity repair and admissions move them,
# more passes revoked); at 150 the two long-TTL Programs can hold both ranks for their whole 60 s
CAPACITY = 600  # a relay boots in ~1.5 s of CPU; much longer on a loaded machine


def _body(program_id: str, ttl: float, *, stream: bool) -> dict[str, Any]:
    return {
        **STREAM,
        "stream": stream,
        "messages": [{"role": "user", "content": "y" * 120}],
        "vllm_xargs": {"agentic_context": {"program_id": program_id, "kv_retention_ttl_seconds": ttl}},
    }


async def _drop_upload(url: str, body: dict[str, Any], fraction: float, reset: bool) -> None:
    """A raw connection that sends the head and part of the body, then goes (FIN or RST)."""
    host, port = url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    raw = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(raw)}\r\n\r\n"
    ).encode()
    try:
        await stream.send_all(head + raw[: int(len(raw) * fraction)])
    except (trio.BrokenResourceError, OSError):
        pass
    if reset:
        abort(stream)
    else:
        await stream.aclose()


@attrs.define
class Tally:
    completed: int = 0
    dropped_stream: int = 0
    dropped_upload: int = 0
    cut_by_kill: int = 0  # the relay holding the client's connection was killed under it
    statuses: dict[int, int] = attrs.field(factory=dict)


def _passes_only_for_active(doc: dict[str, Any], handles: Any) -> list[str]:
    """Passes the hub still holds whose Program is not Active on the pass's target (should be none)."""
    hub = handles.data_plane.hub
    state = handles.program_dispatcher.scheduler.state
    wrong = []
    for key, pas in hub.passes.items():
        p = state.programs.get(key)
        if p is None or p.ref != pas.ref or p.state != ACTIVE or p.placement != pas.target_id:
            wrong.append(f"{key}: {None if p is None else (p.state, p.placement)} vs pass on {pas.target_id}")
    assert doc["data_plane"]["passes"]["outstanding"] == len(hub.passes)
    return wrong


async def test_f11_resume_passes_with_drops_ttl_races_and_a_killed_relay(capfd: pytest.CaptureFixture[str]) -> None:
    rng = random.Random(11)
    log = Records()
    agentd = logging.getLogger("agentd")
    old_level = agentd.level
    agentd.setLevel(logging.INFO)
    agentd.addHandler(log)
    tally = Tally()
    try:
        async with trio.open_nursery() as nursery:
            workers = [await nursery.start(FaultWorker().run) for _ in range(2)]
            for w in workers:
                w.default = Act("ok", events=12, delay=0.003)  # ~40 ms streams: drops land mid-way
            cfg = fault_config([w.url for w in workers], program=True, capacity=CAPACITY)
            cfg = attrs.evolve(cfg, server=attrs.evolve(cfg.server, data_plane_processes=2))
            done = trio.Event()

            async def daemon(task_status: trio.TaskStatus[Any]) -> None:
                await run_daemon(cfg, task_status=task_status)
                done.set()

            handles = await nursery.start(daemon)
            url = handles.http_url
            assert url is not None and handles.data_plane is not None
            pool = handles.engine.transport.pool

            internal_port = handles.data_plane.scheduler_url.rsplit(":", 1)[1]

            def forwarded() -> int:
                """The internal listener's accepted connections (a relay forwards /health and the
                diagnostics there on a keep-alive connection of its own: idle, allowed to remain)."""
                sockets = _sockets()
                return sum(
                    1
                    for target in fd_table().values()
                    if sockets.get(target.removeprefix("socket:[").rstrip("]"), "").startswith(f"{internal_port}->")
                    and not sockets[target.removeprefix("socket:[").rstrip("]")].startswith(f"{internal_port}->0 ")
                )

            def adjusted_fds() -> int:
                # the workers live in this process: each relay's (or the scheduler's) upstream
                # connection is a descriptor here on the worker's side, the scheduler's own ones a
                # second; those are idle keep-alive connections, allowed to remain
                return open_fds() - sum(w.open_connections for w in workers) - pool.open_connections - forwarded()

            baseline = adjusted_fds()
            baseline_table = fd_table()
            killed = trio.Event()
            halfway = trio.Event()
            half = PROGRAMS * ROUNDS // 2
            finished_rounds = 0

            async def program(i: int) -> None:
                nonlocal finished_rounds
                pid = f"chaos-{i}"
                long_ttl = i < LONG_TTL_PROGRAMS
                client = httpx.AsyncClient(base_url=url, timeout=BUDGET_SECONDS)
                try:
                    for _ in range(ROUNDS):
                        ttl = 60.0 if long_ttl else rng.choice([0.005, 0.02, 0.06])
                        action = rng.choice(["stream", "stream", "json", "json", "drop_stream", "drop_upload"])
                        try:
                            if action == "drop_upload":
                                body = _body(pid, ttl, stream=rng.random() < 0.5)
                                await _drop_upload(url, body, rng.uniform(0.1, 0.9), rng.random() < 0.5)
                                tally.dropped_upload += 1
                            elif action == "drop_stream":
                                async with client.stream(
                                    "POST", "/v1/chat/completions", json=_body(pid, ttl, stream=True)
                                ) as response:
                                    tally.statuses[response.status_code] = (
                                        tally.statuses.get(response.status_code, 0) + 1
                                    )
                                    async for _chunk in response.aiter_raw():
                                        break  # gone after the first bytes (the connection is closed)
                                tally.dropped_stream += 1
                                await client.aclose()
                                client = httpx.AsyncClient(base_url=url, timeout=BUDGET_SECONDS)
                            else:
                                response = await client.post(
                                    "/v1/chat/completions", json=_body(pid, ttl, stream=action == "stream")
                                )
                                tally.statuses[response.status_code] = tally.statuses.get(response.status_code, 0) + 1
                                tally.completed += 1
                        except httpx.TransportError as exc:
                            assert killed.is_set(), (
                                repr(exc),
                                action,
                                trio.current_time(),
                            )  # only the killed relay cuts a connection
                            tally.cut_by_kill += 1
                            await client.aclose()
                            client = httpx.AsyncClient(base_url=url, timeout=BUDGET_SECONDS)
                        finished_rounds += 1
                        if finished_rounds >= half:
                            halfway.set()
                        # back to back, or a gap of the order of the short TTLs: the pass may be
                        # revoked while the next request (forwarded under it) is on its way
                        gap = rng.choice([0.0, 0.0, 0.005, 0.02, 0.05])
                        if gap:
                            await trio.sleep(gap)
                finally:
                    await client.aclose()

            async def killer(client: httpx.AsyncClient) -> None:
                await halfway.wait()
                doc = await diagnostics(client)
                victim = max(doc["data_plane"]["relays"], key=lambda r: r["open_leases"])
                killed.set()
                os.kill(victim["pid"], signal.SIGKILL)

            with trio.fail_after(BUDGET_SECONDS * 3):
                async with httpx.AsyncClient(base_url=url, timeout=BUDGET_SECONDS) as admin:
                    async with trio.open_nursery() as chaos:
                        chaos.start_soon(killer, admin)
                        for i in range(PROGRAMS):
                            chaos.start_soon(program, i)
            assert killed.is_set()

            async with httpx.AsyncClient(base_url=url, timeout=BUDGET_SECONDS) as client:

                def restarted(d: dict[str, Any]) -> bool:
                    relays = d["data_plane"]["relays"]
                    return all(r["alive"] and r.get("frames_received", 0) > 0 for r in relays) and (
                        sum(r["restarts_count"] for r in relays) == 1
                    )

                await await_diagnostics(client, restarted, PROCESS_START_BUDGET_SECONDS)
                # the short acting TTLs have lapsed and every lease ended: the counters balance
                state = handles.program_dispatcher.scheduler.state

                def at_rest(d: dict[str, Any]) -> bool:
                    short = [p for k, p in state.programs.items() if k.program_id.startswith("chaos-")]
                    return (
                        d["data_plane"]["open_leases"] == 0
                        and capacity_invariants(handles)["at_rest"]
                        and all(
                            p.state != ACTIVE for p in short if int(p.ref.program_id.split("-")[1]) >= LONG_TTL_PROGRAMS
                        )
                    )

                doc = await await_diagnostics(client, at_rest)
                counters = handles.program_dispatcher.counters
                assert counters.open_leases() == 0, counters
                # every request submitted was refused, completed or abandoned (some left while queued)
                assert counters.submitted_count == (
                    counters.rejected_count + counters.completed_count + counters.abandoned_count
                ), counters
                assert counters.admitted_count <= counters.submitted_count, counters
                assert invariants.check(state, handles.program_dispatcher.scheduler.cfg) == []
                assert _passes_only_for_active(doc, handles) == []
                # each relay's own view of its leases and passes agrees with the scheduler's, and no
                # difference was ever flagged, through the drops, the races and the kill (docs/operations.md §13.3)
                doc = await await_diagnostics(client, relay_views_agree)
                assert doc["data_plane"]["view_mismatches_count"] == 0, doc["data_plane"]
                assert [r["views"]["differed_count"] for r in doc["data_plane"]["relays"]] == [0, 0], doc["data_plane"]
                passes = doc["data_plane"]["passes"]
                assert passes["passed_count"] > 0 and passes["revoked_count"] > 0, passes
                # the daemon still serves Programs (a pass may be used) and identity-free requests
                for body in (_body("chaos-0", 60.0, stream=True), _body("after", 0.01, stream=False), STREAM):
                    response = await client.post("/v1/chat/completions", json=body)
                    assert response.status_code == 200, response.text
                await await_diagnostics(
                    client, lambda d: d["data_plane"]["open_leases"] == 0 and capacity_invariants(handles)["at_rest"]
                )
                # the relays' own in-flight gauges (merged into /metrics) are back to 0 as well
                with trio.fail_after(BUDGET_SECONDS):
                    while True:
                        if await _relay_in_flight(client) == 0:
                            break
                        await trio.sleep(0.05)

            assert set(tally.statuses) <= {200}, tally
            assert forwarded() <= 2  # at most one idle forwarding connection per relay (requests here were sequential)
            assert log.errors() == []
            pool.close_idle()
            assert await wait_until(lambda: adjusted_fds() <= baseline, BUDGET_SECONDS / 4), (
                adjusted_fds(),
                baseline,
                {
                    fd: _sockets().get(t.removeprefix("socket:[").rstrip("]"), t)
                    for fd, t in fd_table().items()
                    if baseline_table.get(fd) != t
                },
                url,
                [w.port for w in workers],
                [w.open_connections for w in workers],
                pool.open_connections,
            )
            handles.request_shutdown()
            with trio.fail_after(BUDGET_SECONDS):
                await done.wait()
            nursery.cancel_scope.cancel()
    finally:
        agentd.removeHandler(log)
        agentd.setLevel(old_level)
    out, err = capfd.readouterr()
    relay_errors = [line for line in (out + err).splitlines() if "level=error" in line.lower() or " ERROR " in line]
    assert relay_errors == []


async def _relay_in_flight(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        if family.name == "agentd_proxy_in_flight_requests"
        for s in family.samples
    )
