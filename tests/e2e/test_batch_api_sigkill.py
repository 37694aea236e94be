"""SIGKILL mid-batch, restart on the same database: every request answered exactly once (docs/batch.md §4).

A real ``agentd start --config`` process on the embedded simulated backend runs a batch of 200
lines; once some (not all) are answered it is killed with SIGKILL, a second process is started on
the same database, and the batch is polled to ``completed``.  Waits are real time (two processes),
each bounded by a generous deadline so that a loaded 2-core machine passes too.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import trio
from native_fakes import read_line, reap, stop_process

ROOT = Path(__file__).resolve().parents[2]
LINES = 200
DEADLINE_SECONDS = 180.0
POLL_SECONDS = 0.05


def write_config(tmp_path: Path) -> Path:
    config = tmp_path / "agentd.toml"
    config.write_text(
        '[server]\nport = 0\nlog_level = "info"\nshutdown_grace_seconds = 1.0\n'
        # slow enough (a few seconds for the batch) to be killed in the middle, fast enough for a test
        "[embedded]\ndp_size = 2\nnum_gpu_blocks = 1024\ntime_scale = 2.0\n"
        f'[batch_api]\ndatabase_path = "{tmp_path / "state" / "batches.sqlite3"}"\nconcurrency = 8\n'
    )
    return config


def input_file() -> bytes:
    lines = [
        json.dumps(
            {
                "custom_id": f"req-{i:03d}",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"prompt": f"item {i} " * 8, "max_tokens": 32},
            }
        )
        for i in range(LINES)
    ]
    return ("\n".join(lines) + "\n").encode()


async def start(config: Path, log: Path) -> tuple[trio.Process, str]:
    cmd = [sys.executable, "-m", "daemon", "start", "--config", str(config)]
    with log.open("ab") as stderr:
        proc = await trio.lowlevel.open_process(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr)
    assert proc.stdout is not None
    with trio.fail_after(180):
        line = await read_line(proc.stdout)
    match = re.fullmatch(r"agentd listening on (http://127\.0\.0\.1:\d+)\n", line)
    assert match, line
    return proc, match.group(1)


async def poll(client: httpx.AsyncClient, batch_id: str, done: Any) -> dict[str, Any]:
    with trio.fail_after(DEADLINE_SECONDS):
        while True:
            batch: dict[str, Any] = (await client.get(f"/v1/batches/{batch_id}")).json()
            if done(batch):
                return batch
            assert batch["status"] in ("validating", "in_progress", "finalizing"), batch
            await trio.sleep(POLL_SECONDS)


async def test_batch_api_sigkill_mid_batch_resumes_exactly_once(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    log = tmp_path / "agentd.log"
    proc, url = await start(config, log)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            file = await client.post("/v1/files", data={"purpose": "batch"}, files={"file": ("in.jsonl", input_file())})
            assert file.status_code == 200, file.text
            created = await client.post(
                "/v1/batches",
                json={"input_file_id": file.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"},
            )
            batch_id = created.json()["id"]
            before = await poll(client, batch_id, lambda b: b["request_counts"]["completed"] >= 10)
        assert await stop_process(proc, signal.SIGKILL) == -signal.SIGKILL
    finally:
        await reap(proc)
    answered_before_kill = before["request_counts"]["completed"]
    assert before["status"] == "in_progress" and answered_before_kill < LINES, before

    proc, url = await start(config, log)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            batch = await poll(client, batch_id, lambda b: b["status"] == "completed")
            assert batch["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}
            content = await client.get(f"/v1/files/{batch['output_file_id']}/content")
        assert batch["error_file_id"] is None
        records = [json.loads(line) for line in content.content.splitlines()]
        ids = [r["custom_id"] for r in records]
        assert len(ids) == len(set(ids)) == LINES  # no duplicates, nothing missing
        assert ids == [f"req-{i:03d}" for i in range(LINES)]  # input order
        assert all(r["response"]["status_code"] == 200 and r["error"] is None for r in records)
        assert len({r["id"] for r in records}) == LINES
        assert await stop_process(proc) == 0
    finally:
        await reap(proc)
    text = log.read_text()
    assert f"event=batch_created batch_id={batch_id}" in text
    resumed = re.search(rf"event=batch_resumed batch_id={batch_id} done=(\d+) total={LINES}", text)
    assert resumed and answered_before_kill <= int(resumed.group(1)) < LINES
    assert f"event=batch_completed batch_id={batch_id} total={LINES} completed={LINES} failed=0" in text
