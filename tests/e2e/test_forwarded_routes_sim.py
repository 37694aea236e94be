"""vLLM's other routes through agentd in front of the embedded simulated backend (docs/operations.md
§12.1, docs/simulator.md §3): the quick start answers ``/v1/embeddings`` and ``/tokenize``."""

from __future__ import annotations

import json
from functools import partial

import trio
from test_program_scheduling import VIRTUAL_BUDGET_SECONDS, in_process_client
from test_program_sim import deterministic, sim_config

from daemon.supervisor import run_daemon


async def test_the_embedded_backend_answers_embeddings_and_tokenize(autojump_clock: trio.abc.Clock) -> None:
    cfg = sim_config()
    with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, cfg, serve_http=False, sim_configure=deterministic))
            async with in_process_client(handles) as client:
                response = await client.post("/v1/embeddings", json={"model": "sim-model", "input": ["a b", "a b c"]})
                assert response.status_code == 200, response.text
                doc = response.json()
                assert [d["index"] for d in doc["data"]] == [0, 1] and doc["object"] == "list"
                assert all(len(d["embedding"]) == 64 for d in doc["data"])
                assert doc["usage"]["prompt_tokens"] == doc["usage"]["total_tokens"] > 0
                tokens = (await client.post("/tokenize", json={"model": "sim-model", "prompt": "a b c"})).json()
                assert tokens["count"] == len(tokens["tokens"]) > 0
                unknown = await client.post("/v1/embeddings", json={"model": "other", "input": "x"})
                assert unknown.status_code == 404, unknown.text
                assert json.loads(unknown.text)["error"]["param"] == "model"
            handles.request_shutdown()
            nursery.cancel_scope.cancel()
