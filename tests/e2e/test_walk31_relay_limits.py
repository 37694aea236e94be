"""The edge's refusals on ``/metrics`` with relay processes (session 31 walk, docs/operations.md §10.3).

With ``[server] data_plane_processes = 2`` each relay applies ``[limits]`` itself, and its
counters (``admitted``, ``refused_queue_full`` ...) lived only in its own diagnostics, which no
route serves: the scheduler's ``/scheduling/diagnostics`` ``proxy.edge`` stayed at zero while the
relays answered 429 ``too_many_requests``, and ``/metrics`` had no series for it.  Every process
now exports its edge and connection counters, summed over the relays like the other relay-side
metrics.  Real processes: one slow ``agentd sim-backend`` and ``agentd start`` with two relays,
each capped at one request in flight and none queued.
"""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families
from test_program_process import _start, _stop

BODY = {"model": "sim-model", "messages": [{"role": "user", "content": "hold the slot"}], "max_tokens": 24}


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


async def test_every_relays_edge_refusals_add_up_on_metrics(tmp_path: Path) -> None:
    procs: list[trio.Process] = []
    try:
        # 1/20 of real time: a 24-token answer takes about 5 s, so concurrent ones overlap
        worker = await _start(
            [
                sys.executable,
                "-m",
                "daemon",
                "sim-backend",
                "--port",
                "0",
                "--time-scale",
                "0.05",
                "--model",
                "sim-model",
            ],
            "agentd sim-backend listening on",
            procs,
        )
        config = tmp_path / "agentd.toml"
        config.write_text(
            f'[server]\nport = 0\ndata_plane_processes = 2\nlog_level = "warning"\n'
            f'[routing]\nworker_urls = ["{worker}"]\n'
            "[limits]\nmax_in_flight_requests = 1\nmax_queued_requests = 0\n"
            f'[batch_api]\ndatabase_path = "{tmp_path / "batches.sqlite3"}"\n'
        )
        agentd = await _start(
            [sys.executable, "-m", "daemon", "start", "--config", str(config)], "agentd listening on", procs
        )
        statuses: list[int] = []

        async def one() -> None:
            async with httpx.AsyncClient(base_url=agentd, timeout=180) as client:  # a connection each
                statuses.append((await client.post("/v1/chat/completions", json=BODY)).status_code)

        with trio.fail_after(180):
            async with trio.open_nursery() as nursery:
                for _ in range(6):
                    nursery.start_soon(one)
        refused = statuses.count(429)
        assert sorted(set(statuses)) == [200, 429] and statuses.count(200) + refused == 6, statuses
        async with httpx.AsyncClient(base_url=agentd, timeout=30) as http:
            text = (await http.get("/metrics")).text
        assert samples(text, "agentd_edge_refused_requests_total")[(("reason", "queue_full"),)] == refused
        assert samples(text, "agentd_edge_admitted_requests_total")[()] == 6 - refused
        assert samples(text, "agentd_edge_in_flight_requests")[()] == 0
        assert samples(text, "agentd_connections_rejected_total")[()] == 0
    finally:
        codes = [await _stop(p) for p in reversed(procs)]
    assert codes == [0, 0]
