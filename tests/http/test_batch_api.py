"""The Batch API in process (docs/batch.md §4): OpenAI shapes, errors, limits, cancel, restart.

The daemon runs without sockets in front of a scripted worker (``httpx.MockTransport``); requests
reach the app through ``httpx.ASGITransport`` (so uploads are encoded by httpx's multipart encoder,
as the ``openai`` client's are).  Tests wait on the service's change events, never on a clock.
"""

from __future__ import annotations

import hashlib
import json
import random
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
from http_fakes import http_config

from daemon import batch_executor
from daemon.batch_executor import BatchService
from daemon.batch_store import SCHEMA_VERSION, BatchDatabase
from daemon.config import AgentdConfig, AuthConfig, BatchApiConfig
from daemon.handles import DaemonHandles
from daemon.http.app import create_app
from daemon.supervisor import run_daemon

ENDPOINT = "/v1/chat/completions"


class BatchWorker:
    """A worker answering chat requests; ``block(rid)`` decides which requests wait for ``release``."""

    def __init__(self, block: Callable[[str], bool] = lambda rid: False, fail_first: int = 0) -> None:
        self.block = block
        self.fail_first = fail_first  # answer this many requests with a 503 first
        self.release = trio.Event()
        self.blocked = 0
        self.blocked_changed = trio.Event()
        self.seen: list[httpx.Request] = []
        self.seen_changed = trio.Event()

    async def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        if request.url.path == "/v1/models":  # the daemon's start-up discovery: any model
            return httpx.Response(404)
        self.seen.append(request)
        self.seen_changed.set()
        self.seen_changed = trio.Event()
        body = json.loads(await request.aread())
        rid = request.headers.get("x-request-id", "")
        if self.fail_first > 0:
            self.fail_first -= 1
            return httpx.Response(503, json={"error": {"message": "busy"}})
        if self.block(rid):
            self.blocked += 1
            self.blocked_changed.set()
            self.blocked_changed = trio.Event()
            await self.release.wait()
        if body.get("model") == "nan":  # not JSON: kept as text in the record
            return httpx.Response(200, content=b'{"v": NaN}', headers={"content-type": "application/json"})
        if body.get("model") == "missing":
            return httpx.Response(404, json={"error": {"message": "model not found", "code": "model_not_found"}})
        text = body["messages"][0]["content"]
        return httpx.Response(
            200,
            json={"choices": [{"message": {"content": f"echo {text}"}}], "usage": {"prompt_tokens": 1}},
            headers={"x-request-id": rid},
        )

    def transport(self, cfg: AgentdConfig) -> httpx.AsyncBaseTransport:
        return httpx.MockTransport(self.handler)

    async def wait_blocked(self, n: int) -> None:
        while self.blocked < n:
            await self.blocked_changed.wait()

    def custom_ids(self) -> list[str]:
        return [r.headers["x-request-id"].split("#")[0] for r in self.seen]


@attrs.define
class Api:
    handles: DaemonHandles
    client: httpx.AsyncClient
    worker: BatchWorker

    @property
    def service(self) -> BatchService:
        assert self.handles.batches is not None
        return self.handles.batches

    async def upload(self, content: bytes, purpose: str = "batch") -> httpx.Response:
        return await self.client.post("/v1/files", data={"purpose": purpose}, files={"file": ("in.jsonl", content)})

    async def run_batch(self, lines: list[Any], **extra: Any) -> dict[str, Any]:
        upload = await self.upload(jsonl(lines))
        assert upload.status_code == 200, upload.text
        created = await self.client.post(
            "/v1/batches",
            json={"input_file_id": upload.json()["id"], "endpoint": ENDPOINT, "completion_window": "24h", **extra},
        )
        assert created.status_code == 200, created.text
        return dict(created.json())

    async def content(self, file_id: str) -> list[dict[str, Any]]:
        response = await self.client.get(f"/v1/files/{file_id}/content")
        assert response.status_code == 200
        return [json.loads(line) for line in response.content.splitlines()]


