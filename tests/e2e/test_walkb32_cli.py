"""``agentd batch`` walked as a new user in session 32 (docs/batch.md §3).

* ``--concurrency 1000000000`` on a 3-line file was killed by the kernel for lack of memory (23 GB
  resident): the runner started ``concurrency`` sender tasks up front.  It now starts them as lines
  need them, so the flag is what the docs say, a bound on the requests in flight.
* An empty input (or one of blank lines only) exited 0 with ``0 lines``, although docs/batch.md says
  a file in which no line is a valid request exits 1, as the Batch API fails such a batch
  (``empty_file``).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from daemon import cli
from daemon.batch_runner import BatchOptions, BatchRunner

WORKER = "http://w0:8000"


def _line(custom_id: str) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": custom_id}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})


def _tasks_below(task: trio.lowlevel.Task) -> int:
    return 1 + sum(_tasks_below(child) for nursery in task.child_nurseries for child in nursery.child_tasks)


async def test_a_huge_concurrency_starts_only_the_senders_the_lines_need(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(_line(f"q-{i}") + "\n" for i in range(3)))
    seen: list[int] = []

    async def answer(request: httpx.Request) -> httpx.Response:
        seen.append(_tasks_below(trio.lowlevel.current_root_task()))
        await trio.sleep(1.0)  # all three in flight at once
        usage = {"prompt_tokens": 3, "completion_tokens": 2}
        return httpx.Response(200, json={"choices": [{"message": {"content": "hi"}}], "usage": usage})

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:  # type: ignore[arg-type]
        opts = BatchOptions(inp, tmp_path / "out.jsonl", concurrency=20_000)
        start = trio.current_time()
        summary = await BatchRunner(opts, client, WORKER, stderr=io.StringIO(), is_tty=False).run()
    assert (summary.ok, summary.exit_code) == (3, 0)
    assert trio.current_time() - start == pytest.approx(1.0)  # the bound still lets every line run at once
    assert len(seen) == 3 and max(seen) < 50, seen  # 20,000 senders before (one per unit of concurrency)
    assert sorted(json.loads(r)["custom_id"] for r in (tmp_path / "out.jsonl").read_text().splitlines()) == [
        "q-0",
        "q-1",
        "q-2",
    ]


async def test_concurrency_one_still_sends_one_line_at_a_time(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(_line(f"q-{i}") + "\n" for i in range(4)))
    in_flight = peak = 0

    async def answer(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await trio.sleep(1.0)
        in_flight -= 1
        return httpx.Response(200, json={"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:  # type: ignore[arg-type]
        opts = BatchOptions(inp, tmp_path / "out.jsonl", concurrency=1)
        start = trio.current_time()
        summary = await BatchRunner(opts, client, WORKER, stderr=io.StringIO(), is_tty=False).run()
    assert (summary.ok, peak) == (4, 1)
    assert trio.current_time() - start == pytest.approx(4.0)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_an_input_without_request_lines_exits_1_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str
) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text(content)
    out = tmp_path / "out.jsonl"
    code = cli.main(["batch", "-i", str(inp), "-o", str(out), "--target", "http://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"agentd batch: {inp} has no request lines" in err
    assert out.read_bytes() == b""
