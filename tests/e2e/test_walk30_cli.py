"""The session-30 walk's command-line findings: ``-`` where a command does not read standard input
or write standard output.  ``agentd trace`` reads and writes ``-`` (docs/traces.md); ``agentd batch
-o -`` wrote a file named ``-`` in the current directory and said ``results in -``, and ``replay``,
``simulate``, ``bench`` and ``check-fairness`` did the same with ``--out -`` (a file or a directory
named ``-``).  Each is now an exit 2 naming the flag, before any work."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon import cli

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.toml"
LINE = {
    "custom_id": "a",
    "method": "POST",
    "url": "/v1/chat/completions",
    "body": {"model": "m", "messages": [{"role": "user", "content": "x"}]},
}


@pytest.fixture
def in_tmp(tmp_path: Path) -> Iterator[Path]:
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(old)


@pytest.mark.parametrize(
    ("argv", "flag", "stream"),
    [
        (["batch", "-i", "in.jsonl", "-o", "-", "--target", "http://127.0.0.1:9"], "--output", "standard output"),
        (["batch", "-i", "-", "-o", "out.jsonl", "--target", "http://127.0.0.1:9"], "--input", "standard input"),
        (
            ["batch", "-i", "in.jsonl", "-o", "o.jsonl", "--errors", "-", "--target", "http://127.0.0.1:9"],
            "--errors",
            "standard output",
        ),
        (["replay", "--trace", "t.jsonl", "--target", "http://127.0.0.1:9", "--out", "-"], "--out", "standard output"),
        (["simulate", "--config", "c.toml", "--trace", "t.jsonl", "--out", "-"], "--out", "standard output"),
        (["check-fairness", "--config", str(QUICKSTART), "--out", "-"], "--out", "a directory"),
        (["bench", "--trace", "t.jsonl", "--out", "-"], "--out", "a directory"),
    ],
)
def test_a_dash_where_no_stream_is_read_or_written_is_refused_naming_the_flag(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], argv: list[str], flag: str, stream: str
) -> None:
    (in_tmp / "in.jsonl").write_text(json.dumps(LINE) + "\n")
    (in_tmp / "c.toml").write_text("")
    assert cli.main(["trace", "synth", "--profile", "swe-short", "--programs", "1", "--out", "t.jsonl"]) == 0
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"{flag}: '-'" in err and stream in err, err
    assert not (in_tmp / "-").exists()
