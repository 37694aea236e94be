"""Two relay processes and the scheduler over real sockets (docs/operations.md §13).

The daemon runs here (the scheduler process: actors, health, diagnostics) and starts two real
``python -m daemon.dataplane.relay_main`` processes on its port; the fake worker is a real-socket
server in this process.  Program-scheduling requests go through the relays; a relay SIGKILLed in
the middle of a stream has its lease released by the scheduler (capacity back to its baseline), is
restarted, and the daemon keeps serving; SIGTERM-style shutdown drains every process."""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
from typing import Any

import httpx
import pytest
import trio
from fault_env import BUDGET_SECONDS, await_diagnostics, diagnostics, pid_alive
from fault_worker import Act, FaultWorker

from actors.core.config import ProgramSchedulingConfig
from daemon.config import AgentdConfig, BatchApiConfig, RoutingConfig, ServerConfig
from daemon.supervisor import run_daemon

CHAT = {"model": "fault-model", "messages": [{"role": "user", "content": "hi"}]}
# a relay process boots in ~1.5 s of CPU; on a loaded 2-core machine that is tens of seconds of wall time
PROCESS_START_BUDGET_SECONDS = 180.0


def _program(body: dict[str, Any], program_id: str) -> dict[str, Any]:
    return {**body, "vllm_xargs": {"agentic_context": {"program_id": program_id}}}


def relay_config(worker_url: str, processes: int = 2) -> AgentdConfig:
    return AgentdConfig(
        server=ServerConfig(host="127.0.0.1", port=0, shutdown_grace_seconds=2.0, data_plane_processes=processes),
        routing=RoutingConfig(
            worker_urls=(worker_url,),
            health_check_interval_seconds=3600.0,
            stream_idle_timeout_seconds=60.0,
            policy="round_robin",
        ),
        batch_api=BatchApiConfig(enabled=False),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(token_capacity_per_dp_rank=100_000),
    )


async def start_relay_daemon(nursery: trio.Nursery, worker: FaultWorker) -> tuple[Any, trio.Event]:
    """The daemon (this process: the scheduler) with two relay processes in front of ``worker``:
    its handles, and an event set once ``run_daemon`` has returned."""
    done = trio.Event()

    async def daemon(task_status: trio.TaskStatus[Any]) -> None:
        await run_daemon(relay_config(worker.url), task_status=task_status)
        done.set()

    handles = await nursery.start(daemon)
    return handles, done


