"""Every field of ``/scheduling/diagnostics`` and ``/scheduling/dashboard.json`` is documented, and
every documented field exists (docs/operations.md §15, "Diagnostics reference").

The payloads come from daemons run in process under ``autojump_clock`` in the states an operator
sees: Program scheduling off behind agentd's own upstream transport (idle, its worker unreachable);
Program scheduling on in front of a fake worker (``httpx.MockTransport``, two ranks, one active
Program per rank) before the first request, after Programs of two tenants called tools (gap
windows, the time split, paused Programs), and with a Program held in flight while others are
queued, batch requests of a job and an interactive request of a third tenant wait or run; and the
``data_plane`` section of two relays connected to the scheduler's hub over socket pairs (the relay
side is what a relay process runs, faked at the process boundary only).  Each key path (lists as
``[]``, maps keyed by ids or labels as ``<class>``, ``<tenant>``, ``<cause>``,
``configuration.<key>``) is collected and compared with the paths the reference's tables name,
both ways.
"""

from __future__ import annotations

import json
import re
import socket
import sys
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio
import trio.testing
from native_fakes import make_config
from test_program_scheduling import ProgramWorker, configured_daemon, in_process_client, program_config

from actors.core.config import BatchJobsConfig, ToolRetentionConfig
from daemon.config import PrioritySection
from daemon.dataplane.processes import DataPlane
from daemon.supervisor import run_daemon

ROOT = Path(__file__).resolve().parents[2]
for helpers in ("actors", "faults", "dataplane"):  # the relay fixtures of tests/dataplane
    if str(ROOT / "tests" / helpers) not in sys.path:
        sys.path.append(str(ROOT / "tests" / helpers))
DOC = ROOT / "docs" / "operations.md"
SECTION = "## 15. Diagnostics reference"
USAGE = {"prompt_tokens": 40, "completion_tokens": 5, "total_tokens": 45, "prompt_tokens_details": {"cached_tokens": 0}}

# maps whose keys are ids or labels, not field names: (path of the map, placeholder of its keys)
KEYED_MAPS = {
    "fairness.classes": "<class>",
    "fairness.tenants": "<tenant>",
    "fairness.scheduler": "<tenant>",
    "time_split.recomputed_tokens_by_cause": "<cause>",
    "time_split.recompute_seconds_by_cause": "<cause>",
    "time_split.top_programs[].recomputed_tokens_by_cause": "<cause>",
    "time_split.top_programs[].recompute_seconds_by_cause": "<cause>",
}


def key_paths(value: Any, prefix: str = "", out: set[str] | None = None) -> set[str]:
    """The normalised key path of every key in ``value`` (a JSON document)."""
    out = set() if out is None else out
    if isinstance(value, dict):
        placeholder = KEYED_MAPS.get(prefix)
        for key, item in value.items():
            if prefix == "configuration":
                # the [program_scheduling] keys, nested tables included: documented in docs/config.md
                out.add(f"{prefix}.<key>")
                continue
            path = f"{prefix}.{placeholder or key}" if prefix else key
            out.add(path)
            key_paths(item, path, out)
    elif isinstance(value, list):
        for item in value:
            key_paths(item, f"{prefix}[]", out)
    return out


def documented_paths() -> dict[str, set[str]]:
    """The key paths the reference's tables name, by endpoint: the backticked names of each table
    row's first cell; a table under a heading naming ``dashboard.json`` is that endpoint's."""
    text = DOC.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    out: dict[str, set[str]] = {"diagnostics": set(), "dashboard": set()}
    endpoint = "diagnostics"
    for line in text[start : end if end != -1 else None].splitlines():
        if line.startswith("###"):
            endpoint = "dashboard" if "dashboard.json" in line else "diagnostics"
        elif line.startswith("| `"):
            first = line.split("|")[1]
            out[endpoint].update(re.findall(r"`([^`]+)`", first))
    return out


# ------------------------------------------------------------------------------- the payloads


class ToolWorker(ProgramWorker):
    """The Program worker; a chat request with a ``walk_tools`` list is answered with calls to them."""

    async def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/health", "/metrics"):
            return await super().handler(request)
        body = json.loads(await request.aread())
        names: list[str] = body.pop("walk_tools", [])
        if not names:
            plain = httpx.Request(request.method, request.url, headers=request.headers, json=body)
            return await super().handler(plain)
        name = body["messages"][-1]["content"]
        self.arrival(name).set()
        calls = [
            {"index": i, "id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": "{}"}}
            for i, n in enumerate(names)
        ]
        choice = {"index": 0, "message": {"role": "assistant", "tool_calls": calls}, "finish_reason": "tool_calls"}
        return httpx.Response(200, json={"id": "c", "object": "chat.completion", "choices": [choice], "usage": USAGE})


def turn(name: str, program_id: str | None, tools: tuple[str, ...] = ()) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": name}], "walk_tools": list(tools)}
    if program_id is not None:
        body["vllm_xargs"] = {"agentic_context": {"program_id": program_id, "task_id": f"task-{program_id}"}}
    return body


async def scheduling_off_payloads() -> list[tuple[str, dict[str, Any]]]:
    """Program scheduling off, agentd's own pooled transport, the worker unreachable (idle)."""
    cfg = make_config(("http://127.0.0.1:21999",))
    out = []
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(lambda task_status: run_daemon(cfg, serve_http=False, task_status=task_status))
        try:
            async with in_process_client(handles) as client:
                out.append(("diagnostics", (await client.get("/scheduling/diagnostics")).json()))
                out.append(("dashboard", (await client.get("/scheduling/dashboard.json")).json()))
        finally:
            handles.shutdown.set()
    return out