def line(custom_id: str, text: str = "hi", **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": ENDPOINT,
        "body": {"model": "m", "messages": [{"role": "user", "content": text}], **body},
    }


def jsonl(lines: list[Any]) -> bytes:
    return b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines)


def batch_config(db: Path, **batch_api: Any) -> AgentdConfig:
    return attrs.evolve(http_config(), batch_api=BatchApiConfig(database_path=str(db), **batch_api))


@asynccontextmanager
async def running(cfg: AgentdConfig, worker: BatchWorker) -> AsyncIterator[Api]:
    async with trio.open_nursery() as nursery:
        handles: DaemonHandles = await nursery.start(
            partial(
                run_daemon,
                cfg,
                transport_factory=worker.transport,
                serve_http=False,
                batch_executor=True,
                rng=random.Random(0),
            )
        )
        transport = httpx.ASGITransport(app=create_app(handles))
        async with httpx.AsyncClient(transport=transport, base_url="http://agentd") as client:
            yield Api(handles, client, worker)
        nursery.cancel_scope.cancel()  # like a kill: no graceful drain


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    async with running(batch_config(tmp_path / "b.sqlite3"), BatchWorker()) as api:
        yield api


def assert_error(response: httpx.Response, status: int, code: str, param: str | None) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["param"] == param, error
    assert error["type"] == "invalid_request_error"
    return str(error["message"])


async def test_batch_api_upload_create_complete_download(api: Api) -> None:
    upload = await api.upload(jsonl([line("a", "one"), line("b#job_name[mine]#", "two"), line("c", "three")]))
    assert upload.status_code == 200
    file = upload.json()
    assert file["object"] == "file" and file["purpose"] == "batch" and file["filename"] == "in.jsonl"
    assert file["bytes"] == len(jsonl([line("a", "one"), line("b#job_name[mine]#", "two"), line("c", "three")]))
    assert (await api.client.get(f"/v1/files/{file['id']}")).json() == file
    created = await api.client.post(
        "/v1/batches",
        json={"input_file_id": file["id"], "endpoint": ENDPOINT, "completion_window": "24h", "metadata": {"t": "x"}},
    )
    batch = created.json()
    assert created.status_code == 200 and batch["status"] == "validating" and batch["object"] == "batch"
    assert batch["metadata"] == {"t": "x"} and batch["input_file_id"] == file["id"]
    done = await api.service.wait_settled(batch["id"])
    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert done["error_file_id"] is None
    for key in ("in_progress_at", "finalizing_at", "completed_at"):
        assert isinstance(done[key], int)
    assert (await api.client.get(f"/v1/batches/{batch['id']}")).json() == done
    records = await api.content(done["output_file_id"])
    assert [r["custom_id"] for r in records] == ["a", "b#job_name[mine]#", "c"]  # input order
    first = records[0]
    assert first["id"].startswith("batch_req_") and first["error"] is None
    assert first["response"]["status_code"] == 200
    assert first["response"]["body"]["choices"][0]["message"]["content"] == "echo one"
    # batch class, custom_id as the request id, job name = the batch id unless the custom_id has a tag
    # the worker sees the client's id (custom_id, job tag included) joined to agentd's unique id
    sent = {r.headers["x-request-id"].split("-agentd-")[0]: r.headers for r in api.worker.seen}
    assert set(sent) == {f"a#job_name[{batch['id']}]#", "b#job_name[mine]#", f"c#job_name[{batch['id']}]#"}
    assert all(h["x-agentd-class"] == "batch" for h in sent.values())
    output = (await api.client.get(f"/v1/files/{done['output_file_id']}")).json()
    assert output["purpose"] == "batch_output"
    listing = (await api.client.get("/v1/batches", params={"limit": 5})).json()
    assert listing["object"] == "list" and [b["id"] for b in listing["data"]] == [batch["id"]]
    assert listing["first_id"] == listing["last_id"] == batch["id"] and listing["has_more"] is False
    metrics = (await api.client.get("/metrics")).text
    assert 'agentd_batch_api_batches{status="completed"} 1.0' in metrics
    assert 'agentd_batch_api_requests_total{outcome="succeeded"} 3.0' in metrics


