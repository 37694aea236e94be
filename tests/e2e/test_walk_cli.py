"""What a new user's walk through README.md and docs/ found in the commands (session 25).

Each test is one mistake a user makes with a documented command, and checks that the command says
so at once - exit 2, one line naming the flag - instead of a traceback after minutes of work or a
misleading message.  The commands run in this process through ``daemon.cli.main``; none of them
gets far enough to open a socket or start a simulation.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from daemon import cli

QUICKSTART = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.toml")


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run ``agentd ARGV``; it must exit 2 with nothing on stdout.  Returns stderr."""
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), err
    assert "Traceback" not in err
    return err.strip()


def test_trace_synth_and_merge_refuse_an_unwritable_out_before_writing(
    tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nodir" / "x.jsonl"
    synth = ["trace", "synth", "--profile", "swe-short", "--programs", "2"]
    err = usage_error(capsys, *synth, "--out", str(missing))
    assert err == f"agentd trace synth: --out: directory does not exist: {missing.parent}"
    err = usage_error(capsys, *synth, "--out", str(tmp_path))
    assert err == f"agentd trace synth: --out: is a directory, give a file name: {tmp_path}"
    err = usage_error(capsys, "trace", "merge", trace, trace, "-o", str(missing))
    assert err == f"agentd trace merge: --out: directory does not exist: {missing.parent}"
    assert not missing.parent.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.jsonl"]  # no temporary file left


def test_trace_help_names_every_action(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["trace", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(synth)" in text and "(merge)" in text and "(stats)" in text


def test_simulate_and_replay_refuse_an_unwritable_out_before_running(
    tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nodir" / "report.json"
    err = usage_error(capsys, "simulate", "--config", QUICKSTART, "--trace", trace, "--out", str(missing))
    assert err == f"agentd simulate: --out: directory does not exist: {missing.parent}"
    err = usage_error(capsys, "simulate", "--config", QUICKSTART, "--trace", trace, "--out", str(tmp_path))
    assert err == f"agentd simulate: --out: is a directory, give a file name: {tmp_path}"
    # the target refuses connections: without the check the replay ran (every request failing)
    # and then died on the report's path
    err = usage_error(capsys, "replay", "--trace", trace, "--target", "http://127.0.0.1:1", "--out", str(missing))
    assert err == f"agentd replay: --out: directory does not exist: {missing.parent}"


def test_simulate_prints_no_bare_warning_event(tmp_path: Path) -> None:
    """Python's last-resort handler printed the daemon's start-up warning as its bare event name
    ("program_scheduling_reference_calibration") on stderr of every ``agentd simulate``.  A real
    process: under pytest the root logger has handlers, so the last resort never shows."""
    trace = tmp_path / "one.jsonl"
    assert cli.main(["trace", "synth", "--profile", "chat-human", "--programs", "1", "--out", str(trace)]) == 0
    report = tmp_path / "sim.json"
    argv = ["simulate", "--config", QUICKSTART, "--trace", str(trace), "--out", str(report)]
    done = subprocess.run([sys.executable, "-m", "daemon", *argv], capture_output=True, text=True, timeout=600)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert json.loads(report.read_text())["requests"]["failed"] == 0


def test_calibrate_refuses_an_unwritable_out_before_probing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 127.0.0.1:1 refuses: without the check this was "cannot reach the target", exit 1
    err = usage_error(capsys, "calibrate", "--target", "http://127.0.0.1:1", "--out", str(tmp_path))
    assert err == f"agentd calibrate: --out: is a directory, give a file name: {tmp_path}"


def test_bench_and_check_fairness_refuse_an_out_that_cannot_be_a_directory(
    tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    err = usage_error(capsys, "bench", "--trace", trace, "--out", str(a_file), "--systems", "native")
    assert err == f"agentd bench: --out: exists and is not a directory: {a_file}"
    err = usage_error(capsys, "bench", "--trace", trace, "--out", str(a_file / "sub"), "--systems", "native")
    assert err == f"agentd bench: --out: cannot create {a_file / 'sub'}: {a_file} is not a directory"
    deeper = a_file / "sub" / "deeper"
    err = usage_error(capsys, "check-fairness", "--config", QUICKSTART, "--out", str(deeper))
    assert err == f"agentd check-fairness: --out: cannot create {deeper}: {a_file} is not a directory"
    assert a_file.read_text() == "x"


def test_batch_refuses_a_directory_for_input_or_errors_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}\n')
    out = tmp_path / "out.jsonl"
    target = ("--target", "http://127.0.0.1:1")
    err = usage_error(capsys, "batch", "-i", str(tmp_path), "-o", str(out), *target)
    assert err == f"agentd batch: error: --input: is a directory, not a file: {tmp_path}"
    err = usage_error(capsys, "batch", "-i", "/dev/null", "-o", str(out), *target)
    assert err == "agentd batch: error: --input: not a regular file: /dev/null"
    # --errors is written at the end: a directory there was a traceback after the whole run
    err = usage_error(capsys, "batch", "-i", str(inp), "-o", str(out), "--errors", str(tmp_path), *target)
    assert err == f"agentd batch: error: --errors: is a directory, give a file name: {tmp_path}"
    assert not out.exists()


def test_sim_backend_on_a_port_in_use_exits_2_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """It was a traceback (an exception group around ``ListenError: server.port ...``), exit 1."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = usage_error(capsys, "sim-backend", "--port", str(port))
    assert err.startswith(f"agentd sim-backend: --port: cannot listen on 127.0.0.1:{port}: ")
    assert "(errno " in err and len(err.splitlines()) == 1


def test_ctrl_c_during_simulate_exits_130_without_a_traceback_or_a_report(tmp_path: Path) -> None:
    """The KeyboardInterrupt arrived inside Trio's exception group, which ``agentd`` did not
    recognise: a traceback and exit 1.  The report is written only at the end, whole."""
    trace = tmp_path / "swe.jsonl"
    assert cli.main(["trace", "synth", "--profile", "swe-short", "--programs", "32", "--out", str(trace)]) == 0
    report = tmp_path / "sim.json"
    argv = ["simulate", "--config", QUICKSTART, "--trace", str(trace), "--out", str(report), "--progress"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        seen = ""
        while "simulate" not in seen:  # the progress line: the simulation runs
            char = proc.stderr.read(1)
            assert char, seen
            seen += char
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert (proc.returncode, out) == (130, "")
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["swe.jsonl"]


def test_bench_on_ports_in_use_exits_2_naming_port_base(
    tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A port in use is bad input for the bench as for ``agentd start`` (exit 2, not 1)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["bench", "--trace", trace, "--out", str(tmp_path / "b"), "--systems", "native"]
        err = usage_error(capsys, *argv, "--port-base", str(port))
    assert err.startswith(f"agentd bench: --port-base: port {port} (of {port}..{port + 3}) is in use")


def test_batch_config_daemon_runs_no_batch_api_and_no_extra_listeners(tmp_path: Path) -> None:
    """``agentd batch --config FILE`` starts a daemon for its own requests only.  It used to keep the
    file's Batch API (whose executor resumes the unfinished batches of the database a running daemon
    of the same file owns: requests sent twice) and admin listener (a port in use)."""
    from daemon.commands.batch import _load_daemon_config

    config = tmp_path / "agentd.toml"
    config.write_text(
        f'[admin]\nport = 3002\n[prometheus]\nhost = "127.0.0.1"\nport = 29000\n'
        f'[batch_api]\ndatabase_path = "{tmp_path / "batches.sqlite3"}"\n'
    )
    cfg = _load_daemon_config(str(config))
    assert (cfg.server.host, cfg.server.port, cfg.admin.port, cfg.prometheus.port) == ("127.0.0.1", 0, None, None)
    assert cfg.batch_api.enabled is False


def test_replay_says_why_it_exits_1(tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Against a target that refuses connections the replay exited 1 with nothing on stderr."""
    report = tmp_path / "r.json"
    argv = ["replay", "--trace", trace, "--target", "http://127.0.0.1:1", "--out", str(report), "--no-progress"]
    assert cli.main(argv) == 1
    out, err = capsys.readouterr()
    failed = json.loads(report.read_text())["requests"]
    assert failed["failed"] == 2 and failed["completed"] == 0  # one per root Program: its first request
    assert out == ""
    planned = failed["planned"]
    assert err.strip() == f"agentd replay: 2 of {planned} planned requests failed (ConnectError: 2); 0 completed"


def test_replay_and_calibrate_accept_an_openai_base_url(
    tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``agentd batch --target`` took ``.../v1`` (what OpenAI clients call the base URL); replay and
    calibrate sent to ``.../v1/v1/...`` and got a 404 for every request."""
    report = tmp_path / "r.json"
    argv = ["replay", "--trace", trace, "--target", "http://127.0.0.1:1/v1/", "--out", str(report), "--no-progress"]
    assert cli.main(argv) == 1
    errors = json.loads(report.read_text())["metrics_errors"]
    assert errors and all(e.startswith("http://127.0.0.1:1/metrics: ") for e in errors)
    capsys.readouterr()
    assert cli.main(["calibrate", "--target", "http://127.0.0.1:1/v1", "--max-seconds", "30"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach http://127.0.0.1:1/v1/completions:" in err and "/v1/v1" not in err


def test_batch_of_a_file_without_one_valid_request_exits_1(
    tmp_path: Path, trace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace (another JSONL format) given as batch input: every line malformed, and exit 0 said
    the run succeeded.  No request is sent, so the target is never contacted."""
    out = tmp_path / "out.jsonl"
    assert cli.main(["batch", "-i", trace, "-o", str(out), "--target", "http://127.0.0.1:1"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith(f"agentd batch: no line of {trace} is a valid request (see the lines above)")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records and all(r["error"]["code"] == "invalid_request" for r in records)
