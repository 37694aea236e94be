"""The ``/dashboard`` panels beyond Program scheduling in a real headless Chromium (docs/operations.md §9).

A real daemon over a real socket on the embedded simulated backend, with batch jobs on and
tenant weights configured: agents of three tenants (``X-Agentd-Tenant``) take turns that end in a
tool call (the simulator's ``sim_finish_reason`` / ``sim_tool_name`` hints), more of them at once
than the two small ranks hold (so some wait and are told an ETA), beside two batch jobs whose
requests stop naturally (``sim_output_tokens``: the jobs keep their decode statistics).  Once
everything has ended the page must render, from its polls, every job, tenant and tool name with
the numbers ``/scheduling/diagnostics`` reports, the time split bar and the queue ETA's accuracy.
Without the panels' script and payload none of this is on the page.  A second run takes a PNG
of the whole page under steady load; set ``AGENTD_UPDATE_DASHBOARD_SCREENSHOT=1`` to write it to
docs/images/dashboard-panels.png.  Helpers (the browser run, Chromium lookup) come from
``test_dashboard_browser``.
"""

from __future__ import annotations

import os
import re
import shutil
from html import unescape
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
from test_dash_panels_json import agent_turn as json_agent_turn
from test_dashboard_browser import browser, chromium, config

from actors.core.config import BatchJobsConfig
from daemon.supervisor import run_daemon

PANELS_SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "dashboard-panels.png"
TENANTS = ("acme", "globex", "initech")
TOOLS = ("read_file", "run_tests")
JOBS = ("eval-mmlu", "summarize-docs")


def panels_config() -> Any:
    cfg = config()
    return attrs.evolve(
        cfg,
        batch_jobs=BatchJobsConfig(enabled=True),
        priority=attrs.evolve(cfg.priority, tenant_weights={"acme": 3.0}),
    )


def agent_turn(program_id: str, tool: str) -> dict[str, Any]:
    return json_agent_turn(program_id, tool, words=120, max_tokens=24)  # ~300 estimated prompt tokens


def batch_request(i: int) -> dict[str, Any]:
    words = " ".join(f"b{i}-word{k}" for k in range(40))
    return {
        "model": "sim-model",
        "messages": [{"role": "user", "content": words}],
        "max_tokens": 64,
        "vllm_xargs": {"sim_output_tokens": 10 + i % 40},  # a natural stop: the job learns its decode length
    }


def row(dom: str, attr: str, value: str) -> str:
    found = re.search(rf'<tr {attr}="{re.escape(value)}">(.*?)</tr>', dom)
    assert found is not None, f"{attr}={value} missing from the page"
    return found.group(1)


