"""``agentd batch`` (daemon/commands/batch.py, daemon/batch_runner.py; docs/batch.md §3).

The runner against a fake OpenAI worker in virtual time (no sockets); through a real agentd (port 0)
to check the batch headers reach the worker; the ``--config`` embedded mode and the process-level
behaviour (help, bad flags, Ctrl-C then resume) with real sockets.
"""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from native_fakes import BUDGET_SECONDS, FakeWorker, make_config

from daemon import cli
from daemon.batch_output import OutputFileError, scan_output
from daemon.batch_runner import BatchOptions, BatchRunner, BatchSummary
from daemon.supervisor import run_daemon

ROOT = Path(__file__).resolve().parents[2]
WORKER = "http://w0:8000"


def request_line(custom_id: str, *, url: str = "/v1/chat/completions", **body: Any) -> str:
    if url == "/v1/chat/completions":
        payload: dict[str, Any] = {"model": "fake-model", "messages": [{"role": "user", "content": custom_id}]}
    else:
        payload = {"model": "fake-model", "prompt": custom_id}
    payload.update(body)
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": payload})


def write_input(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def read_output(path: Path) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    assert raw == b"" or raw.endswith(b"\n")
    return [json.loads(line) for line in raw.splitlines()]


def by_custom_id(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    counts = Counter(r["custom_id"] for r in records if not r["id"].startswith("batch_req_line_"))
    assert all(n == 1 for n in counts.values()), counts
    return {r["custom_id"]: r for r in records if not r["id"].startswith("batch_req_line_")}


async def run_batch(
    tmp_path: Path,
    lines: list[str],
    transport: httpx.AsyncBaseTransport,
    *,
    stderr: io.StringIO | None = None,
    **opts: Any,
) -> tuple[BatchSummary, list[dict[str, Any]], str]:
    inp = tmp_path / "in.jsonl"
    if not inp.exists():
        write_input(inp, lines)
    out = tmp_path / "out.jsonl"
    err = stderr if stderr is not None else io.StringIO()
    async with httpx.AsyncClient(transport=transport) as client:
        runner = BatchRunner(BatchOptions(inp, out, **opts), client, WORKER, stderr=err, is_tty=False)
        summary = await runner.run()
    return summary, read_output(out), err.getvalue()


# -- the runner against a fake worker, virtual time ------------------------------------------------


async def test_every_line_answered_with_the_batch_headers_and_usage(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    worker = FakeWorker()
    lines = [request_line(f"q{i}") for i in range(5)] + [request_line("c0", url="/v1/completions")]
    summary, records, err = await run_batch(tmp_path, lines, worker.transport(), api_key="sk-test")
    assert (summary.total, summary.ok, summary.failed, summary.malformed) == (6, 6, 0, 0)
    assert summary.exit_code == 0
    assert (summary.prompt_tokens, summary.completion_tokens) == (5 * 11 + 5, 5 * 3 + 2)
    got = by_custom_id(records)
    assert set(got) == {"q0", "q1", "q2", "q3", "q4", "c0"}
    q0 = got["q0"]
    assert q0["id"].startswith("batch_req_") and q0["error"] is None
    assert q0["response"]["status_code"] == 200
    assert q0["response"]["body"]["choices"][0]["message"]["content"] == "Hello world"
    seen = {r.body["messages"][0]["content"] if "messages" in r.body else r.body["prompt"]: r for r in worker.requests}
    for cid, request in seen.items():
        assert request.headers["x-agentd-class"] == "batch"
        assert request.headers["x-request-id"] == cid
        assert request.headers["authorization"] == "Bearer sk-test"
        assert request.headers["content-type"] == "application/json"
    assert seen["c0"].path == "/v1/completions" and seen["q3"].path == "/v1/chat/completions"
    assert err == ""


async def test_malformed_and_duplicate_lines_are_recorded_and_do_not_stop_the_run(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    worker = FakeWorker()
    lines = [
        request_line("a"),
        "{broken",
        request_line("b", stream=True),
        "",
        request_line("a"),
        request_line("c"),
    ]
    summary, records, err = await run_batch(tmp_path, lines, worker.transport())
    assert (summary.total, summary.ok, summary.malformed) == (5, 2, 3)
    assert summary.exit_code == 0  # every *valid* line got a 2xx
    errors = {r["id"]: r for r in records if r["error"] is not None}
    assert set(errors) == {"batch_req_line_2", "batch_req_line_3", "batch_req_line_5"}
    assert errors["batch_req_line_2"]["custom_id"] is None
    assert errors["batch_req_line_2"]["error"]["code"] == "invalid_request"
    assert errors["batch_req_line_3"]["error"]["message"].startswith("line 3: body.stream: must be false")
    assert errors["batch_req_line_5"]["error"]["code"] == "duplicate_custom_id"
    assert errors["batch_req_line_5"]["custom_id"] == "a"
    assert [r.body["messages"][0]["content"] for r in worker.requests] == ["a", "c"]
    assert "agentd batch: line 2: not valid JSON" in err and "line 5: custom_id: duplicate of line 1" in err


async def test_worker_errors_are_responses_and_retried_when_transient(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    worker = FakeWorker()
    worker.fail_status = 400
    summary, records, _ = await run_batch(tmp_path / "a", [request_line("x")], worker.transport())
    assert summary.failed == 1 and summary.exit_code == 1
    assert records[0]["response"]["status_code"] == 400 and records[0]["error"] is None
    assert records[0]["response"]["body"] == {"error": {"message": "worker exploded"}}
    assert len(worker.requests) == 1  # a 400 is not retried

    worker = FakeWorker()
    worker.fail_status = 503
    start = trio.current_time()
    summary, records, _ = await run_batch(tmp_path / "b", [request_line("x")], worker.transport())
    assert len(worker.requests) == 3  # max_attempts
    assert trio.current_time() - start == pytest.approx(1.0 + 2.0)  # back-off doubles
    assert records[0]["response"]["status_code"] == 503 and summary.exit_code == 1


async def test_a_transport_error_after_retries_is_an_error_record(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    worker = FakeWorker()
    worker.unreachable.add(WORKER)
    summary, records, _ = await run_batch(tmp_path, [request_line("x")], worker.transport(), max_attempts=2)
    assert (summary.failed, summary.exit_code) == (1, 1)
    (record,) = records
    assert record["response"] is None
    assert record["error"]["code"] == "connection_error"
    assert "after 2 attempts" in record["error"]["message"]


async def test_a_429_waits_for_retry_after_then_succeeds(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    calls: list[float] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(trio.current_time())
        if len(calls) == 1:
            return httpx.Response(429, headers={"retry-after": "7"}, json={"error": {"message": "busy"}})
        return httpx.Response(200, json={"ok": True, "usage": {"prompt_tokens": 1, "completion_tokens": 2}})

    summary, records, _ = await run_batch(tmp_path, [request_line("x")], httpx.MockTransport(handler))
    assert calls[1] - calls[0] == 7.0
    assert records[0]["response"]["status_code"] == 200 and summary.exit_code == 0


async def test_concurrency_is_bounded(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    active = 0
    peak = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await trio.sleep(1.0)
        active -= 1
        return httpx.Response(200, json={})

    start = trio.current_time()
    summary, records, _ = await run_batch(
        tmp_path, [request_line(f"q{i}") for i in range(10)], httpx.MockTransport(handler), concurrency=3
    )
    assert peak == 3
    assert trio.current_time() - start == 4.0  # ceil(10 / 3) rounds of one second
    assert len(by_custom_id(records)) == 10 and summary.ok == 10


async def test_resume_after_a_crash_truncates_the_partial_line_and_answers_each_id_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    lines = [request_line(f"q{i}") for i in range(8)] + ["not json"]
    worker = FakeWorker()
    await run_batch(tmp_path, lines, worker.transport())
    out = tmp_path / "out.jsonl"
    full = out.read_bytes().splitlines(keepends=True)
    assert len(full) == 9
    # a crash: 3 whole records survived (q-lines and maybe the error line), the 4th was cut mid-write
    kept = full[:3]
    out.write_bytes(b"".join(kept) + full[3][:17])
    answered = {json.loads(r)["custom_id"] for r in kept}

    worker = FakeWorker()
    summary, records, _ = await run_batch(tmp_path, lines, worker.transport())
    assert summary.truncated_bytes == 17
    assert summary.resumed == 3 and summary.answered == 9 and summary.exit_code == 0
    assert len(records) == 9
    assert set(by_custom_id(records)) == {f"q{i}" for i in range(8)}
    assert sum(1 for r in records if r["id"] == "batch_req_line_9") == 1
    sent = {r.headers["x-request-id"] for r in worker.requests}
    assert sent == {f"q{i}" for i in range(8)} - answered
    assert records[:3] == [json.loads(r) for r in kept]

    # a third run has nothing to do
    worker = FakeWorker()
    summary, records, _ = await run_batch(tmp_path, lines, worker.transport())
    assert summary.resumed == 9 and worker.requests == [] and len(records) == 9


async def test_previous_failures_keep_the_exit_code_and_restart_overwrites(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    lines = [request_line("a"), request_line("b")]
    worker = FakeWorker()
    worker.fail_status = 500
    summary, _, _ = await run_batch(tmp_path, lines, worker.transport())
    assert summary.exit_code == 1
    worker = FakeWorker()
    summary, _, _ = await run_batch(tmp_path, lines, worker.transport())
    assert (summary.resumed, summary.prior_failed, summary.exit_code) == (2, 2, 1) and worker.requests == []
    summary, records, _ = await run_batch(tmp_path, lines, worker.transport(), restart=True)
    assert summary.exit_code == 0 and len(records) == 2
    assert all(r["response"]["status_code"] == 200 for r in records)


async def test_retry_failed_sends_only_the_failed_lines_again(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    lines = [request_line("a"), "junk", request_line("b"), request_line("c")]
    failing = {"b"}

    async def handler(request: httpx.Request) -> httpx.Response:
        cid = request.headers["x-request-id"]
        return httpx.Response(500 if cid in failing else 200, json={"id": cid})

    summary, first, _ = await run_batch(tmp_path, lines, httpx.MockTransport(handler))
    assert (summary.ok, summary.failed, summary.malformed, summary.exit_code) == (2, 1, 1, 1)
    failing.clear()
    worker = FakeWorker()
    summary, records, _ = await run_batch(tmp_path, lines, worker.transport(), retry_failed=True)
    assert [r.headers["x-request-id"] for r in worker.requests] == ["b"]
    assert (summary.resumed, summary.ok, summary.prior_failed, summary.exit_code) == (3, 1, 0, 0)
    assert len(records) == 4 and len(by_custom_id(records)) == 3
    assert by_custom_id(records)["b"]["response"]["status_code"] == 200
    assert [r for r in first if r["custom_id"] != "b"] == records[:3]


async def test_stop_finishes_in_flight_requests_sends_no_more_and_a_rerun_completes(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    sent: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers["x-request-id"])
        await trio.sleep(1.0)
        return httpx.Response(200, json={"usage": {"completion_tokens": 4}})

    inp = write_input(tmp_path / "in.jsonl", [request_line(f"q{i}") for i in range(10)])
    out = tmp_path / "out.jsonl"
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        runner = BatchRunner(BatchOptions(inp, out, concurrency=2), client, WORKER, stderr=io.StringIO())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner.run)
            await trio.sleep(1.5)  # round 1 done (2 records), round 2 in flight
            runner.request_stop()
        assert runner.summary.stopped and runner.summary.exit_code == 1
        assert len(sent) == 4 and len(read_output(out)) == 4  # in-flight ones finished, nothing new sent

        runner = BatchRunner(BatchOptions(inp, out, concurrency=2), client, WORKER, stderr=io.StringIO())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner.run)
            await trio.sleep(0.5)  # q4, q5 in flight
            runner.request_stop(cancel_in_flight=True)
        assert len(sent) == 6 and len(read_output(out)) == 4  # cancelled: no record, no half line

        summary = await BatchRunner(BatchOptions(inp, out), client, WORKER, stderr=io.StringIO()).run()
    assert summary.exit_code == 0 and summary.resumed == 4 and summary.ok == 6
    assert set(by_custom_id(read_output(out))) == {f"q{i}" for i in range(10)}


async def test_progress_on_a_terminal_and_in_plain_lines(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        await trio.sleep(0.8)  # rounds end at 0.8 k s: never at a progress tick (10 s)
        return httpx.Response(200, json={"usage": {"prompt_tokens": 1, "completion_tokens": 10}})

    inp = write_input(tmp_path / "in.jsonl", [request_line(f"q{i}") for i in range(40)])
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        plain = io.StringIO()
        opts = BatchOptions(inp, tmp_path / "plain.jsonl", concurrency=2)
        await BatchRunner(opts, client, WORKER, stderr=plain, is_tty=False).run()
        tty = io.StringIO()
        opts = BatchOptions(inp, tmp_path / "tty.jsonl", concurrency=2)
        await BatchRunner(opts, client, WORKER, stderr=tty, is_tty=True).run()
    # 16 s of work: one plain line at 10 s (12 rounds = 24 answered, 24 tok/s, 16 left at 2.4/s: ETA 7 s)
    assert plain.getvalue() == "agentd batch: 24/40 answered  failed 0  in flight 2  24 tok/s  ETA 7s\n"
    frames = tty.getvalue().split("\r\x1b[K")
    assert len(frames) > 40
    assert frames[-1] == "[########################] 40/40 answered  failed 0  in flight 0  25 tok/s  ETA 0s\n"
    assert any(f.startswith("[############------------] 20/40") for f in frames)


def test_an_output_file_that_is_not_a_batch_output_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "batch_req_1", "custom_id": "a", "response": null, "error": null}\n{"hello": 1}\n')
    with pytest.raises(OutputFileError, match="line 2 is not a batch output record"):
        scan_output(out)


# -- through a real agentd: the headers reach the worker ----------------------------------------------


async def test_batch_headers_reach_the_worker_through_agentd(tmp_path: Path) -> None:
    worker = FakeWorker()
    inp = write_input(tmp_path / "in.jsonl", [request_line("q1"), request_line("#job_name[evals]#q2")])
    out = tmp_path / "out.jsonl"
    async with trio.open_nursery() as nursery:
        handles = await nursery.start(partial(run_daemon, make_config(), transport_factory=worker.transport))
        async with httpx.AsyncClient(timeout=BUDGET_SECONDS) as client:
            summary = await BatchRunner(BatchOptions(inp, out), client, handles.http_url + "/v1/").run()
        handles.request_shutdown()
    assert summary.exit_code == 0
    # the worker sees the custom_id (job tag included) joined to agentd's unique request id
    got = {r.headers["x-request-id"].split("-agentd-")[0]: r.headers for r in worker.generation_requests()}
    assert set(got) == {"q1", "#job_name[evals]#q2"}
    assert all(h["x-agentd-class"] == "batch" for h in got.values())
    assert set(by_custom_id(read_output(out))) == {"q1", "#job_name[evals]#q2"}


# -- the command: --config with the embedded simulator, usage errors, Ctrl-C ---------------------------


def fast_sim_config(tmp_path: Path, time_scale: float = 100.0) -> Path:
    path = tmp_path / f"sim-{time_scale}.toml"
    path.write_text(f"[embedded]\ndp_size = 2\nnum_gpu_blocks = 1024\ntime_scale = {time_scale}\nmodel = 'sim'\n")
    return path


def test_config_mode_runs_against_the_embedded_simulator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = [request_line(f"q{i}", model="sim", max_tokens=4) for i in range(12)]
    lines += [request_line(f"c{i}", url="/v1/completions", model="sim", max_tokens=3) for i in range(3)]
    lines.insert(5, '{"custom_id": "bad", "method": "GET"}')
    inp = write_input(tmp_path / "in.jsonl", lines)
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    argv = [
        "batch",
        "-i",
        str(inp),
        "-o",
        str(out),
        "--config",
        str(fast_sim_config(tmp_path)),
        "--errors",
        str(errors),
    ]
    code = cli.main([*argv, "--concurrency", "4"])
    err = capsys.readouterr().err
    assert code == 0, err
    records = read_output(out)
    assert len(records) == 16
    ok = by_custom_id(records)
    assert ok["q3"]["response"]["body"]["usage"]["completion_tokens"] == 4
    assert ok["c1"]["response"]["body"]["usage"]["completion_tokens"] == 3
    (bad,) = [r for r in records if r["id"] == "batch_req_line_6"]
    assert bad["custom_id"] == "bad" and bad["error"]["message"] == 'line 6: method: must be "POST" (got "GET")'
    assert read_output(errors) == [bad]
    assert "line 6: method" in err
    assert "16 lines: 15 ok, 0 failed, 1 malformed; tokens" in err


def agentd(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "daemon", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_help_and_a_bad_flag_as_a_process() -> None:
    done = agentd("batch", "--help")
    assert done.returncode == 0
    for flag in ("--input", "--output", "--target", "--config", "--concurrency", "--restart", "exit codes"):
        assert flag in done.stdout
    done = agentd("batch", "-i", "in.jsonl", "-o", "out.jsonl", "--target", "http://x", "--concurrency", "0")
    assert (done.returncode, done.stdout) == (2, "")
    assert "argument --concurrency: must be an integer >= 1, got '0'" in done.stderr


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    try:
        code = cli.main(["batch", *argv])
    except SystemExit as exit:  # argparse's own errors
        code = exit.code  # type: ignore[assignment]
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), err
    return err


def test_usage_errors_exit_2_naming_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inp = str(write_input(tmp_path / "in.jsonl", [request_line("a")]))
    out = str(tmp_path / "o.jsonl")
    assert "not allowed with argument" in usage_error(
        capsys, "-i", inp, "-o", out, "--target", "http://x", "--config", "c"
    )
    assert "one of --target URL or --config FILE is required" in usage_error(capsys, "-i", inp, "-o", out)
    err = usage_error(capsys, "-i", inp, "-o", out, "--target", "localhost:3001")
    assert "--target: must be an http:// or https:// URL with a host" in err
    assert "--target: must be" in usage_error(capsys, "-i", inp, "-o", out, "--target", "http://")
    assert "not allowed with argument --restart" in usage_error(
        capsys, "-i", inp, "-o", out, "--target", "http://x", "--restart", "--retry-failed"
    )
    err = usage_error(capsys, "-i", str(tmp_path / "missing"), "-o", out, "--target", "http://x")
    assert "--input: no such file" in err
    assert "--output: must be a file other than the input" in usage_error(
        capsys, "-i", inp, "-o", inp, "--target", "http://x"
    )
    err = usage_error(capsys, "-i", inp, "-o", str(tmp_path / "nodir" / "o.jsonl"), "--target", "http://x")
    assert "--output: directory does not exist" in err
    notours = tmp_path / "notours.jsonl"
    notours.write_text("hello\n")
    err = usage_error(capsys, "-i", inp, "-o", str(notours), "--target", "http://x")
    assert "--output " in err and "line 1 is not JSON; use --restart" in err
    assert notours.read_text() == "hello\n"
    bad_config = tmp_path / "bad.toml"
    bad_config.write_text("[embedded]\ndp_size = 0\n")
    assert "embedded.dp_size" in usage_error(capsys, "-i", inp, "-o", out, "--config", str(bad_config))
    assert not Path(out).exists()


async def test_ctrl_c_leaves_a_valid_file_exits_130_and_a_rerun_resumes(tmp_path: Path) -> None:
    lines = [request_line(f"q{i}", model="sim", max_tokens=64) for i in range(30)]
    inp = write_input(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    slow = fast_sim_config(tmp_path, time_scale=1.0)
    cmd = [sys.executable, "-m", "daemon", "batch", "-i", str(inp), "-o", str(out), "--config", str(slow)]
    proc = await trio.lowlevel.open_process(
        [*cmd, "--concurrency", "2"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        with trio.fail_after(BUDGET_SECONDS):
            while not (out.exists() and out.stat().st_size > 0):  # noqa: ASYNC110 (another process writes it)
                await trio.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            code = await proc.wait()
            assert proc.stderr is not None
            err = (await proc.stderr.receive_some(1 << 20)).decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert code == 130, err
    assert "rerun the same command to resume" in err
    first = read_output(out)
    assert 1 <= len(first) < 30
    fast = fast_sim_config(tmp_path)
    done = await trio.to_thread.run_sync(
        lambda: agentd("batch", "-i", str(inp), "-o", str(out), "--config", str(fast), "--concurrency", "8")
    )
    assert done.returncode == 0, done.stderr
    records = read_output(out)
    assert records[: len(first)] == first
    assert set(by_custom_id(records)) == {f"q{i}" for i in range(30)}
    assert f"{len(first)} already in the output" in done.stderr


def test_embeddings_lines_run_against_the_embedded_simulator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # /v1/embeddings is a batch route since session 33 (docs/batch.md §3; a malformed line before)
    embed = [
        json.dumps(
            {
                "custom_id": f"e{i}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": "sim", "input": f"doc {i}"},
            }
        )
        for i in range(3)
    ]
    inp = write_input(tmp_path / "in.jsonl", [*embed, request_line("q0", model="sim", max_tokens=2)])
    out = tmp_path / "out.jsonl"
    code = cli.main(["batch", "-i", str(inp), "-o", str(out), "--config", str(fast_sim_config(tmp_path))])
    err = capsys.readouterr().err
    assert code == 0, err
    ok = by_custom_id(read_output(out))
    assert set(ok) == {"e0", "e1", "e2", "q0"}
    for i in range(3):
        body = ok[f"e{i}"]["response"]["body"]
        assert ok[f"e{i}"]["response"]["status_code"] == 200 and len(body["data"][0]["embedding"]) == 64
    assert "4 lines: 4 ok, 0 failed, 0 malformed" in err