async def _proxied_successes(client: httpx.AsyncClient) -> float:
    """``agentd_proxy_requests_total{outcome="success"}`` summed over every process's /metrics."""
    metrics = (await client.get("/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("agentd_proxy_requests_total{") and 'outcome="success"' in line
    )


async def test_two_relays_serve_programs_survive_a_sigkill_and_drain() -> None:
    async with trio.open_nursery() as nursery:
        worker: FaultWorker = await nursery.start(FaultWorker().run)
        worker.default = Act(events=3)
        handles, daemon_done = await start_relay_daemon(nursery, worker)
        plane = handles.data_plane
        assert plane is not None and plane.processes == 2
        first_pids = [slot.pid for slot in plane.slots]
        assert all(pid_alive(pid) for pid in first_pids) and os.getpid() not in first_pids
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            baseline = (await diagnostics(client))["invariants"]
            assert baseline["at_rest"]

            # Program requests, plain and streamed, through the relays (fresh connections: the
            # kernel hands them to either relay)
            for i in range(6):
                async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as fresh:
                    plain = await fresh.post("/v1/chat/completions", json=_program(CHAT, f"p{i}"))
                    assert plain.status_code == 200, plain.text
                    assert plain.json()["usage"]["completion_tokens"] == 3
                    streamed = await fresh.post(
                        "/v1/chat/completions", json=_program({**CHAT, "stream": True}, f"s{i}")
                    )
                    assert streamed.status_code == 200
                    assert streamed.text.endswith("data: [DONE]\n\n")
            doc = await await_diagnostics(client, lambda d: d["dispatcher"]["completed_count"] >= 12)
            assert doc["dispatcher"]["completed_count"] == 12 and doc["dispatcher"]["abandoned_count"] == 0
            relays = doc["data_plane"]["relays"]
            assert sum(r["asks_count"] for r in relays) == 12
            assert [r["pid"] for r in relays] == first_pids

            # /metrics is every process's: the relays counted the proxied requests (a relay counts
            # a request after its last byte, so the count is awaited, then checked exactly)
            with trio.fail_after(BUDGET_SECONDS):
                while True:
                    counted = await _proxied_successes(client)
                    if counted >= 12:
                        break
                    await trio.sleep(0.05)
            assert counted == 12

            # keep-alive connections are spread evenly over the relays (docs/operations.md §13.1):
            # once the fresh connections above are closed, only `client`'s remains; three more,
            # opened one at a time, make two per relay
            await await_diagnostics(
                client, lambda d: sum(r["open_connections"] for r in d["data_plane"]["relays"]) == 1
            )
            held = [httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) for _ in range(3)]
            for i, one in enumerate(held):
                response = await one.post("/v1/chat/completions", json=_program(CHAT, f"kept{i}"))
                assert response.status_code == 200, response.text
            doc = await diagnostics(client)
            assert [(r["accepting"], r["open_connections"]) for r in doc["data_plane"]["relays"]] == [(True, 2)] * 2
            for one in held:
                await one.aclose()

            # a stream stalls in the worker; its relay is SIGKILLed mid-stream
            worker.script.append(Act(kind="stall", after=2))
            got_events = trio.Event()
            ended: list[str] = []

            async def stalled_stream() -> None:
                async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as own:
                    try:
                        async with own.stream(
                            "POST", "/v1/chat/completions", json=_program({**CHAT, "stream": True}, "victim")
                        ) as response:
                            assert response.status_code == 200
                            async for _ in response.aiter_raw():
                                got_events.set()
                        ended.append("ended")
                    except httpx.HTTPError as exc:
                        ended.append(type(exc).__name__)

            async with trio.open_nursery() as victim:
                victim.start_soon(stalled_stream)
                with trio.fail_after(BUDGET_SECONDS):
                    await got_events.wait()
                doc = await diagnostics(client)
                [holder] = [r for r in doc["data_plane"]["relays"] if r["open_leases"] == 1]
                assert doc["invariants"]["program_in_flight"] == 1
                os.kill(holder["pid"], signal.SIGKILL)
            # the stream was cut, never completed (FIN: an incomplete chunked body; RST: a read error)
            assert ended in (["RemoteProtocolError"], ["ReadError"]), ended

            # the abandon is counted, then the scheduler actor releases the capacity: await both
            state = await await_diagnostics(
                client, lambda d: d["dispatcher"]["abandoned_count"] >= 1 and d["invariants"]["at_rest"]
            )
            assert state["dispatcher"]["abandoned_count"] == 1
            invariants = state["invariants"]
            for key in ("program_in_flight", "in_flight_reserved_tokens", "program_open_leases", "pending_replies"):
                assert invariants[key] == baseline[key], key

            # the supervisor restarts the relay (after its backoff) and logs the exit; a new
            # Python process boots (imports alone took 11-15 s at load 12 on 2 cores)
            def restarted(d: dict[str, Any]) -> bool:
                slot = d["data_plane"]["relays"][holder["index"]]
                return bool(slot["alive"] and slot["pid"] != holder["pid"] and slot.get("frames_received", 0) > 0)

            doc = await await_diagnostics(client, restarted, PROCESS_START_BUDGET_SECONDS)
            slot = doc["data_plane"]["relays"][holder["index"]]
            assert slot["restarts_count"] == 1 and slot["last_exit"] == "killed by SIGKILL"
            assert not pid_alive(holder["pid"])
            assert "\nagentd_data_plane_relay_restarts_total 1.0\n" in (await client.get("/metrics")).text

            # the daemon keeps serving, through both relays
            for i in range(6):
                async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as fresh:
                    again = await fresh.post("/v1/chat/completions", json=_program(CHAT, f"after{i}"))
                    assert again.status_code == 200, again.text
            doc = await await_diagnostics(
                client, lambda d: d["dispatcher"]["completed_count"] >= 21 and d["data_plane"]["open_leases"] == 0
            )
            assert doc["dispatcher"]["completed_count"] == 21
            assert doc["data_plane"]["open_leases"] == 0

            # graceful shutdown with a stream in flight: its relay finishes it, the completion
            # reaches the scheduler, then every process exits
            worker.script.append(Act(events=10, delay=0.1))
            first_event = trio.Event()
            drained: list[str] = []

            async def draining_stream() -> None:
                async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as own:
                    body = _program({**CHAT, "stream": True}, "drained")
                    async with own.stream("POST", "/v1/chat/completions", json=body) as response:
                        text = b""
                        async for chunk in response.aiter_raw():
                            text += chunk
                            first_event.set()
                        drained.append(text.decode())

            pids = [slot.pid for slot in plane.slots]
            async with trio.open_nursery() as in_flight:
                in_flight.start_soon(draining_stream)
                with trio.fail_after(BUDGET_SECONDS):
                    await first_event.wait()
                handles.request_shutdown()
            [text] = drained
            assert text.endswith("data: [DONE]\n\n") and text.count('"content": "x"') == 10
        with trio.fail_after(BUDGET_SECONDS):
            await daemon_done.wait()
        assert not any(pid_alive(pid) for pid in pids)
        assert [slot.last_exit for slot in plane.slots] == ["exit status 0", "exit status 0"]
        counters = handles.program_dispatcher.counters
        assert (counters.completed_count, counters.abandoned_count, counters.open_leases()) == (22, 1, 0)
        nursery.cancel_scope.cancel()


async def test_routes_forwarded_to_the_scheduler_keep_its_content_length() -> None:
    """Diagnostics, metrics and the dashboard's document answer through a relay with the scheduler
    process's content-length, not chunked (docs/operations.md §13.1), over real sockets."""
    async with trio.open_nursery() as nursery:
        worker: FaultWorker = await nursery.start(FaultWorker().run)
        handles, daemon_done = await start_relay_daemon(nursery, worker)
        assert handles.data_plane is not None and handles.data_plane.processes == 2
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            for path in ("/scheduling/diagnostics", "/metrics", "/scheduling/dashboard.json", "/health"):
                response = await client.get(path)
                assert response.status_code == 200, (path, response.text)
                assert "transfer-encoding" not in response.headers, path
                assert response.headers["content-length"] == str(len(response.content)), path
                assert len(response.headers.get_list("date")) == 1, path
        handles.request_shutdown()
        with trio.fail_after(BUDGET_SECONDS):
            await daemon_done.wait()
        nursery.cancel_scope.cancel()


def test_the_supervisor_refuses_in_process_fakes_with_relay_processes() -> None:
    cfg = relay_config("http://127.0.0.1:9")

    async def main() -> None:
        await run_daemon(cfg, transport_factory=lambda _cfg: httpx.MockTransport(lambda r: httpx.Response(200)))

    try:
        trio.run(main)
    except ValueError as exc:
        assert "data_plane_processes" in str(exc)
    else:
        raise AssertionError("accepted a transport factory with relay processes")


def test_relay_command_imports_this_processes_agentd_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A relay imports the code its daemon runs, even when the daemon found it through a path
    the child does not inherit (a second checkout beside an editable install, pytest's own
    sys.path entries), and keeps the rest of PYTHONPATH after it."""
    import daemon
    from daemon.dataplane.processes import relay_command

    root = os.path.dirname(os.path.dirname(os.path.abspath(daemon.__file__)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/elsewhere", root]))
    command, env = relay_command()
    assert command[1:] == ["-P", "-m", "daemon.dataplane.relay_main"]
    assert env["PYTHONPATH"].split(os.pathsep) == [root, "/elsewhere"]
    monkeypatch.delenv("PYTHONPATH")
    assert relay_command()[1]["PYTHONPATH"] == root


async def test_a_shutdown_during_a_relay_restart_stops_the_new_relay() -> None:
    """A SIGTERM that arrives while the supervisor is starting a relay again (after one died)
    drains that relay too (docs/operations.md §13.2).  Starting a process awaits (the fork runs in
    a thread, the specification is written to its stdin); the stop signals went to the relays
    alive at the signal, so the new one got none: it kept accepting on the public port and the
    daemon waited for it forever."""
    async with trio.open_nursery() as nursery:
        worker: FaultWorker = await nursery.start(FaultWorker().run)
        handles, daemon_done = await start_relay_daemon(nursery, worker)
        plane = handles.data_plane
        assert plane is not None
        spawn = plane._spawn
        spawned: list[int] = []

        async def spawn_then_shutdown(slot: Any) -> Any:
            # the shutdown arrives while the new relay is being started (its process exists, the
            # supervisor has not recorded it yet)
            proc, link = await spawn(slot)
            spawned.append(proc.pid)
            handles.request_shutdown()
            while not plane.stopping:  # noqa: ASYNC110 (set by the supervisor's stop task)
                await trio.sleep(0.01)
            return proc, link

        plane._spawn = spawn_then_shutdown
        victim = plane.slots[0].pid
        assert victim is not None
        try:
            os.kill(victim, signal.SIGKILL)
            with trio.fail_after(BUDGET_SECONDS):
                await daemon_done.wait()
            [pid] = spawned
            assert not pid_alive(pid)
            assert plane.slots[0].pid == pid and plane.slots[0].last_exit != "running"
        finally:
            for pid in spawned:
                if pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)
        nursery.cancel_scope.cancel()


def test_a_relay_whose_scheduler_ends_before_its_first_snapshot_exits_0_at_once() -> None:
    """The scheduler process dies (``kill -9``) while a relay is booting, a restarted one for
    instance: the relay has said hello and waits for its first snapshot, which never comes.  Like a
    relay that was serving, it stops at once (docs/operations.md §13.2): before, it kept its copy of
    the public listening socket (a new ``agentd start`` on the port could not bind) until its
    30 s first-snapshot timeout, then died with a ``TooSlowError`` traceback, exit status 1."""
    from daemon.dataplane.balance import AcceptBoard
    from daemon.dataplane.processes import RelaySpec, listening_socket, relay_command

    sock, _url = listening_socket("127.0.0.1", 0)
    board = AcceptBoard.create(2)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    cfg = relay_config("http://127.0.0.1:9")
    spec = RelaySpec(cfg, 1, theirs.fileno(), sock.fileno(), "http://127.0.0.1:9", board.fd, 2)
    command, env = relay_command()
    proc = subprocess.Popen(
        command,
        env=env,
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(theirs.fileno(), sock.fileno(), board.fd),
    )
    try:
        theirs.close()
        assert proc.stdin is not None
        proc.stdin.write(pickle.dumps(spec))
        proc.stdin.close()
        proc.stdin = None  # written: communicate() only reads stderr
        ours.settimeout(BUDGET_SECONDS)
        assert ours.recv(4096)  # its Hello: booted, waiting for the first snapshot
        ours.close()  # the scheduler process is gone
        _out, err = proc.communicate(timeout=BUDGET_SECONDS)
        assert proc.returncode == 0, err.decode()
        assert b"Traceback" not in err and b"relay_scheduler_gone" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()
        board.close()


async def test_a_relay_that_does_not_drain_is_killed_after_the_grace_period() -> None:
    """A relay that does not exit after the stop signal (stopped, stuck in a blocking call) is
    killed ``shutdown_grace_seconds`` + 5 s after the shutdown began (``relay_killed``,
    docs/operations.md §13.2).  Before, the supervisor waited for it without a deadline: with
    one relay SIGSTOPped, a SIGTERM left the daemon running for as long as the relay stayed
    stopped (10 minutes in a manual check)."""
    async with trio.open_nursery() as nursery:
        worker: FaultWorker = await nursery.start(FaultWorker().run)
        handles, daemon_done = await start_relay_daemon(nursery, worker)
        plane = handles.data_plane
        assert plane is not None
        stuck = plane.slots[0].pid
        assert stuck is not None
        try:
            os.kill(stuck, signal.SIGSTOP)
            handles.request_shutdown()
            with trio.fail_after(BUDGET_SECONDS):
                await daemon_done.wait()
            assert [slot.last_exit for slot in plane.slots] == ["killed by SIGKILL", "exit status 0"]
            assert not pid_alive(stuck)
        finally:
            if pid_alive(stuck):
                os.kill(stuck, signal.SIGKILL)
        nursery.cancel_scope.cancel()