def cells(html_row: str) -> list[str]:
    return [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", html_row)]


@pytest.mark.skipif(chromium() is None, reason="no chromium on PATH (scripts/test.sh installs it when run as root)")
async def test_dashboard_panels_render_jobs_tenants_tools_time_and_eta_in_chromium(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(run_daemon, panels_config())
        base = handles.http_url
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:

            async def agent(i: int) -> None:
                for turn in range(3):
                    r = await client.post(
                        "/v1/chat/completions",
                        json=agent_turn(f"panel-agent:{i}", TOOLS[(i + turn) % 2]),
                        headers={"x-agentd-tenant": TENANTS[i % 3]},
                    )
                    assert r.status_code == 200, r.text
                    assert r.json()["choices"][0]["finish_reason"] == "tool_calls"

            async def batch(i: int) -> None:
                r = await client.post(
                    "/v1/chat/completions",
                    json=batch_request(i),
                    headers={"x-request-id": f"dash-{i}#job_name[{JOBS[i % 2]}]#", "x-agentd-tenant": "batchco"},
                )
                assert r.status_code == 200, r.text

            async with trio.open_nursery() as load:
                for i in range(9):
                    load.start_soon(agent, i)
                for i in range(6):
                    load.start_soon(batch, i)
            # completions reach the scheduler after the responses: wait until nothing runs
            ps = handles.program_dispatcher
            await ps.wait_diagnostics(
                lambda d: d["in_flight_requests"] == 0 and d["retained_requests"] == 0 and d["batch"]["running"] == 0
            )
            before = (await client.get("/scheduling/diagnostics")).json()
            dom = unescape(await browser(f"{base}/dashboard", tmp_path, "--dump-dom"))
            after = (await client.get("/scheduling/diagnostics")).json()

            async def steady_agent(i: int) -> None:  # turns with short tool calls in between
                for turn in range(1_000):
                    await client.post(
                        "/v1/chat/completions",
                        json=agent_turn(f"panel-agent:{i}", TOOLS[(i + turn) % 2]),
                        headers={"x-agentd-tenant": TENANTS[i % 3]},
                    )
                    await trio.sleep(0.05 * (1 + i % 3))

            async def steady_batch(i: int) -> None:
                for k in range(1_000):
                    await batch(6 * k + i)

            async with trio.open_nursery() as load:  # the screenshot shows the daemon under load
                for i in range(8):
                    load.start_soon(steady_agent, i)
                for i in range(4):
                    load.start_soon(steady_batch, i)
                await trio.sleep(1.5)
                await browser(
                    f"{base}/dashboard", tmp_path, "--window-size=1400,2050", f"--screenshot={tmp_path / 'panels.png'}"
                )
                load.cancel_scope.cancel()
        handles.shutdown.set()

    assert re.search(r'data-polls="[1-9]', dom), dom[:3000]
    # Batch jobs: every job with its admitted / completed counts and its decode lengths
    assert {j["job"] for j in after["batch"]["jobs"]} == set(JOBS)
    for job in after["batch"]["jobs"]:
        shown = cells(row(dom, "data-job", job["job"]))
        assert shown[0] == job["job"]
        assert shown[3] == "3 / 3" and job["admitted"] == job["completed"] == 3
        predicted, observed = shown[5].split(" / ")
        assert int(predicted) == job["predicted_decode_tokens"] > 0
        assert int(observed) == round(job["observed_decode_tokens_mean"]) > 0
    assert "starvation escapes <b>0</b>" in dom
    # Classes and tenants: the three agent tenants and the batch one, the weights configured
    tenants = {t["tenant"]: t for t in after["priority"]["tenants"]}
    assert set(tenants) == {*TENANTS, "batchco"}
    for name, t in tenants.items():
        shown = cells(row(dom, "data-tenant", name))
        weight = "3.00 (50.0%)" if name == "acme" else "1.00 (16.7%)"  # 3 / (3 + 1 + 1 + 1)
        assert shown[1] == weight
        assert re.fullmatch(r"\d+\.\d%", shown[2]) and shown[2] != "0.0%"
        assert shown[5] == f"{t['dispatched_requests']:,}" and t["dispatched_requests"] > 0
        assert shown[6] == f"{round(t['counter']):,}" and t["counter"] > 0
    for cls in ("interactive", "agent", "batch"):
        row(dom, "data-class", cls)
    assert cells(row(dom, "data-class", "agent"))[4] == "27"  # 9 agents x 3 turns admitted
    assert cells(row(dom, "data-class", "batch"))[4] == "6"
    # Tools: both tool names, with the gaps learned between turns
    tools = {t["tool"]: t for t in after["tools"]}
    assert set(tools) == set(TOOLS)
    for name, t in tools.items():
        shown = cells(row(dom, "data-tool", name))
        assert shown[2] == f"{t['samples']} / {t['observed']}" and t["samples"] > 0
        assert re.fullmatch(r"[\d.]+ s · [\d.]+ s · [\d.]+ s", shown[3]), shown[3]
    # Where the time goes: the stacked bar and its legend; the longest live Programs
    split = after["time_split"]
    assert split["programs_seen"] == 9 and split["completions"] == 27
    assert "9 Programs · 27 completions since start" in dom
    for part in ("queue", "prefill", "between_turns"):
        assert f'data-part="{part}"' in dom
    assert re.search(r'<div class="stack "><span class="t-', dom)
    assert dom.count("data-time-program=") == 5
    # Queue ETA: Programs waited (more agents than the ranks hold) and the accuracy is shown
    eta = after["queue_eta"]
    assert eta["samples_count"] > 0 and eta["samples_count"] == before["queue_eta"]["samples_count"]
    assert f"accuracy samples <b>{eta['samples_count']:,} (" in dom
    assert re.search(r"median relative error <b>\d+\.\d%</b>", dom)
    # the Program table's tenant column
    for p in (p for r in after["ranks"] for p in r["programs"]):
        assert cells(row(dom, "data-program", p["program"]))[2] == p["tenant"]

    shot = tmp_path / "panels.png"
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000
    if os.environ.get("AGENTD_UPDATE_DASHBOARD_SCREENSHOT") == "1":
        PANELS_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, PANELS_SCREENSHOT)