async def test_batch_api_bad_lines_go_to_the_error_file_naming_line_and_field(api: Api) -> None:
    lines: list[Any] = [
        line("ok"),
        b"{not json",
        {**line("x"), "url": "/v1/completions"},
        {**line("y"), "method": "GET"},
        line("ok"),
        line("missing", model="missing"),
    ]
    batch = await api.service.wait_settled((await api.run_batch(lines))["id"])
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 6, "completed": 1, "failed": 5}
    errors = await api.content(batch["error_file_id"])
    assert [e["custom_id"] for e in errors] == [None, "x", "y", "ok", "missing"]
    messages = [e["error"]["message"] for e in errors]
    assert messages[0].startswith("line 2: not valid JSON")
    assert messages[1].startswith("line 3: url:") and messages[2].startswith("line 4: method:")
    assert errors[3]["error"]["code"] == "duplicate_custom_id" and messages[3].startswith("line 5: custom_id:")
    assert errors[4]["response"]["status_code"] == 404 and errors[4]["error"]["code"] == "model_not_found"
    assert [(e["line"], e["param"]) for e in batch["errors"]["data"]] == [
        (2, None),
        (3, "url"),
        (4, "method"),
        (5, "custom_id"),
    ]
    [ok] = await api.content(batch["output_file_id"])
    assert ok["custom_id"] == "ok"


async def test_batch_api_keeps_a_non_json_answer_as_text(api: Api) -> None:
    batch = await api.service.wait_settled((await api.run_batch([line("n", model="nan")]))["id"])
    [record] = await api.content(batch["output_file_id"])
    assert record["response"] == {"status_code": 200, "request_id": f"n#job_name[{batch['id']}]#", "body": '{"v": NaN}'}


async def test_batch_api_batch_of_only_bad_lines_fails(api: Api) -> None:
    batch = await api.service.wait_settled((await api.run_batch([b"[]", {"custom_id": "z"}]))["id"])
    assert batch["status"] == "failed" and batch["failed_at"] is not None
    assert [e["line"] for e in batch["errors"]["data"]] == [1, 2]
    assert api.worker.seen == []


async def test_batch_api_retries_a_busy_worker(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch_executor, "RETRY_BASE_SECONDS", 0.001)
    api.worker.fail_first = 2
    batch = await api.service.wait_settled((await api.run_batch([line("a")]))["id"])
    assert batch["request_counts"] == {"total": 1, "completed": 1, "failed": 0}
    assert len(api.worker.seen) == 3


