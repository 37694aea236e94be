"""What a new user's walk found in ``agentd replay`` and ``agentd calibrate`` (session 25).

``agentd replay`` could not drive an agentd with API keys (every request a 401): ``--api-key``,
default ``$OPENAI_API_KEY`` as ``agentd batch``, sent to the target only.  The daemon is a real
``agentd start`` process (embedded simulated backend); the replay runs in this process.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from bench.commands.common import TargetBearer
from daemon import cli

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-walk-0123456789"


@pytest.fixture
def keyed_agentd(tmp_path: Path) -> Iterator[str]:
    """``agentd start`` with one API key, fast simulated workers; yields its URL."""
    config = tmp_path / "agentd.toml"
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    config.write_text(
        f'[server]\nport = 0\n[auth]\napi_keys = ["team-a:{digest}"]\n[embedded]\ntime_scale = 50.0\n'
        f'[batch_api]\ndatabase_path = "{tmp_path / "batches.sqlite3"}"\n'
    )
    with started(config) as (proc, url):
        yield url
        proc.terminate()
        assert proc.wait(timeout=180) == 0


@contextmanager
def started(config: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``agentd start --config config`` as a process, with the URL it printed; killed at the end."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon", "start", "--config", str(config)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.fullmatch(r"agentd listening on (http://127\.0\.0\.1:\d+)\n", line)
        assert match, line
        yield proc, match.group(1)
    finally:
        proc.kill()
        proc.wait()


def replay(
    capsys: pytest.CaptureFixture[str], trace: str, url: str, out: Path, *extra: str
) -> tuple[int, dict[str, int], str]:
    argv = ["replay", "--trace", trace, "--target", url, "--out", str(out), "--no-progress", "--time-scale", "50"]
    code = cli.main([*argv, *extra])
    err = capsys.readouterr().err
    return code, json.loads(out.read_text())["requests"], err


def test_replay_sends_the_api_key_from_the_flag_or_the_environment(
    tmp_path: Path, trace: str, keyed_agentd: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out = tmp_path / "r.json"
    code, requests, err = replay(capsys, trace, keyed_agentd, out)
    assert code == 1 and requests["completed"] == 0 and requests["failed"] == 2, err  # 401 for each root
    planned = requests["planned"]
    code, requests, err = replay(capsys, trace, keyed_agentd, out, "--api-key", KEY)
    assert (code, requests["completed"], requests["failed"]) == (0, planned, 0), err
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    code, requests, err = replay(capsys, trace, keyed_agentd, out)
    assert (code, requests["completed"], requests["failed"]) == (0, planned, 0), err
    code, requests, err = replay(capsys, trace, keyed_agentd, out, "--api-key", "")  # "" sends none
    assert code == 1 and requests["completed"] == 0, err


def test_a_key_with_whitespace_is_a_usage_error_naming_its_source(
    trace: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    base = ["replay", "--trace", trace, "--target", "http://127.0.0.1:1"]
    assert cli.main([*base, "--api-key", "sk-a b"]) == 2
    assert capsys.readouterr().err == "agentd replay: --api-key: the key contains whitespace or control characters\n"
    monkeypatch.setenv("OPENAI_API_KEY", "sk-a\n")
    assert cli.main(["calibrate", "--target", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err == "agentd calibrate: $OPENAI_API_KEY: the key contains whitespace or control characters\n"


def test_the_key_goes_to_the_target_only() -> None:
    """``--worker-metrics`` URLs are other servers: they never see the target's key."""
    seen: list[tuple[str, str | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((str(request.url), request.headers.get("authorization")))
        return httpx.Response(200)

    auth = TargetBearer("http://agentd.example:3001", KEY)
    with httpx.Client(transport=httpx.MockTransport(handler), auth=auth) as client:
        for url in (
            "http://agentd.example:3001/v1/chat/completions",
            "http://agentd.example:3001/metrics",
            "http://worker.example:8000/metrics",
            "http://agentd.example:8000/metrics",
            "https://agentd.example:3001/metrics",
        ):
            client.get(url)
    assert [header for _, header in seen] == [f"Bearer {KEY}", f"Bearer {KEY}", None, None, None]


def interrupted(argv: list[str], tmp_path: Path, marker: str) -> str:
    """Run ``agentd ARGV`` until ``marker`` is on its stderr (its progress line), send SIGINT: it
    must exit 130 with nothing on stdout and no traceback.  Returns stderr (bytes decoded as they
    are: a progress line redraws itself with carriage returns)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon", *argv], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0
    )
    try:
        assert proc.stderr is not None
        seen = b""
        while marker.encode() not in seen:
            char = proc.stderr.read(1)
            assert char, seen
            seen += char
        proc.send_signal(signal.SIGINT)
        out, rest = proc.communicate(timeout=180)
    finally:
        proc.kill()
        proc.wait()
    err = (seen + rest).decode()
    assert (proc.returncode, out) == (130, b""), err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    return err


@pytest.fixture
def slow_agentd(tmp_path: Path) -> Iterator[str]:
    """``agentd start`` on real-time simulated workers (a replay takes a while); yields its URL."""
    config = tmp_path / "slow.toml"
    config.write_text(f'[server]\nport = 0\n[batch_api]\ndatabase_path = "{tmp_path / "slow.sqlite3"}"\n')
    with started(config) as (_, url):
        yield url


def test_ctrl_c_ends_the_progress_line_exits_130_and_writes_no_output(
    tmp_path: Path, trace: str, slow_agentd: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    out = work / "r.json"
    err = interrupted(["replay", "--trace", trace, "--target", slow_agentd, "--out", str(out)], work, "replay [")
    assert err.endswith("\n") and err.count("\n") == 1, repr(err)  # the progress line, ended
    out = work / "c.toml"
    err = interrupted(["calibrate", "--target", slow_agentd, "--out", str(out)], work, "calibrate [")
    assert err.endswith("\n") and err.count("\n") == 1, repr(err)
    assert sorted(p.name for p in work.iterdir()) == []
