"""F9 of issue 14: SIGTERM to ``agentd start`` with hundreds of open streams and queued requests.

A real ``agentd start`` process in front of the fast fake worker (``bench.fakeworker``, its own
process) whose streams send one chunk a second for a very long time, so that no request can
finish within the grace period; 150 requests are admitted (``max_in_flight_requests``) and 150
more wait in the edge queue.  After SIGTERM every request must get a complete answer -
a 200 stream ending with an error event and ``data: [DONE]``, or a JSON 503 with Retry-After -
with no connection reset, and the process must exit 0 (docs/operations.md §10.4).

Real clock, on a machine that may be loaded: the bounds here (``SLACK`` beyond the grace period)
tell "ended by the grace deadline" from "never ended" (the worker's streams would run for a day),
not the promised seconds themselves - a 2-core CI machine under load once took longer than
grace + 2 s to read 300 answers.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import trio
from native_fakes import read_line, reap

from bench.procs import fakeworker_cmd, running
from bench.rawhttp import RawResponse, post

ROOT = Path(__file__).resolve().parents[2]
GRACE = 2.0
SLACK = 30.0  # a bound against hangs, not a measurement (module docstring)
ADMITTED = 150
QUEUED = 150
CONFIG = """
[server]
host = "127.0.0.1"
port = 0
shutdown_grace_seconds = {grace}
log_level = "warning"

[routing]
worker_urls = ["{worker}"]

[limits]
max_in_flight_requests = {admitted}
max_queued_requests = {queued}
queue_timeout_seconds = 600.0

[batch_api]
enabled = false
"""


def body(i: int, stream: bool) -> bytes:
    return json.dumps(
        {
            "model": "fake",
            "messages": [{"role": "user", "content": f"request {i}: tell a long story"}],
            "max_tokens": 100_000,
            "stream": stream,
        }
    ).encode()


def check_answer(r: RawResponse) -> str:
    """The kind of complete answer ``r`` is; fails on anything else."""
    assert r.error is None, (r.error, r.status, r.body[-200:])
    assert r.complete
    if r.status == 503:
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "server_shutting_down"
        return "503"
    assert r.status == 200, (r.status, r.body[:200])
    assert r.sse_done, r.body[-200:]
    events = [e for e in r.body.split(b"\n\n") if e.startswith(b"data: ")]
    assert json.loads(events[-2][len(b"data: ") :])["error"]["code"] == "server_shutting_down"
    return "stream_ended"


async def test_sigterm_answers_every_open_stream_and_queued_request_then_exits_0(tmp_path: Path) -> None:
    async with running(fakeworker_cmd(tokens=100_000, first_token_seconds=0.01, token_interval=1.0)) as (_, worker):
        await _drain_scenario(tmp_path, worker)


async def _drain_scenario(tmp_path: Path, worker: str) -> None:
    config = tmp_path / "drain.toml"
    config.write_text(CONFIG.format(worker=worker, grace=GRACE, admitted=ADMITTED, queued=QUEUED * 2))
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "daemon", "start", "--config", str(config)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert proc.stdout is not None
        with trio.fail_after(180):
            line = await read_line(proc.stdout)
        match = re.fullmatch(r"agentd listening on (http://127\.0\.0\.1:(\d+))\n", line)
        assert match, line
        url, port = match.group(1), int(match.group(2))
        results: list[RawResponse] = []

        async def one(i: int, stream: bool) -> None:
            results.append(await post("127.0.0.1", port, "/v1/chat/completions", body(i, stream)))

        async def edge() -> dict[str, int]:
            async with httpx.AsyncClient(timeout=30) as client:
                doc = (await client.get(f"{url}/scheduling/diagnostics")).json()
            return doc["proxy"]["edge"]

        async def until_edge(key: str, count: int) -> None:
            while True:
                if (await edge())[key] >= count:
                    return
                await trio.sleep(0.1)

        async with trio.open_nursery() as nursery:
            for i in range(ADMITTED):
                nursery.start_soon(one, i, True)
            with trio.fail_after(180):
                await until_edge("in_flight", ADMITTED)
            for i in range(QUEUED):
                nursery.start_soon(one, ADMITTED + i, i % 4 != 0)  # streaming and not
            with trio.fail_after(180):
                await until_edge("queued", QUEUED)
            signalled = trio.current_time()
            proc.send_signal(signal.SIGTERM)
            with trio.fail_after(GRACE + SLACK):
                returncode = await proc.wait()
            exited = trio.current_time()
        assert returncode == 0
        assert exited - signalled <= GRACE + SLACK
        assert len(results) == ADMITTED + QUEUED
        kinds = [check_answer(r) for r in results]
        assert max(r.done_at or 0.0 for r in results) - signalled <= GRACE + SLACK
        assert kinds.count("503") == QUEUED  # the queue is answered at once
        assert kinds.count("stream_ended") == ADMITTED  # the streams at the deadline: error event + [DONE]
    finally:
        await reap(proc)
