"""Session-44 security audit, over real sockets (docs/operations.md §10, §14): each test failed
before the fix it names.

Real clock, as ``test_hostile_clients.py`` (the socket path is the point): nothing here asserts a
measured duration.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import stat
import tracemalloc
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
from log_capture import EventLog
from native_fakes import FakeWorker, make_config
from test_hostile_clients import read_response

from actors.core.config import ProgramSchedulingConfig
from daemon.config import AuthConfig, BatchApiConfig, BatchJobsConfig, LimitsConfig
from daemon.handles import DaemonHandles
from daemon.supervisor import run_daemon

BUDGET_SECONDS = 30.0
KEY_A, KEY_B = "sk-team-a-secret", "sk-team-b-secret"
LINE = (
    b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",'
    b' "body": {"model": "m", "messages": [{"role": "user", "content": "a private prompt"}]}}\n'
)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


AUTH = AuthConfig(api_keys=(f"team-a:{digest(KEY_A)}", f"team-b:{digest(KEY_B)}"))


async def start(nursery: trio.Nursery, worker: FakeWorker, **extra: Any) -> DaemonHandles:
    cfg = attrs.evolve(
        make_config(worker.worker_urls, dp=2),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(program_scheduling_enable_key="auto"),
        **extra,
    )
    return await nursery.start(partial(run_daemon, cfg, transport_factory=worker.transport, rng=random.Random(5)))


def client(handles: DaemonHandles, key: str) -> httpx.AsyncClient:
    assert handles.http_url is not None
    return httpx.AsyncClient(base_url=handles.http_url, headers={"authorization": f"Bearer {key}"})


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask: files are created world-readable unless their creator says otherwise."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_the_batch_api_database_is_readable_by_its_owner_only(
    fake_worker: FakeWorker, tmp_path: Path, umask_022: None
) -> None:
    """Before: the database that holds every tenant's batch inputs and outputs, its WAL and its
    lock file were created ``0644`` in a ``0755`` directory: any local user could read every
    tenant's prompts (``sqlite3 batches.sqlite3 'select content from files'``)."""
    database = tmp_path / "state" / "agentd" / "batches.sqlite3"
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start(
                nursery, fake_worker, auth=AUTH, batch_api=BatchApiConfig(database_path=str(database))
            )
            async with client(handles, KEY_A) as a:
                answer = await a.post("/v1/files", files={"purpose": (None, b"batch"), "file": ("in.jsonl", LINE)})
                assert answer.status_code == 200, answer.text
            files = sorted(p.name for p in database.parent.iterdir())
            assert "batches.sqlite3" in files and "batches.sqlite3.lock" in files
            assert mode(database.parent) == 0o700
            for name in files:  # the database, its -wal and -shm, the lock
                assert mode(database.parent / name) == 0o600, name
            handles.request_shutdown()


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **extra}


