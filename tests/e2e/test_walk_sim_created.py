"""The simulated backend's ``created`` field (found by the session-26 walk).

vLLM sends ``created`` as an int Unix time; the simulator sent its Trio clock's seconds (a few
seconds since the process started: 1970 to an OpenAI client).  On the real clock (the quick start's
embedded backend, ``agentd sim-backend``) it is now a Unix time; in process under MockClock
(``agentd simulate``) it stays virtual seconds, so every simulated run stays deterministic.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from functools import partial

import attrs
import httpx
import trio
import trio.testing
from native_fakes import BUDGET_SECONDS

from daemon.config import AgentdConfig, EmbeddedConfig, RoutingConfig, ServerConfig
from daemon.http.proxy import CollectingSink
from daemon.supervisor import run_daemon

BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}


def embedded_config() -> AgentdConfig:
    return AgentdConfig(
        server=ServerConfig(port=0),
        routing=RoutingConfig(policy="round_robin"),
        embedded=EmbeddedConfig(dp_size=1, num_gpu_blocks=256, time_scale=50.0, model="sim-model"),
    )


def created_of_stream(content: bytes) -> set[int]:
    events = [e for e in content.split(b"\n\n") if e and e != b"data: [DONE]"]
    return {json.loads(e[6:])["created"] for e in events}


async def test_the_quick_start_daemon_sends_a_unix_created() -> None:
    before = int(time.time())
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(partial(run_daemon, embedded_config()))
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=BUDGET_SECONDS) as client:
            whole = await client.post("/v1/chat/completions", json=BODY)
            streamed = await client.post("/v1/chat/completions", json={**BODY, "stream": True})
        handles.request_shutdown()
    after = int(time.time())
    assert before <= whole.json()["created"] <= after
    (created,) = created_of_stream(streamed.content)  # one value for the whole stream, as vLLM
    assert before <= created <= after


async def test_in_process_under_mock_clock_created_is_virtual_seconds(autojump_clock: trio.testing.MockClock) -> None:
    cfg = attrs.evolve(embedded_config(), embedded=EmbeddedConfig(dp_size=1, num_gpu_blocks=256, time_scale=1.0))
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(
            partial(run_daemon, cfg, serve_http=False, sim_configure=lambda c: attrs.evolve(c, deterministic=True))
        )
        await trio.sleep(1234.5)  # virtual
        raw = json.dumps({**BODY, "model": "agentd-sim", "stream": True}).encode()
        sink = CollectingSink()
        await handles.handle(handles.build_request("chat", raw, {}), sink, raw_body=raw)
        handles.request_shutdown()
    assert sink.status == 200
    # submitted at virtual second 1234.5 (+ the start-up's virtual health round, well under a second)
    assert created_of_stream(sink.body) == {1234}


def test_agentd_sim_backend_sends_a_unix_created() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon", "sim-backend", "--port", "0", "--time-scale", "50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("agentd sim-backend listening on "), line
        url = line.split()[-1]
        before = int(time.time())
        whole = httpx.post(f"{url}/v1/chat/completions", json={**BODY, "model": "agentd-sim"}, timeout=60)
        models = httpx.get(f"{url}/v1/models", timeout=60)
        after = int(time.time())
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 0
    assert before <= whole.json()["created"] <= after
    assert before <= models.json()["data"][0]["created"] <= after  # vLLM: the time of the call
