"""The seed's production launch as real processes: two ``agentd sim-backend`` workers with two DP
ranks each, and ``agentd start`` with the reference router's flags and the calibrated JSON.
The official ``openai`` client then talks to agentd with the agentic context in ``extra_body``."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import trio
from native_fakes import read_line

ROOT = Path(__file__).resolve().parents[2]


async def _start(cmd: list[str], banner: str, procs: list[trio.Process]) -> str:
    """Start a process (registered in ``procs`` at once, so it is always stopped) and read its URL."""
    proc = await trio.lowlevel.open_process(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    procs.append(proc)
    assert proc.stdout is not None
    with trio.fail_after(180):
        line = await read_line(proc.stdout)
    match = re.fullmatch(banner + r" (http://127\.0\.0\.1:\d+)\n", line)
    assert match, line
    return match.group(1)


async def _stop(proc: trio.Process) -> int:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(180):
            return await proc.wait()
    return proc.returncode


async def test_program_seed_launch_command_as_processes() -> None:
    program_json = json.dumps(
        json.loads((ROOT / "configs" / "program-scheduling.json").read_text()), separators=(",", ":")
    )
    procs: list[trio.Process] = []
    try:
        started: dict[int, str] = {}

        async def start_worker(i: int) -> None:
            started[i] = await _start(
                [
                    sys.executable,
                    "-m",
                    "daemon",
                    "sim-backend",
                    "--port",
                    "0",
                    "--dp-size",
                    "2",
                    "--time-scale",
                    "100",
                    "--model",
                    "sim-model",
                ],
                "agentd sim-backend listening on",
                procs,
            )

        async with trio.open_nursery() as nursery:  # both workers boot concurrently
            for i in range(2):
                nursery.start_soon(start_worker, i)
        workers = [started[0], started[1]]
        agentd = await _start(
            [
                sys.executable,
                "-m",
                "daemon",
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--worker-urls",
                *workers,
                "--intra-node-data-parallel-size",
                "2",
                "--policy",
                "consistent_hash",
                "--prometheus-host",
                "127.0.0.1",
                "--prometheus-port",
                "0",
                "--enable-program-scheduling",
                "--program-scheduling-config-json",
                program_json,
                "--log-level",
                "warning",
            ],
            "agentd listening on",
            procs,
        )
        context = {"vllm_xargs": {"agentic_context": {"task_id": "task-a", "agent_id": "lead", "step_id": 7}}}
        async with openai.AsyncOpenAI(base_url=agentd + "/v1", api_key="unused", max_retries=0) as client:
            done = await client.chat.completions.create(
                model="sim-model",
                messages=[{"role": "user", "content": "plan the task"}],
                max_tokens=4,
                extra_body=context,
            )
            stream = await client.chat.completions.create(
                model="sim-model",
                messages=[{"role": "user", "content": "plan the task"}],
                max_tokens=4,
                extra_body=context,
                stream=True,
            )
            pieces = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
        assert done.usage is not None and done.usage.completion_tokens == 4
        assert len(pieces) == 4
        async with httpx.AsyncClient(base_url=agentd, timeout=30) as http:
            diag = (await http.get("/scheduling/diagnostics")).json()
            metrics = (await http.get("/metrics")).text
        assert [r["target_id"] for r in diag["ranks"]] == sorted(f"{w}@{r}" for w in workers for r in (0, 1))
        assert diag["global_queue"] is True and diag["backend_polling_started"] is True
        programs = [p for r in diag["ranks"] for p in r["programs"]]
        assert [(p["root_program_id"], p["step_id"]) for p in programs] == [("task-a:lead", 7)]
        assert "vllm_router_agent_aware_transitions_total{" in metrics
    finally:
        codes = [await _stop(p) for p in reversed(procs)]
    assert codes == [0, 0, 0]