async def test_batch_api_lines_wait_while_no_worker_is_in_rotation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """agentd's own 503 (no worker in rotation) is not an answer: the lines wait for the worker
    instead of failing after the retries (a batch created while the only worker restarted recorded
    every line sent meanwhile as failed)."""
    monkeypatch.setattr(batch_executor, "RETRY_BASE_SECONDS", 0.001)
    worker = BatchWorker()
    refused: Callable[[], int] = lambda: 0  # noqa: E731  (set once the daemon runs)
    down = True
    went_down = trio.Event()
    health_checks = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal down, health_checks
        if request.url.path != "/health":
            return await BatchWorker.handler(worker, request)
        health_checks += 1
        if health_checks >= 2:
            went_down.set()  # the first failed check ejects the worker (health_failures_to_eject = 1)
        # back in rotation only once both lines were refused more often than the retries allow
        down = down and refused() < 3 * batch_executor.MAX_ATTEMPTS
        return httpx.Response(503 if down else 200)

    monkeypatch.setattr(worker, "handler", handler)
    routing = {"health_check_interval_seconds": 0.02, "health_failures_to_eject": 1, "health_successes_to_restore": 1}
    cfg = attrs.evolve(batch_config(tmp_path / "b.sqlite3"), routing=http_config(**routing).routing)
    async with running(cfg, worker) as api:
        refused = lambda: api.handles.native_dispatcher.statistics().rejected_count  # noqa: E731
        await went_down.wait()
        batch = await api.service.wait_settled((await api.run_batch([line("a"), line("b")]))["id"])
        assert not down
        assert batch["status"] == "completed"
        assert batch["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
        assert sorted(worker.custom_ids()) == ["a", "b"]  # each sent once, when the worker was back


async def test_batch_api_upload_errors_name_the_field(api: Api) -> None:
    msg = assert_error(await api.upload(jsonl([line("a")]), purpose="fine-tune"), 400, "invalid_value", "purpose")
    assert "'fine-tune'" in msg
    no_purpose = await api.client.post("/v1/files", files={"file": ("in.jsonl", b"{}\n")})
    assert_error(no_purpose, 400, "missing_field", "purpose")
    no_file = await api.client.post("/v1/files", data={"purpose": "batch"}, files={"file2": ("x", b"1")})
    assert_error(no_file, 400, "unknown_parameter", "file2")  # not ignored (docs/operations.md §14)
    no_file = await api.client.post("/v1/files", files={"purpose": (None, b"batch")})
    assert_error(no_file, 400, "missing_field", "file")
    not_multipart = await api.client.post("/v1/files", json={"purpose": "batch"})
    assert_error(not_multipart, 400, "invalid_content_type", "file")
    broken = await api.client.post(
        "/v1/files", content=b"--xyz\r\nContent-Disp", headers={"content-type": "multipart/form-data; boundary=xyz"}
    )
    assert_error(broken, 400, "invalid_multipart", "file")


async def test_batch_api_upload_part_without_a_name_is_a_400(api: Api) -> None:
    # a form-data part whose Content-Disposition has no name (RFC 7578 §4.2 requires one) was a
    # 500 (the unknown-field check sliced None) and the connection closed
    body = (
        b"--xyz\r\nContent-Disposition: form-data\r\n\r\nx\r\n"
        b'--xyz\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n{}\n\r\n'
        b"--xyz--\r\n"
    )
    nameless = await api.client.post(
        "/v1/files", content=body, headers={"content-type": "multipart/form-data; boundary=xyz"}
    )
    assert "no name" in assert_error(nameless, 400, "invalid_multipart", "file")
    listed = await api.client.get("/v1/files")
    assert listed.json()["data"] == []  # nothing stored


async def test_batch_api_upload_limits_apply_while_streaming(tmp_path: Path) -> None:
    cfg = batch_config(tmp_path / "b.sqlite3", max_file_bytes=10_000, max_lines=3)
    async with running(cfg, BatchWorker()) as api:
        too_many = await api.upload(jsonl([line(f"c{i}") for i in range(4)]))
        assert "more than 3 request lines (batch_api.max_lines)" in assert_error(
            too_many, 400, "too_many_lines", "file"
        )
        three_and_blanks = await api.upload(jsonl([line(f"c{i}") for i in range(3)]) + b"\n \n")
        assert three_and_blanks.status_code == 200
        big = await api.upload(b"x" * 10_001)
        assert "batch_api.max_file_bytes" in assert_error(big, 413, "file_too_large", "file")
        # larger than server.max_body_bytes (4096) is fine: the upload has its own limit
        assert (await api.upload(b" " * 9_000)).status_code == 200


async def test_batch_api_create_errors_name_the_field(api: Api) -> None:
    file_id = (await api.upload(jsonl([line("a")]))).json()["id"]
    good = {"input_file_id": file_id, "endpoint": ENDPOINT, "completion_window": "24h"}
    cases = [
        ({**good, "endpoint": "/v1/moderations"}, 400, "invalid_value", "endpoint"),
        ({**good, "completion_window": "1h"}, 400, "invalid_value", "completion_window"),
        ({**good, "input_file_id": 3}, 400, "invalid_type", "input_file_id"),
        ({k: v for k, v in good.items() if k != "input_file_id"}, 400, "missing_field", "input_file_id"),
        ({**good, "input_file_id": "file-nope"}, 404, "file_not_found", "input_file_id"),
        ({**good, "metadata": {"k": 1}}, 400, "invalid_value", "metadata.k"),
        ({**good, "metadata": [1]}, 400, "invalid_value", "metadata"),
        ({**good, "metadata": {f"k{i}": "v" for i in range(17)}}, 400, "invalid_value", "metadata"),
    ]
    for body, status, code, param in cases:
        assert_error(await api.client.post("/v1/batches", json=body), status, code, param)
    assert_error(await api.client.post("/v1/batches", content=b"{nope"), 400, "invalid_json", None)
    assert_error(await api.client.post("/v1/batches", json=[1]), 400, "invalid_json", None)


async def test_batch_api_unknown_ids_are_404(api: Api) -> None:
    for method, path, param in [
        ("GET", "/v1/files/file-nope", "file_id"),
        ("GET", "/v1/files/file-nope/content", "file_id"),
        ("DELETE", "/v1/files/file-nope", "file_id"),
        ("GET", "/v1/batches/batch_nope", "batch_id"),
        ("POST", "/v1/batches/batch_nope/cancel", "batch_id"),
    ]:
        response = await api.client.request(method, path)
        kind = "file" if param == "file_id" else "batch"
        assert_error(response, 404, f"{kind}_not_found", param)
    assert_error(await api.client.get("/v1/batches", params={"limit": 0}), 400, "invalid_value", "limit")
    assert_error(await api.client.get("/v1/batches", params={"limit": "x"}), 400, "invalid_value", "limit")
    assert_error(await api.client.get("/v1/batches", params={"after": "batch_nope"}), 400, "invalid_value", "after")


async def test_batch_api_list_and_delete_files(api: Api) -> None:
    file_id = (await api.upload(jsonl([line("a")]))).json()["id"]
    listing = (await api.client.get("/v1/files", params={"purpose": "batch"})).json()
    assert listing["object"] == "list" and [f["id"] for f in listing["data"]] == [file_id]
    assert (await api.client.get("/v1/files", params={"purpose": "batch_output"})).json()["data"] == []
    assert_error(await api.client.get("/v1/files", params={"limit": "0"}), 400, "invalid_value", "limit")
    deleted = await api.client.delete(f"/v1/files/{file_id}")
    assert deleted.json() == {"id": file_id, "object": "file", "deleted": True}
    assert (await api.client.get(f"/v1/files/{file_id}")).status_code == 404


async def test_batch_api_cancel_keeps_answered_lines_and_abandons_in_flight(tmp_path: Path) -> None:
    worker = BatchWorker(block=lambda rid: not rid.startswith(("c0#", "c1#")))
    async with running(batch_config(tmp_path / "b.sqlite3", concurrency=2), worker) as api:
        batch = await api.run_batch([line(f"c{i}") for i in range(6)])
        await worker.wait_blocked(2)  # c0 and c1 answered; c2 and c3 hang at the worker
        cancelled = await api.client.post(f"/v1/batches/{batch['id']}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] in ("cancelling", "cancelled")
        done = await api.service.wait_settled(batch["id"])
        assert done["status"] == "cancelled" and done["cancelled_at"] is not None
        assert done["request_counts"] == {"total": 6, "completed": 2, "failed": 0}
        assert [r["custom_id"] for r in await api.content(done["output_file_id"])] == ["c0", "c1"]
        assert sorted(worker.custom_ids()) == ["c0", "c1", "c2", "c3"]  # c4, c5 never sent
        again = await api.client.post(f"/v1/batches/{batch['id']}/cancel")
        assert again.status_code == 200 and again.json()["status"] == "cancelled"
        finished = await api.service.wait_settled((await api.run_batch([line("c0#x")]))["id"])
        refused = await api.client.post(f"/v1/batches/{finished['id']}/cancel")
        assert_error(refused, 409, "batch_not_cancellable", "batch_id")


async def test_batch_api_resumes_after_the_daemon_died_exactly_once(tmp_path: Path) -> None:
    db = tmp_path / "b.sqlite3"
    first = BatchWorker(block=lambda rid: rid.split("#")[0] not in ("c0", "c1", "c2"))
    async with running(batch_config(db, concurrency=3), first) as api:
        batch = await api.run_batch([line(f"c{i}") for i in range(10)])
        await first.wait_blocked(3)  # c0-c2 answered and committed, c3-c5 in flight
        assert (await api.client.get(f"/v1/batches/{batch['id']}")).json()["request_counts"]["completed"] == 3
    # the daemon is gone (cancelled mid-request, no drain); a new one opens the same database
    second = BatchWorker()
    async with running(batch_config(db, concurrency=3), second) as api:
        done = await api.service.wait_settled(batch["id"])
        assert done["status"] == "completed"
        assert done["request_counts"] == {"total": 10, "completed": 10, "failed": 0}
        ids = [r["custom_id"] for r in await api.content(done["output_file_id"])]
        assert ids == [f"c{i}" for i in range(10)]  # each exactly once, in input order
        assert sorted(second.custom_ids()) == [f"c{i}" for i in range(3, 10)]  # answered ones not re-sent


@asynccontextmanager
async def drained(db: Path, worker: BatchWorker) -> AsyncIterator[Api]:
    """A daemon with a 60 s grace that the block stops by setting ``handles.shutdown``: leaving it
    waits for the graceful stop (``running`` kills instead)."""
    cfg = attrs.evolve(
        batch_config(db, concurrency=2), server=attrs.evolve(http_config().server, shutdown_grace_seconds=60.0)
    )
    async with trio.open_nursery() as nursery:
        handles: DaemonHandles = await nursery.start(
            partial(run_daemon, cfg, transport_factory=worker.transport, serve_http=False, batch_executor=True)
        )
        transport = httpx.ASGITransport(app=create_app(handles))
        async with httpx.AsyncClient(transport=transport, base_url="http://agentd") as client:
            yield Api(handles, client, worker)


async def test_a_graceful_stop_lets_the_lines_in_flight_finish_and_sends_no_new_one(tmp_path: Path) -> None:
    """On shutdown the executor sends no new line and the lines in flight get the drain's grace
    (docs/batch.md, "How a batch runs"); a line waiting to be tried again stays pending; the next
    start sends the rest, each line answered exactly once."""
    db = tmp_path / "b.sqlite3"
    first = BatchWorker(block=lambda rid: rid.split("#")[0] in ("c2", "c3"))
    async with drained(db, first) as api:
        batch = await api.run_batch([line(f"c{i}") for i in range(8)])
        await first.wait_blocked(2)  # c0, c1 answered; c2, c3 in flight
        api.handles.shutdown.set()
        await api.service.stopping.wait()
        first.release.set()  # the lines in flight are answered within the grace
    # the daemon stopped once they were recorded, long before the 60 s grace
    assert sorted(first.custom_ids()) == ["c0", "c1", "c2", "c3"]  # no line sent after the stop began
    second = BatchWorker()
    async with running(batch_config(db, concurrency=2), second) as api:
        done = await api.service.wait_settled(batch["id"])
        assert done["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
        assert [r["custom_id"] for r in await api.content(done["output_file_id"])] == [f"c{i}" for i in range(8)]
        assert sorted(second.custom_ids()) == [f"c{i}" for i in range(4, 8)]  # c2, c3 were recorded


async def test_a_line_waiting_to_be_retried_stays_pending_at_a_graceful_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch_executor, "RETRY_BASE_SECONDS", 3600.0)  # only the stop ends the waits
    db = tmp_path / "b.sqlite3"
    busy = BatchWorker(fail_first=10**6)  # every answer a 503: each line waits to be tried again
    async with drained(db, busy) as api:
        batch = await api.run_batch([line(f"c{i}") for i in range(4)])
        while len(busy.seen) < 2:  # both slots' first attempts answered 503
            await busy.seen_changed.wait()
        api.handles.shutdown.set()
    assert len(busy.seen) == 2  # the waits ended with the stop: no second attempt, no new line
    async with running(batch_config(db, concurrency=2), BatchWorker()) as api:
        done = await api.service.wait_settled(batch["id"])
        assert done["request_counts"] == {"total": 4, "completed": 4, "failed": 0}


async def test_batch_api_disabled_has_no_routes(tmp_path: Path) -> None:
    cfg = attrs.evolve(http_config(), batch_api=BatchApiConfig(enabled=False, database_path=str(tmp_path / "b")))
    async with running(cfg, BatchWorker()) as api:
        assert api.handles.batches is None
        response = await api.upload(jsonl([line("a")]))
        assert_error(response, 404, "not_found", None)
        assert_error(await api.client.get("/v1/batches"), 404, "not_found", None)
    assert not (tmp_path / "b").exists()


async def test_batch_api_database_is_created_on_first_use(tmp_path: Path) -> None:
    db = tmp_path / "deep" / "dir" / "b.sqlite3"
    async with running(batch_config(db), BatchWorker()) as api:
        assert not db.exists()
        assert (await api.upload(jsonl([line("a")]))).status_code == 200
        assert db.exists()


ALPHA, BETA = "sk-alpha-0123456789", "sk-beta-9876543210"
TWO_TENANTS = AuthConfig(
    api_keys=(
        f"team-a:{hashlib.sha256(ALPHA.encode()).hexdigest()}",
        f"team-b:{hashlib.sha256(BETA.encode()).hexdigest()}",
    )
)


def as_tenant(api: Api, key: str) -> Api:
    """The same daemon seen through a client presenting ``key``."""
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(api.handles)),
        base_url="http://agentd",
        headers={"authorization": f"Bearer {key}"},
    )
    return Api(api.handles, client, api.worker)


