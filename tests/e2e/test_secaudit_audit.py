"""Session-44 security audit, over real sockets (docs/operations.md §10, §14): each test failed
before the fix it names.

Real clock, as ``test_hostile_clients.py`` (the socket path is the point): nothing here asserts a
measured duration.
"""

from __future__ import annotations

import hashlib
import os
import random
import stat
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
from native_fakes import FakeWorker, make_config

from actors.core.config import ProgramSchedulingConfig
from daemon.config import AuthConfig, BatchApiConfig
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