async def scheduling_on_payloads() -> list[tuple[str, dict[str, Any]]]:
    worker = ToolWorker(urls=("http://w0:8000", "http://w1:8000"))
    cfg = program_config(
        worker,
        token_capacity_per_dp_rank=400,
        max_active_programs_per_target=1,
        metrics_interval_seconds=0.25,
        tool_retention=ToolRetentionConfig(min_samples=2),
    )
    cfg = attrs.evolve(
        cfg, batch_jobs=BatchJobsConfig(enabled=True), priority=PrioritySection(interactive_scheduling=True)
    )
    out: list[tuple[str, dict[str, Any]]] = []
    async with configured_daemon(worker, cfg) as (handles, client):

        async def snap() -> None:
            out.append(("diagnostics", (await client.get("/scheduling/diagnostics")).json()))
            for query in ("", "?state=queued&sort=waiting"):
                out.append(("dashboard", (await client.get(f"/scheduling/dashboard.json{query}")).json()))

        await snap()  # before the first request: no Program, no backend observation yet
        for k in range(4):  # two Programs calling tools, turns 0.5 s apart (their gap windows fill)
            for pid, tenant in (("a", "alice"), ("b", "bob")):
                r = await client.post(
                    "/v1/chat/completions",
                    json=turn(f"{pid}{k}", pid, ("grep", "ls")),
                    headers={"x-agentd-tenant": tenant},
                )
                assert r.status_code == 200, r.text
            await trio.sleep(0.5)
        await snap()

        async with trio.open_nursery() as nursery:

            async def post(body: dict[str, Any], headers: dict[str, str]) -> None:
                await client.post("/v1/chat/completions", json=body, headers=headers)

            for name in ("held1", "held2"):  # one Program in flight per rank, the others queued
                worker.hold(name)
                nursery.start_soon(post, turn(name, name), {})
            await worker.arrival("held1").wait()
            for pid in ("q1", "q2"):
                nursery.start_soon(post, turn(pid, pid), {})
            for i in range(2):  # batch requests of one job, and an interactive request
                nursery.start_soon(post, turn(f"batch{i}", None), {"x-request-id": f"r{i}#job_name[eval]#"})
            nursery.start_soon(post, turn("quick", None), {"x-agentd-tenant": "carol"})
            await trio.sleep(1.0)
            await snap()
            assert out[-3][1]["retained_requests"] >= 2, out[-3][1]["retained_requests"]
            worker.release("held1")
            worker.release("held2")
        await trio.sleep(1.0)
        await snap()
    return out


async def data_plane_payload() -> dict[str, Any]:
    """The ``data_plane`` section of two relays connected to the hub (a lease through each)."""
    from program_fakes import daemon_config, ok, program_request
    from test_remote_dispatch import _connected, plane

    cfg = daemon_config(token_capacity_per_dp_rank=10_000)
    async with plane(cfg) as p:
        targets = cfg.targets()
        async with _connected(targets, p.board, p.dispatcher, hub=p.hub, index=1, reports=True) as second:
            for relay in (p, second):
                async with relay.remote.lease(program_request(f"via{relay.conn.index}")) as lease:
                    lease.finish(ok())
            await trio.sleep(1.0)  # the reports arrive and are compared
            with socket.socket() as sock:
                data_plane = DataPlane(cfg, 2, p.hub, sock, "http://127.0.0.1:21998")
                try:
                    for slot, relay in zip(data_plane.slots, (p, second), strict=True):
                        slot.connection = relay.conn
                    return {"data_plane": data_plane.diagnostics()}
                finally:
                    data_plane.board.close()


def implied(documented: set[str]) -> set[str]:
    """The documented paths and every object or list they are inside (``a.b[].c`` implies ``a`` and
    ``a.b``): a container needs no row of its own."""
    out = set(documented)
    for path in documented:
        for cut in re.finditer(r"\.|\[\]", path):
            out.add(path[: cut.start()])
    return out


def configuration_keys(value: Any) -> set[str]:
    """Every key of the ``configuration`` summary, nested tables included."""
    out: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            out.add(key)
            out |= configuration_keys(item)
    return out


async def produced_paths() -> tuple[dict[str, set[str]], set[str]]:
    """The key paths of every payload, by endpoint, and the configuration summary's keys."""
    payloads = await scheduling_off_payloads() + await scheduling_on_payloads()
    payloads.append(("diagnostics", await data_plane_payload()))
    produced: dict[str, set[str]] = {"diagnostics": set(), "dashboard": set()}
    config: set[str] = set()
    for endpoint, doc in payloads:
        key_paths(doc, "", produced[endpoint])
        if endpoint == "diagnostics":
            config |= configuration_keys(doc.get("configuration"))
    return produced, config


async def test_every_field_is_documented_and_every_documented_field_exists(
    autojump_clock: trio.testing.MockClock,
) -> None:
    produced, config = await produced_paths()
    documented = documented_paths()
    for endpoint in ("diagnostics", "dashboard"):
        undocumented = sorted(produced[endpoint] - implied(documented[endpoint]))
        assert not undocumented, f"{endpoint}: fields missing from docs/operations.md §15: {undocumented}"
        stale = sorted(documented[endpoint] - produced[endpoint])
        assert not stale, f"{endpoint}: documented in docs/operations.md §15 but in no payload: {stale}"
    # configuration.<key>: each key of the summary is a [program_scheduling] key docs/config.md names
    config_doc = (ROOT / "docs" / "config.md").read_text()
    unnamed = sorted(k for k in config if f"`{k}`" not in config_doc and not re.search(rf"\b{k}\b", config_doc))
    assert not unnamed, f"configuration keys docs/config.md does not name: {unnamed}"