@pytest.mark.parametrize(
    ("request_id", "header", "param", "says"),
    [
        pytest.param("#job_name[" + "j" * 2_000_000 + "]#", None, "request_id", "2000000 bytes", id="2MB-body-tag"),
        pytest.param("#job_name[" + "é" * 129 + "]#", None, "request_id", "258 bytes", id="258-bytes"),
        pytest.param("#job_name[a\r\nb]#", None, "request_id", "control", id="crlf-body-tag"),
        pytest.param("#job_name[a\u202eb]#", None, "request_id", "bidirectional", id="bidi-override"),
        pytest.param(None, "r#job_name[" + "j" * 300 + "]#", "x-request-id", "300 bytes", id="header-tag"),
    ],
)
async def test_a_job_name_agentd_would_not_show_is_a_400_naming_the_id(
    fake_worker: FakeWorker, event_log: EventLog, request_id: str | None, header: str | None, param: str, says: str
) -> None:
    """Before: a body ``request_id`` tagged a batch job of any length and any characters (a 2 MB
    name: a 2 MB ``batch_job_created`` log line, a 2 MB ``job`` label on ``/metrics`` while it
    ran, a 2 MB key kept in the job table; a CR/LF one in a label).  Now over 256 bytes, or with
    control or bidirectional-override characters, it is refused before anything is scheduled."""
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start(
                nursery, fake_worker, auth=AUTH, batch_jobs=BatchJobsConfig(enabled=True), server=big_bodies()
            )
            async with client(handles, KEY_A) as a:
                body = chat() if request_id is None else chat(request_id=request_id)
                headers = {} if header is None else {"x-request-id": header}
                answer = await a.post("/v1/chat/completions", json=body, headers=headers)
                assert answer.status_code == 400, answer.text[:300]
                error = answer.json()["error"]
                assert (error["code"], error["param"]) == ("invalid_request_id", param)
                assert says in error["message"]
                ok = await a.post("/v1/chat/completions", json=chat(request_id="r#job_name[eval-1]#"))
                assert ok.status_code == 200, ok.text
            assert [f["job"] for _, f in event_log.named("batch_job_created")] == ["team-a/eval-1"]
            handles.request_shutdown()


def big_bodies() -> Any:
    return attrs.evolve(make_config().server, max_body_bytes=4 << 20)


async def test_two_tenants_tagging_one_job_name_get_two_jobs(fake_worker: FakeWorker, event_log: EventLog) -> None:
    """Before: with API keys, ``#job_name[eval]#`` of tenant B joined tenant A's job ``eval``:
    B's requests queued in A's job and B's decode lengths moved the estimate A's job is ordered
    and reserved by (docs/batch.md §1.2), the cross-tenant reach docs/operations.md §10.1 rules out for Programs.  Now
    a named job is scoped by the key's tenant, as Program ids are; untagged batch work stays in
    ``__default__``."""
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start(nursery, fake_worker, auth=AUTH, batch_jobs=BatchJobsConfig(enabled=True))
            for key in (KEY_A, KEY_B):
                async with client(handles, key) as c:
                    tagged = await c.post(
                        "/v1/chat/completions", json=chat(), headers={"x-request-id": "r#job_name[eval]#"}
                    )
                    assert tagged.status_code == 200, tagged.text
                    untagged = await c.post("/v1/chat/completions", json=chat(), headers={"x-agentd-class": "batch"})
                    assert untagged.status_code == 200, untagged.text
            jobs = [f["job"] for _, f in event_log.named("batch_job_created")]
            assert sorted(job for job in jobs if job != "__default__") == ["team-a/eval", "team-b/eval"], jobs
            handles.request_shutdown()


# a relay process boots in ~1.5 s of CPU; on a loaded 2-core machine that is tens of seconds
PROCESS_START_BUDGET_SECONDS = 180.0


async def raw_status(host: str, port: int, target: bytes) -> tuple[int, bytes]:
    """The status and body of one GET of ``target`` sent as written (no client normalises it)."""
    stream = await trio.open_tcp_stream(host, port)
    await stream.send_all(b"GET " + target + b" HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    await stream.aclose()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


# targets one process answers with a 404 (``..`` is not resolved, ``#`` is part of the path)
LITERAL_TARGETS = (b"/v1/../metrics", b"/health/../scheduling/diagnostics", b"/metrics#x", b"/./metrics")


@pytest.mark.parametrize("processes", [1, 2])
async def test_relays_pass_the_path_on_as_the_client_sent_it(processes: int) -> None:
    """Before: with relay processes, ``GET /v1/../metrics`` and ``GET /metrics#x`` were served
    ``/metrics`` (httpx, forwarding them to the scheduler process, resolved the dot segments and
    cut the ``#`` as a fragment), where one process answers 404: a filter in front of agentd that
    blocks ``/metrics`` by its path was passed by spelling it so (docs/operations.md §14)."""
    cfg = attrs.evolve(
        make_config(("http://127.0.0.1:22999",), health_interval_seconds=3600.0),
        server=attrs.evolve(make_config().server, data_plane_processes=processes),
        batch_api=BatchApiConfig(enabled=False),
    )
    with trio.fail_after(PROCESS_START_BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, cfg))
            assert handles.http_url is not None
            host, port = handles.http_url.removeprefix("http://").rsplit(":", 1)
            assert (await raw_status(host, int(port), b"/metrics"))[0] == 200
            for target in LITERAL_TARGETS:
                for _ in range(4):  # the kernel hands each connection to either relay
                    status, body = await raw_status(host, int(port), target)
                    assert status == 404, (target, body[:200])
                    assert json.loads(body)["error"]["code"] == "not_found"
            handles.request_shutdown()


