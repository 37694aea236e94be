"""The ``/dashboard`` page in a real headless Chromium, against a real daemon.

The daemon runs in process over a real socket (127.0.0.1, port 0) on the embedded simulated
backend with Program scheduling on; six Program requests make some Programs run while others
wait.  Chromium (``--headless=new --dump-dom`` after a virtual-time budget, so the page's
polling runs) must render the rank ids, the Program ids with the states that
``/scheduling/diagnostics`` reports around the dump, and live numbers: a page whose script is
broken shows none of these and fails the test.  A second run takes a PNG screenshot; set
``AGENTD_UPDATE_DASHBOARD_SCREENSHOT=1`` to write it to docs/images/dashboard.png.

The JSON endpoint's parameter validation and the Program-scheduling-off page are tested here too.
``scripts/test.sh`` installs Chromium when it is missing and it runs as root; without a browser
the browser test is skipped with the reason.
"""

from __future__ import annotations

import os
import re
import shutil
from html import unescape
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from actors.core.config import ProgramSchedulingConfig
from daemon.config import AgentdConfig, EmbeddedConfig, RoutingConfig, ServerConfig
from daemon.supervisor import run_daemon

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "docs" / "images" / "dashboard.png"


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def config(program_scheduling: bool = True) -> AgentdConfig:
    return AgentdConfig(
        server=ServerConfig(host="127.0.0.1", port=0),
        routing=RoutingConfig(policy="round_robin"),
        embedded=EmbeddedConfig(
            num_workers=1, dp_size=2, num_gpu_blocks=64, block_size=16, time_scale=20.0, model="sim-model"
        ),
        enable_program_scheduling=program_scheduling,
        program_scheduling=ProgramSchedulingConfig(token_capacity_per_dp_rank=1024, metrics_interval_seconds=0.1)
        if program_scheduling
        else None,
    )


def body(program_id: str) -> dict[str, Any]:
    words = " ".join(f"{program_id}-word{i}" for i in range(120))  # ~300 estimated prompt tokens
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": words}],
        "max_tokens": 24,
        "vllm_xargs": {"agentic_context": {"program_id": program_id}},
    }


async def browser(url: str, tmp: Path, *extra: str) -> str:
    exe = chromium()
    assert exe is not None
    cmd = [
        exe,
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={tmp / 'profile'}",
        "--window-size=1400,1100",
        "--virtual-time-budget=4000",
        *extra,
        url,
    ]
    with trio.fail_after(120):
        done = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout.decode()


def program_states(diag: dict[str, Any]) -> dict[str, str]:
    return {p["program"]: f"{p['state']} · {p['status']}" for r in diag["ranks"] for p in r["programs"]}


