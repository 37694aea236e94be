"""``agentd batch``'s summary says why lines failed (found by the session-29 walk).

Run against an agentd with API keys and without ``--api-key``, every line failed with a 401 and the
summary said only ``3 lines: 0 ok, 3 failed``: the reason was in each output record.  It now names
the causes as ``agentd replay`` does (``3 failed (http_401/invalid_api_key: 3)``).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import httpx
import trio
import trio.testing

from daemon.batch_runner import BatchOptions, BatchRunner

WORKER = "http://w0:8000"


def _line(custom_id: str) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": custom_id}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})


def _answer(request: httpx.Request) -> httpx.Response:
    """The other side of the HTTP boundary: an answer chosen by the line's content."""
    content = json.loads(request.content)["messages"][0]["content"]
    if content.startswith("key"):
        error = {"message": "a valid API key is required", "type": "invalid_request_error", "code": "invalid_api_key"}
        return httpx.Response(401, json={"error": error})
    if content.startswith("model"):
        return httpx.Response(404, json={"error": {"message": "no such model", "code": 404}})
    if content.startswith("prose"):
        return httpx.Response(400, json={"error": {"message": "bad", "code": "not a token"}})
    if content.startswith("text"):
        return httpx.Response(500, text="Internal Server Error")
    usage = {"prompt_tokens": 3, "completion_tokens": 2}
    return httpx.Response(200, json={"choices": [{"message": {"content": "hi"}}], "usage": usage})


async def test_the_summary_names_each_cause_of_failure(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    inp = tmp_path / "in.jsonl"
    ids = ["ok-1", "key-1", "key-2", "model-1", "prose-1", "text-1", "ok-2"]
    inp.write_text("".join(_line(i) + "\n" for i in ids))
    async with httpx.AsyncClient(transport=httpx.MockTransport(_answer)) as client:
        opts = BatchOptions(inp, tmp_path / "out.jsonl", max_attempts=1)
        summary = await BatchRunner(opts, client, WORKER, stderr=io.StringIO(), is_tty=False).run()
    assert (summary.ok, summary.failed, summary.exit_code) == (2, 5, 1)
    assert summary.text().startswith(
        "7 lines: 2 ok, 5 failed (http_400: 1, http_401/invalid_api_key: 2, http_404: 1, http_500: 1), 0 malformed; "
    )


async def test_a_target_that_cannot_be_reached_is_named_as_such(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    inp = tmp_path / "in.jsonl"
    inp.write_text(_line("a") + "\n" + _line("b") + "\n")
    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
        opts = BatchOptions(inp, tmp_path / "out.jsonl", max_attempts=1)
        summary = await BatchRunner(opts, client, WORKER, stderr=io.StringIO(), is_tty=False).run()
    assert summary.text().startswith("2 lines: 0 ok, 2 failed (connection_error: 2), 0 malformed; ")
    # a line answered by an earlier run is not this run's failure
    async with httpx.AsyncClient(transport=httpx.MockTransport(_answer)) as client:
        summary = await BatchRunner(opts, client, WORKER, stderr=io.StringIO(), is_tty=False).run()
    assert summary.text().startswith(
        "2 lines: 0 ok, 0 failed, 0 malformed; "
        "2 already in the output (2 of them failed; --retry-failed sends them again)"
    )
