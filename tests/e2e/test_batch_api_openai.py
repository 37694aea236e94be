"""The official ``openai`` client's file and batch calls against a real-socket daemon (docs/batch.md §4).

The daemon runs in process on port 0 in front of the embedded simulated backend; the client is the
synchronous ``openai.OpenAI``, driven from a worker thread (``trio.to_thread.run_sync``) so the
daemon keeps running on the Trio thread.  Polling is real time, bounded by a deadline.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import openai
import pytest
import trio

from daemon.config import AgentdConfig, BatchApiConfig, EmbeddedConfig, RoutingConfig, ServerConfig
from daemon.supervisor import run_daemon

DEADLINE_SECONDS = 120.0
LINES = 20


def config(db: Path) -> AgentdConfig:
    return AgentdConfig(
        server=ServerConfig(port=0),
        routing=RoutingConfig(policy="round_robin"),
        embedded=EmbeddedConfig(dp_size=2, num_gpu_blocks=256, time_scale=50.0, model="sim-model"),
        batch_api=BatchApiConfig(database_path=str(db), concurrency=8),
    )


def input_file() -> bytes:
    lines = []
    for i in range(LINES):
        body = {"model": "sim-model", "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 4}
        lines.append(json.dumps({"custom_id": f"q-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}))
    lines.append("this line is not JSON")
    return ("\n".join(lines) + "\n").encode()


def create_with_openai(base_url: str) -> str:
    """Upload and create with the official client (synchronous: runs on a worker thread)."""
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=60.0)
    uploaded = client.files.create(file=("questions.jsonl", input_file()), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(input_file())
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"suite": "e2e"},
    )
    assert batch.status == "validating" and batch.metadata == {"suite": "e2e"}
    assert uploaded.id in [f.id for f in client.files.list(purpose="batch")]
    return batch.id


def collect_with_openai(base_url: str, batch_id: str) -> dict[str, Any]:
    """Poll once (the batch has settled), download the files, check the errors (worker thread)."""
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=60.0)
    batch = client.batches.retrieve(batch_id)
    assert batch.output_file_id is not None and batch.error_file_id is not None
    output = client.files.content(batch.output_file_id).text
    errors = client.files.content(batch.error_file_id).text
    listed = [b.id for b in client.batches.list(limit=10)]
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_unknown")
    with pytest.raises(openai.BadRequestError) as bad:
        client.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")
    assert bad.value.body is not None and bad.value.body["param"] == "purpose"  # type: ignore[index]
    return {"batch": batch, "output": output, "errors": errors, "listed": listed}


async def test_batch_api_openai_client_upload_create_poll_download(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(partial(run_daemon, config(tmp_path / "batches.sqlite3")))
        assert handles.http_url is not None
        batch_id = await trio.to_thread.run_sync(create_with_openai, handles.http_url)
        assert handles.batches is not None
        with trio.fail_after(DEADLINE_SECONDS):  # real time: the daemon serves over real sockets
            await handles.batches.wait_settled(batch_id)  # woken by the executor, no polling
        result = await trio.to_thread.run_sync(collect_with_openai, handles.http_url, batch_id)
        handles.request_shutdown()
    batch = result["batch"]
    assert batch.status == "completed"
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (
        LINES + 1,
        LINES,
        1,
    )
    records = [json.loads(line) for line in result["output"].splitlines()]
    assert [r["custom_id"] for r in records] == [f"q-{i}" for i in range(LINES)]  # one line per custom_id
    for record in records:
        assert record["error"] is None and record["response"]["status_code"] == 200
        assert record["response"]["body"]["usage"]["completion_tokens"] == 4
    [error] = [json.loads(line) for line in result["errors"].splitlines()]
    assert error["error"]["message"].startswith(f"line {LINES + 1}: not valid JSON")
    assert result["listed"] == [batch.id]