@pytest.mark.skipif(chromium() is None, reason="no chromium on PATH (scripts/test.sh installs it when run as root)")
async def test_dashboard_renders_live_scheduling_state_in_chromium(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(run_daemon, config())
        base = handles.http_url
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:

            async def one(pid: str) -> None:
                r = await client.post("/v1/chat/completions", json=body(pid))
                assert r.status_code == 200, r.text

            async with trio.open_nursery() as load:
                for i in range(6):
                    load.start_soon(one, f"dash-task:{i}")
            before = (await client.get("/scheduling/diagnostics")).json()
            dom = unescape(await browser(f"{base}/dashboard", tmp_path, "--dump-dom"))
            after = (await client.get("/scheduling/diagnostics")).json()

            async def agent(pid: str) -> None:  # steps with short tool calls in between
                while True:
                    await one(pid)
                    await trio.sleep(0.05)

            async with trio.open_nursery() as load:  # the screenshot shows the daemon under load
                for i in range(8):
                    load.start_soon(agent, f"dash-task:{i}")
                await trio.sleep(1.0)
                await browser(f"{base}/dashboard", tmp_path, f"--screenshot={tmp_path / 'dashboard.png'}")
                load.cancel_scope.cancel()
        handles.shutdown.set()

    # the script ran and polled (a broken script leaves data-polls="0" and no rank cards)
    polls = re.search(r'id="status"[^>]*data-polls="(\d+)"', dom) or re.search(
        r'data-polls="(\d+)"[^>]*id="status"', dom
    )
    assert polls is not None and int(polls.group(1)) >= 1, dom[:3000]
    assert "live · updated" in dom
    assert "Program scheduling on" in dom
    # every DP rank of the diagnostics has a card, with its ledger numbers
    rank_ids = [r["target_id"] for r in after["ranks"]]
    assert len(rank_ids) == 2
    for rank in rank_ids:
        assert f'data-rank="{rank}"' in dom
    assert dom.count("engine queue <b>") == 2  # the engine's queue at the last scrape, per rank
    capacity = f"/ {after['ranks'][0]['configured_token_capacity']:,}"
    assert capacity in dom  # "<ledger used> / 1,024"
    # every live Program is a table row showing a state the diagnostics reported around the dump
    states_before, states_after = program_states(before), program_states(after)
    assert len(states_after) == 6
    for program in states_after:
        row = re.search(rf'<tr data-program="{program}">(.*?)</tr>', dom)
        assert row is not None, f"Program {program} missing from the page"
        shown = re.search(r'class="pstate">([^<]*)<', row.group(1))
        assert shown is not None
        assert shown.group(1) in {states_before.get(program), states_after[program]}
    assert re.search(r"<b>6</b>live Programs", dom)
    # recent events and the per-tick history are rendered
    assert re.search(r'<li class="k-(admit|resume)" title="reason: [a-z_]+">', dom)
    assert dom.count("<polyline") == 5
    # the proxy targets are listed as healthy
    assert dom.count('class="healthy">healthy<') == 2

    shot = tmp_path / "dashboard.png"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert shot.stat().st_size > 10_000
    if os.environ.get("AGENTD_UPDATE_DASHBOARD_SCREENSHOT") == "1":
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)


async def test_dashboard_json_validates_parameters_and_pages() -> None:
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(run_daemon, config())
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=60) as client:
            for i in range(3):
                r = await client.post("/v1/chat/completions", json=body(f"json-task:{i}"))
                assert r.status_code == 200
            ok = await client.get("/scheduling/dashboard.json", params={"page": "1", "state": "all", "sort": "context"})
            assert ok.status_code == 200
            doc = ok.json()
            assert doc["enabled"] is True
            assert doc["programs"]["counts"]["all"] == 3
            assert len(doc["programs"]["rows"]) == 3
            contexts = [row["context_tokens"] for row in doc["programs"]["rows"]]
            assert contexts == sorted(contexts, reverse=True)
            assert len(ok.content) < 16_000
            for rank in doc["ranks"]:  # the engine's queue and the waiting gate (docs/operations.md §9)
                assert rank["waiting_gate_shut"] in (True, False)
                assert rank["engine_waiting_requests"] is None or rank["engine_waiting_requests"] >= 0
            for params, param in (
                ({"page": "0"}, "page"),
                ({"page": "x"}, "page"),
                ({"state": "sleeping"}, "state"),
                ({"sort": "age"}, "sort"),
                ({"limit": "5"}, "limit"),
                ([("page", "1"), ("page", "abc")], "page"),  # repeated: which one? (session 34)
                ([("state", "active"), ("state", "all")], "state"),
            ):
                bad = await client.get("/scheduling/dashboard.json", params=params)
                assert bad.status_code == 400, params
                assert bad.json()["error"]["param"] == param
            for name in ("dashboard", "dashboard/dashboard.js", "dashboard/dashboard.css"):
                assert (await client.get(f"/{name}")).status_code == 200
            assert (await client.get("/dashboard/secret.py")).status_code == 404
        handles.shutdown.set()


async def test_dashboard_json_without_program_scheduling_shows_proxy_only() -> None:
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(run_daemon, config(program_scheduling=False))
        async with httpx.AsyncClient(base_url=handles.http_url, timeout=60) as client:
            doc = (await client.get("/scheduling/dashboard.json")).json()
        handles.shutdown.set()
    assert doc["enabled"] is False
    assert [t["target_id"] for t in doc["proxy"]["targets"]] == [
        t.target_id for t in config(program_scheduling=False).targets()
    ]
