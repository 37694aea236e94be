"""One daemon per Batch API database (docs/batch.md §4, daemon/batch_lock.py).

A new user's walk (session 25) started two quick starts on different ports: both used the default
``batch_api.database_path`` and both would resume and run its batches, every line sent twice.  The
second ``agentd start`` now exits 2 naming the field and the first daemon's pid; after the first is
killed with SIGKILL (no clean-up) the kernel has dropped its lock and a new daemon starts.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from native_fakes import read_line

from daemon.batch_lock import BatchDatabaseLock, BatchDatabaseLocked

ROOT = Path(__file__).resolve().parents[2]


async def start(config: Path, *extra: str) -> trio.Process:
    cmd = [sys.executable, "-m", "daemon", "start", "--config", str(config), *extra]
    return await trio.lowlevel.open_process(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


async def listening(proc: trio.Process) -> str:
    assert proc.stdout is not None
    with trio.fail_after(180):
        line = await read_line(proc.stdout)
    assert re.fullmatch(r"agentd listening on http://127\.0\.0\.1:\d+\n", line), line
    return line


async def refused(config: Path, *extra: str) -> str:
    """Run a daemon that must exit 2 before listening; its stderr."""
    proc = await start(config, *extra)
    assert proc.stdout is not None and proc.stderr is not None
    with trio.fail_after(180):
        out = await proc.stdout.receive_some(1 << 16)
        err = b""
        while chunk := await proc.stderr.receive_some(1 << 16):
            err += chunk
        code = await proc.wait()
    text = err.decode()
    assert (code, out) == (2, b""), text
    assert "Traceback" not in text
    return text


async def test_a_second_daemon_on_the_same_database_exits_2_naming_the_field_and_the_holder(
    tmp_path: Path, isolated_state_dir: Path
) -> None:
    config = tmp_path / "agentd.toml"
    config.write_text("[server]\nport = 0\n")  # the quick start: the default database for both
    database = isolated_state_dir / "agentd" / "batches.sqlite3"
    first = await start(config)
    try:
        await listening(first)
        assert (database.parent / "batches.sqlite3.lock").read_text() == f"{first.pid}\n"
        line = (
            f"batch_api.database_path: {str(database)!r} is in use by another agentd (pid {first.pid}), which "
            f"holds {str(database) + '.lock'!r}; give each daemon its own database ([batch_api] database_path in "
            "its --config file; [batch_api] enabled = false turns the Batch API off) or stop the other one"
        )
        assert (await refused(config, "--port", "0")).splitlines()[-1] == line
        json_err = await refused(config, "--log-format", "json")
        assert [json.loads(text)["lines"] for text in json_err.splitlines() if '"config_error"' in text] == [[line]]
        first.send_signal(signal.SIGKILL)
        with trio.fail_after(180):
            assert await first.wait() == -signal.SIGKILL
        second = await start(config)  # the kernel dropped the killed daemon's lock
        try:
            await listening(second)
            second.send_signal(signal.SIGTERM)
            with trio.fail_after(180):
                assert await second.wait() == 0
        finally:
            if second.returncode is None:
                second.kill()
                await second.wait()
    finally:
        if first.returncode is None:
            first.kill()
            await first.wait()


def test_the_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    database = tmp_path / "new" / "dir" / "b.sqlite3"
    first, second = BatchDatabaseLock(database), BatchDatabaseLock(database)
    first.acquire()  # creates the directory and the lock file, not the database
    assert (database.parent / "b.sqlite3.lock").exists() and not database.exists()
    with pytest.raises(BatchDatabaseLocked, match=r"is in use by another agentd \(pid \d+\)"):
        second.acquire()
    assert not second.held
    first.release()
    second.acquire()
    assert second.held
    second.release()


def test_a_lock_file_that_cannot_be_created_names_the_field(tmp_path: Path) -> None:
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    with pytest.raises(BatchDatabaseLocked) as caught:
        BatchDatabaseLock(a_file / "b.sqlite3").acquire()
    assert caught.value.lines == [
        f"batch_api.database_path: cannot create the lock file {str(a_file / 'b.sqlite3.lock')!r} (not a directory)"
    ]
