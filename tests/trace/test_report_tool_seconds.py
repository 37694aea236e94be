"""The bench report's per-tool section is in trace seconds, like every other duration of the report
(docs/traces.md, "Durations are in trace seconds"; docs/program-scheduling.md §12, "Diagnostics").

A router's ``/scheduling/diagnostics`` measures the gaps after each tool on its own clock; a run at
``--time-scale 4`` sees every trace gap four times shorter, so the report multiplies the section's
durations back, as it does for the server's time split.
"""

from __future__ import annotations

import io
import json

import httpx
from trace_fake_worker import FakeWorker

from bench.replay import ReplayOptions
from bench.report import TOOL_SECONDS_FIELDS, measured_replay, tool_section
from bench.trace.format import read_trace

URL = "http://worker"

ROW = {
    "model_pool": "default",
    "tool": "web_fetch",
    "samples": 9,
    "observed": 11,
    "gap_p50_seconds": 0.5,
    "gap_p90_seconds": 0.75,
    "gap_p99_seconds": 1.25,
    "decides": True,
    "held": 2,
    "released": 3,
    "fallbacks": 8,
    "last_ttl_seconds": 0.625,
    "recomputed_tokens": 300,
    "recompute_seconds": 0.25,
    "resume_miss_ratio": 0.5,
}
UNLEARNED = {**ROW, "tool": "grep", "gap_p50_seconds": None, "last_ttl_seconds": None}


def test_tool_section_durations_are_scaled_to_trace_seconds() -> None:
    [row, unlearned] = tool_section({"tools": [ROW, UNLEARNED]}, 4.0) or []
    assert {k: row[k] for k in TOOL_SECONDS_FIELDS} == {
        "gap_p50_seconds": 2.0,
        "gap_p90_seconds": 3.0,
        "gap_p99_seconds": 5.0,
        "last_ttl_seconds": 2.5,
        "recompute_seconds": 1.0,
    }
    # counts, ratios and names are not durations
    assert {k: row[k] for k in ROW if k not in TOOL_SECONDS_FIELDS} == {
        k: v for k, v in ROW.items() if k not in TOOL_SECONDS_FIELDS
    }
    assert unlearned["gap_p50_seconds"] is None and unlearned["last_ttl_seconds"] is None
    assert ROW["gap_p50_seconds"] == 0.5  # the diagnostics document is not changed
    assert tool_section({"tools": [ROW]}) == [ROW]  # time scale 1: the values as measured
    assert tool_section({"tools": []}, 4.0) is None and tool_section(None, 4.0) is None


async def test_measured_replay_reports_the_routers_tool_gaps_in_trace_seconds(autojump_clock) -> None:
    worker = FakeWorker()

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/scheduling/diagnostics":  # what agentd measured at time scale 4
            return httpx.Response(200, json={"tools": [ROW], "queue_eta": {"samples_count": 0}})
        return await worker.handler(request)

    line = {"session_id": "a", "turn": 0, "input_delta": 10, "output_length": 5, "pre_gap_ms": 0, "role": "user"}
    trace = read_trace(io.StringIO(json.dumps(line) + "\n"))
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        report = await measured_replay(
            trace, client, URL, ReplayOptions(time_scale=4.0), worker_metrics=[], router_metrics=[]
        )
    [tool] = report["scheduling"]["tools"]
    assert tool["tool"] == "web_fetch" and tool["samples"] == 9
    assert (tool["gap_p50_seconds"], tool["gap_p90_seconds"], tool["last_ttl_seconds"]) == (2.0, 3.0, 2.5)
