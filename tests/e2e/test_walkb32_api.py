"""The Batch API walked with the official ``openai`` client in session 32 (docs/batch.md §4).

``client.files.list(limit=2)`` answered two files and ``has_more: false`` whatever the number
stored, and ``after`` (the cursor the client sends for the next page) was a 400: iterating the
list, as the client does page after page, silently stopped at the first page.  The files list is
now a cursor page like the batches list (``after``, ``order``, ``has_more``, ``first_id``,
``last_id``), and a file deleted while paging still works as the cursor.  A batch's
``input_file_id`` of the wrong type is ``invalid_type`` (it was ``missing_field``).

A real-socket daemon in process (port 0, the embedded simulator); the synchronous client runs on a
worker thread so the daemon keeps serving on the Trio thread.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import openai
import pytest
import trio

from daemon.config import AgentdConfig, BatchApiConfig, EmbeddedConfig, RoutingConfig, ServerConfig
from daemon.supervisor import run_daemon

FILES = 5


def config(db: Path) -> AgentdConfig:
    return AgentdConfig(
        server=ServerConfig(port=0),
        routing=RoutingConfig(policy="round_robin"),
        embedded=EmbeddedConfig(dp_size=1, num_gpu_blocks=256, time_scale=50.0, model="sim-model"),
        batch_api=BatchApiConfig(database_path=str(db)),
    )


async def with_client(tmp_path: Path, use: Callable[[openai.OpenAI], Any]) -> Any:
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(partial(run_daemon, config(tmp_path / "batches.sqlite3")))
        assert handles.http_url is not None
        client = openai.OpenAI(base_url=handles.http_url + "/v1", api_key="unused", max_retries=0, timeout=60.0)
        try:
            with trio.fail_after(120):  # real sockets: generous
                return await trio.to_thread.run_sync(use, client)
        finally:
            client.close()
            handles.request_shutdown()


def upload(client: openai.OpenAI) -> list[str]:
    """FILES uploads, oldest first."""
    line = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    return [client.files.create(file=(f"f{i}.jsonl", line), purpose="batch").id for i in range(FILES)]


async def test_the_files_list_pages_through_every_file(tmp_path: Path) -> None:
    def use(client: openai.OpenAI) -> dict[str, Any]:
        ids = upload(client)
        first = client.files.list(limit=2)
        return {
            "ids": ids,
            "first": ([f.id for f in first.data], first.has_more),
            "all": [f.id for f in client.files.list(limit=2)],  # the client follows the cursor
            "asc": [f.id for f in client.files.list(limit=3, order="asc")],
            "raw": client.get("/files", cast_to=object, options={"params": {"limit": 2, "after": ids[3]}}),
        }

    got = await with_client(tmp_path, use)
    newest_first = got["ids"][::-1]
    assert got["first"] == (newest_first[:2], True)
    assert got["all"] == newest_first
    assert got["asc"] == got["ids"]
    assert got["raw"]["data"][0]["id"] == got["ids"][2]
    assert (got["raw"]["first_id"], got["raw"]["last_id"], got["raw"]["has_more"]) == (
        got["ids"][2],
        got["ids"][1],
        True,
    )


async def test_deleting_each_file_of_a_page_while_listing_deletes_them_all(tmp_path: Path) -> None:
    def use(client: openai.OpenAI) -> tuple[list[str], list[str]]:
        upload(client)
        deleted = []
        for file in client.files.list(limit=2):  # the next page's cursor is a file deleted meanwhile
            assert client.files.delete(file.id).deleted
            deleted.append(file.id)
        return deleted, [f.id for f in client.files.list()]

    deleted, left = await with_client(tmp_path, use)
    assert (len(deleted), left) == (FILES, [])


async def test_bad_files_list_arguments_are_400s_naming_them(tmp_path: Path) -> None:
    def use(client: openai.OpenAI) -> list[tuple[Any, ...]]:
        out = []
        for params in ({"order": "newest"}, {"after": "file-unknown"}, {"after": "x" * 300}, {"limit": 0}):
            with pytest.raises(openai.BadRequestError) as bad:
                client.get("/files", cast_to=object, options={"params": params})
            body = bad.value.body
            assert isinstance(body, dict)
            out.append((body["param"], body["code"]))
        for fields in ({"input_file_id": 5}, {"input_file_id": ""}, {}):
            request = {"endpoint": "/v1/chat/completions", "completion_window": "24h", **fields}
            with pytest.raises(openai.BadRequestError) as bad:
                client.post("/batches", cast_to=object, body=request)
            body = bad.value.body
            assert isinstance(body, dict)
            out.append((body["param"], body["code"]))
        return out

    assert await with_client(tmp_path, use) == [
        ("order", "invalid_value"),
        ("after", "invalid_value"),
        ("after", "invalid_value"),
        ("limit", "invalid_value"),
        ("input_file_id", "invalid_type"),  # was "missing_field" for a number
        ("input_file_id", "missing_field"),
        ("input_file_id", "missing_field"),
    ]
