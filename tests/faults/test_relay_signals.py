"""Signals to ``agentd start`` with relay processes, as a terminal or a process manager sends them
(docs/operations.md §13.2).

Ctrl-C:

A terminal's Ctrl-C is a SIGINT to the whole foreground process group.  The relay processes were in
the scheduler's group: a Ctrl-C while they were still booting (a relay needs seconds of imports on
a loaded machine) killed them with ``KeyboardInterrupt`` tracebacks and the daemon exited 1 with an
exception group ("relay process 0 did not start: killed by SIGINT").  Now each relay has a process
group of its own, the scheduler process stops them, and the daemon exits 0 without a traceback,
during start-up as after it.

SIGTERM to the whole group or cgroup (systemd's default ``KillMode=control-group``): every relay got
the process manager's SIGTERM and the scheduler's, took the second for "cancel at once" and cut
every stream without the drain of docs/operations.md §10.4 (no error event, no ``[DONE]``, the daemon gone in 0.7 s
instead of the grace period).  The scheduler now asks its relays with a signal of its own
(``STOP_SIGNAL``), and a relay cancels only on a second signal of the same kind.

The daemon is a real ``agentd start`` process here; the worker is down (a closed port: agentd starts
without it) or a fake worker in this process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from fault_env import pid_alive
from fault_worker import Act, FaultWorker

BUDGET_SECONDS = 240.0  # two relay processes boot in seconds idle, in tens of seconds on a loaded box


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _config(tmp_path: Path, worker_url: str | None = None) -> Path:
    worker_url = worker_url or f"http://127.0.0.1:{_closed_port()}"
    path = tmp_path / "agentd.toml"
    path.write_text(
        "enable_program_scheduling = true\n"
        '[server]\nhost = "127.0.0.1"\nport = 0\ndata_plane_processes = 2\nshutdown_grace_seconds = 1.0\n'
        f'[routing]\nworker_urls = ["{worker_url}"]\n'
        "[batch_api]\nenabled = false\n"
        "[program_scheduling]\ntoken_capacity_per_dp_rank = 100000\n"
    )
    return path


def _relay_pids(text: str) -> list[int]:
    return [int(line.split(" pid=")[1].split()[0]) for line in text.splitlines() if "event=relay_started" in line]


async def _ctrl_c(tmp_path: Path, after: str) -> tuple[int, str, list[int]]:
    """Start ``agentd start`` in a process group of its own (as a shell does for a foreground job),
    SIGINT the group as soon as its output shows ``after``; its exit code, output and relay pids."""
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "daemon", "start", "--config", str(_config(tmp_path))],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        process_group=0,
    )
    assert process.stdout is not None
    output = b""
    sent = False
    relays: list[int] = []
    try:
        with trio.fail_after(BUDGET_SECONDS):
            async for chunk in process.stdout:
                output += chunk
                text = output.decode(errors="replace")
                relays = _relay_pids(text)
                if not sent and after in text:
                    os.killpg(process.pid, signal.SIGINT)
                    sent = True
            code = await process.wait()
    finally:
        if process.returncode is None:
            os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    assert sent, output.decode(errors="replace")[-2000:]
    return code, output.decode(errors="replace"), relays


@pytest.mark.parametrize("moment", ["event=relay_started", "agentd listening on"])
async def test_ctrl_c_stops_the_daemon_and_its_relays_with_exit_0(tmp_path: Path, moment: str) -> None:
    code, output, relays = await _ctrl_c(tmp_path, moment)
    assert code == 0, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    assert len(relays) == 2
    assert not any(pid_alive(pid) for pid in relays)  # the scheduler waited for its relays' exit
    assert "event=daemon_stopped" in output


class Output:
    """A process's output, read as it comes; waits for a line to appear."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.data = b""
        self.changed = trio.Event()

    async def read(self) -> None:
        async for chunk in self.stream:
            self.data += chunk
            self.changed.set()
            self.changed = trio.Event()

    @property
    def text(self) -> str:
        return self.data.decode(errors="replace")

    async def until(self, needle: str, count: int = 1) -> None:
        while self.text.count(needle) < count:
            await self.changed.wait()


async def test_sigterm_to_the_whole_group_drains_the_relays_streams(tmp_path: Path) -> None:
    """systemd's KillMode=control-group: the scheduler and every relay get a SIGTERM.  The relays'
    are delivered (and handled) first here, the order in which the old code cut every stream."""
    async with trio.open_nursery() as nursery:
        worker: FaultWorker = await nursery.start(FaultWorker().run)
        worker.default = Act(events=400, delay=0.05)  # a 20 s stream: still running at the deadline
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "daemon", "start", "--config", str(_config(tmp_path, worker.url))],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
        output = Output(process.stdout)
        nursery.start_soon(output.read)
        try:
            with trio.fail_after(BUDGET_SECONDS):
                await output.until("agentd listening on ")
                url = output.text.split("agentd listening on ")[1].split()[0]
                relays = _relay_pids(output.text)
                assert len(relays) == 2
                streamed = b""
                async with httpx.AsyncClient(base_url=url, timeout=BUDGET_SECONDS) as client:
                    body = {
                        "model": "fault-model",
                        "stream": True,
                        "messages": [{"role": "user", "content": "hi"}],
                        "vllm_xargs": {"agentic_context": {"program_id": "p"}},
                    }
                    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
                        assert response.status_code == 200
                        async for data in response.aiter_raw():
                            if not streamed:
                                for pid in relays:
                                    os.kill(pid, signal.SIGTERM)
                                await output.until("event=relay_shutdown_requested", 2)
                                os.kill(process.pid, signal.SIGTERM)
                            streamed += data
                code = await process.wait()
        finally:
            if process.returncode is None:
                os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        text = output.text
        assert code == 0, text[-3000:]
        # the drain's answer at the deadline (docs/operations.md §10.4), not a cut connection
        assert streamed.endswith(b"data: [DONE]\n\n"), streamed[-300:]
        assert b'"code": "server_shutting_down"' in streamed
        assert streamed.count(b'"content": "x"') < 400
        assert "event=request_drained" in text and "Traceback" not in text
        assert not any(pid_alive(pid) for pid in relays)
        nursery.cancel_scope.cancel()