async def test_a_worker_password_with_a_raw_at_sign_is_shown_nowhere(fake_worker: FakeWorker) -> None:
    """Before: a worker URL whose password holds a raw ``@`` (``http://user:pa55@word@w0:8000``,
    which httpx sends as user ``user``, password ``pa55@word``) was masked only up to its first
    ``@``: ``/metrics`` labels, diagnostics, the dashboard, the logs and error bodies showed
    ``http://***@word@w0:8000``, the password's tail (docs/operations.md §10.5)."""
    urls = tuple(url.replace("http://", "http://user:pa55@word@") for url in fake_worker.worker_urls)
    cfg = attrs.evolve(
        make_config(urls, dp=2),
        enable_program_scheduling=True,
        program_scheduling=ProgramSchedulingConfig(program_scheduling_enable_key="auto"),
    )
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await nursery.start(partial(run_daemon, cfg, transport_factory=fake_worker.transport))
            async with httpx.AsyncClient(base_url=handles.http_url) as c:
                answer = await c.post("/v1/chat/completions", json=chat())
                assert answer.status_code == 200, answer.text
                fake_worker.unreachable.update(fake_worker.worker_urls)
                failed = await c.post("/v1/chat/completions", json=chat())
                assert failed.status_code in (502, 503), failed.text
                shown = {
                    "error": failed.text,
                    "metrics": (await c.get("/metrics")).text,
                    "diagnostics": (await c.get("/scheduling/diagnostics")).text,
                    "dashboard": (await c.get("/scheduling/dashboard.json")).text,
                }
            assert "http://***@w0:8000@0" in shown["metrics"]
            assert "http://***@w" in shown["error"], shown["error"]
            for where, text in shown.items():
                assert "pa55" not in text and "word" not in text, where
            json.loads(shown["dashboard"])  # compact JSON, masked whole
            handles.request_shutdown()


async def batches_at_rest(c: httpx.AsyncClient, count: int) -> list[dict[str, Any]]:
    """The ``count`` newest batches once none is validating any more (real clock: polled)."""
    while True:
        batches = (await c.get("/v1/batches", params={"limit": str(count)})).json()["data"]
        if all(b["status"] != "validating" for b in batches):
            return list(batches)
        await trio.sleep(0.02)


