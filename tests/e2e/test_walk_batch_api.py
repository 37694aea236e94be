"""What a new user's walk found in the Batch API (session 25): a database that cannot be opened
is a 503 naming ``batch_api.database_path``, not a 500 ``internal_error`` on every call.
``agentd start`` refuses such a path up front (tests/e2e/test_walk_start.py); this is what is left
when the path goes bad after the start.  The daemon runs in process (embedded backend), the
requests go through its ASGI app."""

from __future__ import annotations

import random
from functools import partial
from pathlib import Path

import httpx
import trio

from daemon.config_loading import config_from_dict
from daemon.handles import DaemonHandles
from daemon.http.app import create_app
from daemon.supervisor import run_daemon


async def test_a_batch_database_that_cannot_be_opened_is_a_503_naming_the_field(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    db = blocker / "batches.sqlite3"
    cfg = config_from_dict({"server": {"port": 0}, "batch_api": {"database_path": str(db)}})
    async with trio.open_nursery() as nursery:
        handles: DaemonHandles = await nursery.start(
            partial(run_daemon, cfg, serve_http=False, batch_executor=True, rng=random.Random(0))
        )
        # the directory goes bad after the start (it holds only the lock file, daemon/batch_lock.py)
        (blocker / "batches.sqlite3.lock").unlink()
        blocker.rmdir()
        blocker.write_text("a file where the database's directory should be")
        transport = httpx.ASGITransport(app=create_app(handles))
        async with httpx.AsyncClient(transport=transport, base_url="http://agentd") as client:
            for response in (
                await client.get("/v1/batches"),
                await client.post("/v1/files", files={"file": ("in.jsonl", b"{}\n")}, data={"purpose": "batch"}),
            ):
                assert response.status_code == 503, response.text
                error = response.json()["error"]
                assert error["code"] == "batch_database_unavailable" and error["type"] == "server_error"
                assert error["message"].startswith(
                    f"the Batch API's database cannot be opened (batch_api.database_path {str(db)!r}: "
                )
            assert (await client.get("/health")).status_code == 200  # the daemon itself is fine
        handles.request_shutdown()
    assert blocker.read_text().startswith("a file")


async def test_unknown_batch_fields_and_list_parameters_are_400s_naming_them(tmp_path: Path) -> None:
    """``POST /v1/batches`` dropped unknown fields (a misspelt ``metdata`` lost the metadata) and
    the lists ignored unknown query parameters (``order=asc`` seemed to work): OpenAI answers 400
    "Unrecognized request argument supplied: X"; so does agentd, naming X in ``param``."""
    cfg = config_from_dict({"server": {"port": 0}, "batch_api": {"database_path": str(tmp_path / "b.sqlite3")}})
    async with trio.open_nursery() as nursery:
        handles: DaemonHandles = await nursery.start(
            partial(run_daemon, cfg, serve_http=False, batch_executor=True, rng=random.Random(0))
        )
        transport = httpx.ASGITransport(app=create_app(handles))
        async with httpx.AsyncClient(transport=transport, base_url="http://agentd") as client:
            line = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}\n'
            upload = await client.post("/v1/files", files={"file": ("in.jsonl", line)}, data={"purpose": "batch"})
            assert upload.status_code == 200, upload.text
            create = {"input_file_id": upload.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"}

            async def rejected(response: httpx.Response, name: str, accepted: str, what: str) -> None:
                assert response.status_code == 400, response.text
                assert response.json()["error"] == {
                    "message": f"Unrecognized {what} supplied: {name} (accepted: {accepted})",
                    "type": "invalid_request_error",
                    "param": name,
                    "code": "unknown_parameter",
                }

            fields = "input_file_id, endpoint, completion_window, metadata"
            await rejected(
                await client.post("/v1/batches", json={**create, "metdata": {"k": "v"}}),
                "metdata",
                fields,
                "request argument",
            )
            await rejected(
                await client.post("/v1/batches", json={**create, "output_expires_after": {"anchor": "created_at"}}),
                "output_expires_after",
                fields,
                "request argument",
            )
            await rejected(
                await client.get("/v1/batches?limit=5&order=asc"), "order", "limit, after", "query parameter"
            )
            await rejected(
                await client.get("/v1/files?before=file-x"), "before", "purpose, limit, after, order", "query parameter"
            )
            assert (await client.get("/v1/batches")).json()["data"] == []  # nothing was created
            made = await client.post("/v1/batches", json={**create, "metadata": {"k": "v"}})
            assert made.status_code == 200 and made.json()["metadata"] == {"k": "v"}, made.text
            listed = await client.get("/v1/batches", params={"limit": "5"})
            assert [b["id"] for b in listed.json()["data"]] == [made.json()["id"]]
            assert (await client.get("/v1/files", params={"purpose": "batch", "limit": "3"})).status_code == 200
        handles.request_shutdown()