def record_principals(api: Api, tenants: list[str] | None = None) -> list[str | None]:
    """Every principal the executor builds a request with (a spy that calls through); the requests'
    resolved tenants go to ``tenants``."""
    seen: list[str | None] = []
    tenants = [] if tenants is None else tenants
    engine = api.handles.engine
    build = engine.build_request

    def spy(*args: Any, **kwargs: Any) -> Any:
        req = build(*args, **kwargs)
        seen.append(kwargs.get("principal"))
        tenants.append(req.prio.tenant)
        return req

    engine.build_request = spy  # type: ignore[method-assign]
    return seen


async def test_batch_api_objects_belong_to_the_tenant_that_created_them(tmp_path: Path) -> None:
    cfg = attrs.evolve(batch_config(tmp_path / "b.sqlite3"), auth=TWO_TENANTS)
    async with running(cfg, BatchWorker()) as api:
        tenants: list[str] = []
        principals = record_principals(api, tenants)
        a, b = as_tenant(api, ALPHA), as_tenant(api, BETA)
        async with a.client, b.client:
            assert (await api.client.get("/v1/batches")).status_code == 401  # no key, no Batch API
            batch = await a.run_batch([line("x"), line("y", user="team-b")])  # a line cannot pick its tenant
            done = await a.service.wait_settled(batch["id"])
            assert done["status"] == "completed"
            assert principals == ["team-a", "team-a"]  # the lines ran as their owner
            assert tenants == ["team-a", "team-a"]  # whatever a line's user field says
            output, input_id = done["output_file_id"], done["input_file_id"]
            assert len(await a.content(output)) == 2
            # team-b sees none of it: 404 as for an unknown id, empty lists
            for path in (f"/v1/batches/{batch['id']}", f"/v1/files/{input_id}", f"/v1/files/{output}/content"):
                response = await b.client.get(path)
                assert response.status_code == 404, path
                assert response.json()["error"]["param"] in ("batch_id", "file_id")
            assert_error(await b.client.post(f"/v1/batches/{batch['id']}/cancel"), 404, "batch_not_found", "batch_id")
            assert_error(await b.client.delete(f"/v1/files/{input_id}"), 404, "file_not_found", "file_id")
            stolen = await b.client.post(
                "/v1/batches", json={"input_file_id": input_id, "endpoint": ENDPOINT, "completion_window": "24h"}
            )
            assert_error(stolen, 404, "file_not_found", "input_file_id")
            assert (await b.client.get("/v1/batches")).json()["data"] == []
            assert (await b.client.get("/v1/files")).json()["data"] == []
            after = await b.client.get("/v1/batches", params={"after": batch["id"]})
            assert_error(after, 400, "invalid_value", "after")
            # team-a sees its own: the input and the output file (the output inherits the owner)
            assert [x["id"] for x in (await a.client.get("/v1/batches")).json()["data"]] == [batch["id"]]
            assert {f["id"] for f in (await a.client.get("/v1/files")).json()["data"]} == {input_id, output}
            own = await b.run_batch([line("z")])
            assert [x["id"] for x in (await b.client.get("/v1/batches")).json()["data"]] == [own["id"]]
            assert (await a.client.delete(f"/v1/files/{input_id}")).status_code == 200