async def test_many_batches_over_one_file_are_validated_one_at_a_time(fake_worker: FakeWorker, tmp_path: Path) -> None:
    """Before: every batch created was validated at once, each holding its whole input file and
    the lines parsed from it; eight ``POST /v1/batches`` of 120 bytes over one 47 MB upload took
    the daemon from 120 MB to 1.4 GB (a tenant could exhaust the machine's memory, and take every
    other tenant's agents down with it, with a few small requests).  Now one validation runs at a
    time, so N batches created at once need no more memory than one."""
    # lines for another endpoint: each is a line error, so no batch sends anything
    pad = "x" * 700
    lines = "".join(
        json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions", "body": {"prompt": pad}}) + "\n"
        for i in range(6000)
    ).encode()
    create = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}
    with trio.fail_after(4 * BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start(
                nursery, fake_worker, auth=AUTH, batch_api=BatchApiConfig(database_path=str(tmp_path / "b.sqlite3"))
            )
            async with client(handles, KEY_A) as a:
                a.timeout = httpx.Timeout(4 * BUDGET_SECONDS)
                uploaded = await a.post("/v1/files", files={"purpose": (None, b"batch"), "file": ("in.jsonl", lines)})
                file_id = uploaded.json()["id"]
                tracemalloc.start()
                try:
                    assert (await a.post("/v1/batches", json={**create, "input_file_id": file_id})).status_code == 200
                    await batches_at_rest(a, 1)
                    one = tracemalloc.get_traced_memory()[1]
                    tracemalloc.reset_peak()
                    async with trio.open_nursery() as posts:
                        for _ in range(6):
                            posts.start_soon(partial(a.post, "/v1/batches", json={**create, "input_file_id": file_id}))
                    done = await batches_at_rest(a, 7)
                    six = tracemalloc.get_traced_memory()[1]
                finally:
                    tracemalloc.stop()
            assert [b["status"] for b in done] == ["failed"] * 7
            assert one > len(lines)  # the validation's own file at least
            assert six < 2 * one, (six, one)
            handles.request_shutdown()


async def read_answer(stream: trio.SocketStream) -> tuple[int, dict[str, Any]]:
    """A JSON answer read by its content-length."""
    status, _headers, body = await read_response(stream)
    return status, json.loads(body)


@pytest.mark.parametrize(
    ("start", "says"),
    [
        pytest.param(
            b'--bnd\r\nContent-Disposition: form-data; name="file"; filename="', "a part's headers", id="part-head"
        ),
        pytest.param(b"--bnd\r\nX-Padding: ", "a part's headers", id="header-line"),
        pytest.param(b"", "the multipart preamble", id="preamble"),
    ],
)
async def test_an_upload_whose_part_headers_never_end_is_refused_at_16_kib(
    fake_worker: FakeWorker, start: bytes, says: str
) -> None:
    """Before: the multipart parser buffered a part's header block (or the preamble) up to the
    upload limit, 200 MiB, and parsed it on the event loop: a 30 MB filename held the daemon, every
    stream and probe of every tenant, for 11 s per upload.  Now a header block or preamble over
    16 KiB is a 400 ``invalid_multipart`` as soon as it is seen (here: after 64 KiB of one, the rest
    never sent; before, the daemon waited for it and answered 408)."""
    with trio.fail_after(BUDGET_SECONDS):
        async with trio.open_nursery() as nursery:
            handles = await start_daemon(nursery, fake_worker)
            assert handles.http_url is not None
            host, port = handles.http_url.removeprefix("http://").rsplit(":", 1)
            stream = await trio.open_tcp_stream(host, int(port))
            head = (
                b"POST /v1/files HTTP/1.1\r\nhost: localhost\r\nauthorization: Bearer " + KEY_A.encode() + b"\r\n"
                b"content-type: multipart/form-data; boundary=bnd\r\ncontent-length: 100000000\r\n\r\n"
            )
            await stream.send_all(head + start + b"a" * (1 << 16))
            status, body = await read_answer(stream)
            assert status == 400, body
            assert (body["error"]["code"], body["error"]["param"]) == ("invalid_multipart", "file")
            assert says in body["error"]["message"] and "16384 bytes" in body["error"]["message"]
            await stream.aclose()
            async with client(handles, KEY_A) as a:  # a usual upload still passes
                ok = await a.post("/v1/files", files={"purpose": (None, b"batch"), "file": ("in.jsonl", LINE * 200)})
                assert ok.status_code == 200, ok.text
            handles.request_shutdown()


async def start_daemon(nursery: trio.Nursery, worker: FakeWorker) -> DaemonHandles:
    return await start(nursery, worker, auth=AUTH, limits=LimitsConfig(body_read_timeout_seconds=3.0))
