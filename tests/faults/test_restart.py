"""F10: the daemon is SIGKILLed with streams in flight and started again (a real process in front
of a FaultWorker): it serves again, and no request id is ever reused across the restart."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import trio
from fault_env import BUDGET_SECONDS, CHAT, STREAM, wait_until
from fault_worker import Act, FaultWorker

ROOT = Path(__file__).resolve().parents[2]


async def read_line(stream: trio.abc.ReceiveStream) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = await stream.receive_some(1)
        if not chunk:
            break
        data += chunk
    return data.decode()


async def start_daemon(worker: FaultWorker) -> tuple[trio.Process, str]:
    cmd = [sys.executable, "-m", "daemon", "start", "--port", "0", "--worker-urls", worker.url, "--log-level", "error"]
    proc = await trio.lowlevel.open_process(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    with trio.fail_after(BUDGET_SECONDS):
        line = await read_line(proc.stdout)
    match = re.fullmatch(r"agentd listening on (http://127\.0\.0\.1:\d+)\n", line)
    assert match, line
    return proc, match.group(1)


async def test_f10_sigkill_and_restart_serves_again_without_request_id_reuse() -> None:
    async with trio.open_nursery() as nursery:
        worker: FaultWorker = await nursery.start(FaultWorker().run)
        worker.default = Act("ok", events=200, delay=0.05)  # streams of ~10 s: in flight at the kill
        proc, url = await start_daemon(worker)
        try:
            async with httpx.AsyncClient(base_url=url, timeout=BUDGET_SECONDS) as client:
                worker.script.extend([Act("ok")] * 3)
                assert [(await client.post("/v1/chat/completions", json=CHAT)).status_code for _ in range(3)] == [
                    200
                ] * 3
                streaming = len(worker.generation_requests())

                async def stream_until_killed() -> None:
                    try:
                        async with client.stream("POST", "/v1/chat/completions", json=STREAM) as response:
                            async for _ in response.aiter_raw():
                                pass
                    except httpx.HTTPError:
                        pass  # the daemon is gone: the connection breaks (nothing can answer it)

                async with trio.open_nursery() as streams:
                    for _ in range(4):
                        streams.start_soon(stream_until_killed)
                    assert await wait_until(lambda: len(worker.generation_requests()) == streaming + 4)
                    proc.send_signal(signal.SIGKILL)
                    with trio.fail_after(BUDGET_SECONDS):
                        assert await proc.wait() == -signal.SIGKILL
            before = {r.headers["x-request-id"] for r in worker.generation_requests()}
            assert len(before) == 7
            # the killed daemon's upstream connections close with its process
            assert await wait_until(lambda: worker.open_connections == 0)
            proc, url = await start_daemon(worker)
            async with httpx.AsyncClient(base_url=url, timeout=BUDGET_SECONDS) as client:
                worker.script.extend([Act("ok")] * 7)
                responses = [
                    await client.post("/v1/chat/completions", json=STREAM if i % 2 else CHAT) for i in range(7)
                ]
                assert [r.status_code for r in responses] == [200] * 7
                diagnostics = (await client.get("/scheduling/diagnostics")).json()
            after = {r.headers["x-request-id"] for r in worker.generation_requests()[7:]}
            assert len(after) == 7 and not before & after
            assert diagnostics["invariants"]["at_rest"] is True
            proc.send_signal(signal.SIGTERM)
            with trio.fail_after(BUDGET_SECONDS):
                assert await proc.wait() == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            nursery.cancel_scope.cancel()