async def test_batch_api_ownership_survives_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "b.sqlite3"
    cfg = attrs.evolve(batch_config(db, concurrency=1), auth=TWO_TENANTS)
    first = BatchWorker(block=lambda rid: rid.split("#")[0] != "c0")
    async with running(cfg, first) as api:
        a = as_tenant(api, ALPHA)
        async with a.client:
            batch = await a.run_batch([line("c0"), line("c1"), line("c2")])
            await first.wait_blocked(1)  # c0 answered, c1 in flight when the daemon dies
    async with running(cfg, BatchWorker()) as api:
        principals = record_principals(api)
        a, b = as_tenant(api, ALPHA), as_tenant(api, BETA)
        async with a.client, b.client:
            done = await a.service.wait_settled(batch["id"])
            assert done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
            assert principals == ["team-a", "team-a"]  # the resumed lines still run as the owner
            assert (await a.client.get(f"/v1/batches/{batch['id']}")).status_code == 200
            assert (await b.client.get(f"/v1/batches/{batch['id']}")).status_code == 404


def test_a_version_1_database_is_migrated_and_its_objects_stay_visible_without_keys(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    old = sqlite3.connect(str(path))
    old.executescript(
        """
        CREATE TABLE files (rowid INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, purpose TEXT NOT NULL,
            filename TEXT NOT NULL, bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, content BLOB NOT NULL);
        CREATE TABLE batches (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, endpoint TEXT NOT NULL,
            input_file_id TEXT NOT NULL, completion_window TEXT NOT NULL, status TEXT NOT NULL, metadata TEXT,
            errors TEXT, output_file_id TEXT, error_file_id TEXT, created_at INTEGER NOT NULL,
            in_progress_at INTEGER, expires_at INTEGER, finalizing_at INTEGER, completed_at INTEGER,
            failed_at INTEGER, expired_at INTEGER, cancelling_at INTEGER, cancelled_at INTEGER,
            total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0);
        INSERT INTO files (id, purpose, filename, bytes, created_at, content)
            VALUES ('file-old', 'batch', 'a', 1, 5, x'0a');
        INSERT INTO batches (id, endpoint, input_file_id, completion_window, status, created_at)
            VALUES ('batch_old', '/v1/chat/completions', 'file-old', '24h', 'validating', 5);
        PRAGMA user_version=1;
        """
    )
    old.close()
    db = BatchDatabase(path)
    assert db._conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    assert db.get_file("file-old") is not None and db.get_batch("batch_old") is not None  # keys off: all
    assert db.get_file("file-old", "team-a") is None and db.get_batch("batch_old", "team-a") is None
    assert db.owner("batch_old") is None
    mine = db.create_file("n", "batch", b"{}\n", owner="team-a")
    assert [f["id"] for f in db.list_files(None, 10, "team-a")[0]] == [mine["id"]]
    db.close()
    BatchDatabase(path).close()  # opening a migrated database again is a no-op
