"""The embedded simulated workers serve ``[embedded] model`` (docs/operations.md §12, "Model
pools").  Before session 34 agentd counted them as serving any model: a request for another model
was admitted as Program work, then refused by the simulated worker with its own 404 shape (a
number for ``code``), and counted as a failed request.  Now agentd refuses it first, with its
``model_not_found`` error naming the field, before anything is scheduled."""

from __future__ import annotations

from functools import partial

import trio
from test_program_scheduling import VIRTUAL_BUDGET_SECONDS, in_process_client
from test_program_sim import deterministic, sim_config

from daemon.supervisor import run_daemon

CONTEXT = {"vllm_xargs": {"agentic_context": {"program_id": "walk34:lead", "task_id": "walk34"}}}


async def test_a_model_the_embedded_workers_do_not_serve_is_refused_before_scheduling(
    autojump_clock: trio.abc.Clock,
) -> None:
    cfg = sim_config()
    served = cfg.embedded.model
    with trio.fail_after(VIRTUAL_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, cfg, serve_http=False, sim_configure=deterministic))
            async with in_process_client(handles) as client:
                messages = [{"role": "user", "content": "hi"}]
                for path, body in (
                    ("/v1/chat/completions", {"model": "nope", "messages": messages, **CONTEXT}),
                    ("/v1/chat/completions", {"model": "nope", "messages": messages}),
                    ("/v1/completions", {"model": "nope", "prompt": "hi", **CONTEXT}),
                    ("/v1/embeddings", {"model": "nope", "input": "hi"}),
                ):
                    refused = await client.post(path, json=body)
                    assert refused.status_code == 404, (path, refused.text)
                    error = refused.json()["error"]
                    assert (error["code"], error["param"], error["type"]) == (
                        "model_not_found",
                        "model",
                        "invalid_request_error",
                    )
                    assert served in error["message"]  # it names the model that is served
                diag = (await client.get("/scheduling/diagnostics")).json()
                known = {"worker_url": "http://embedded-sim", "models": [served], "source": "config"}
                assert diag["proxy"]["models"] == [known]
                assert diag["dispatcher"]["admitted_count"] == 0 and diag["dispatcher"]["completed_count"] == 0
                ok = await client.post("/v1/chat/completions", json={"model": served, "messages": messages, **CONTEXT})
                assert ok.status_code == 200, ok.text
                unnamed = await client.post("/v1/chat/completions", json={"messages": messages, **CONTEXT})
                assert unnamed.status_code == 200, unnamed.text  # no model: the served one, as vLLM
            handles.request_shutdown()
            nursery.cancel_scope.cancel()
