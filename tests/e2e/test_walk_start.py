"""What a new user's walk through README.md and docs/ found in ``agentd start`` and
``agentd check-config`` (session 25): files the configuration names that cannot be used are
configuration errors at start - exit 2, a line naming the field - not a traceback at start or a
500 on the first request.  Everything here stops before the daemon would listen."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from daemon import cli


def write_config(tmp_path: Path, database_path: Path) -> str:
    config = tmp_path / "agentd.toml"
    config.write_text(f'[server]\nport = 0\n[batch_api]\ndatabase_path = "{database_path}"\n')
    return str(config)


def config_error(capsys: pytest.CaptureFixture[str], *argv: str) -> list[str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), err
    assert "Traceback" not in err
    return err.splitlines()


def test_a_batch_database_path_that_cannot_be_a_database_is_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_sqlite = tmp_path / "notes.txt"
    not_sqlite.write_text("my notes\n")
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    cases = {
        # a directory and another program's file were opened at start: a traceback, exit 1
        tmp_path: f"batch_api.database_path: {str(tmp_path)!r} is a directory; give the database file's name",
        not_sqlite: f"batch_api.database_path: {str(not_sqlite)!r} is not an SQLite database (another file is "
        "in its place)",
        # a path that cannot be created made every Batch API call a 500 internal_error
        a_file / "sub" / "batches.sqlite3": f"batch_api.database_path: cannot create "
        f"{str(a_file / 'sub' / 'batches.sqlite3')!r}: {str(a_file)!r} is not a writable directory",
    }
    for path, line in cases.items():
        config = write_config(tmp_path, path)
        expected = [f"agentd: invalid configuration ({config}):", f"  {line}"]
        assert config_error(capsys, "check-config", config) == expected
        assert config_error(capsys, "start", "--config", config) == expected  # the same (session 34)
        json_lines = config_error(capsys, "start", "--config", config, "--log-format", "json")
        assert [json.loads(text)["lines"] for text in json_lines] == [[line]]
    assert not_sqlite.read_text() == "my notes\n"


@pytest.mark.parametrize("kind", ["missing", "empty", "sqlite"])
def test_a_usable_batch_database_path_passes_check_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    path = tmp_path / "state" / "batches.sqlite3"
    if kind != "missing":
        path.parent.mkdir()
        path.touch()
    if kind == "sqlite":
        sqlite3.connect(path).execute("create table t (x)").connection.close()
    assert cli.main(["check-config", write_config(tmp_path, path)]) == 0
    assert json.loads(capsys.readouterr().out)["batch_api"]["database_path"] == str(path)
    assert path.exists() == (kind != "missing")  # checking creates nothing


def test_start_reports_an_empty_key_file_as_one_json_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The key-file checks printed plain lines in json mode (docs/operations.md §7: config_error)."""
    keys = tmp_path / "keys"
    keys.write_text("# none yet\n")
    lines = config_error(capsys, "start", "--port", "0", "--api-keys-file", str(keys), "--log-format", "json")
    event = json.loads(lines[0])
    assert len(lines) == 1 and event["event"] == "config_error" and event["level"] == "error"
    assert event["lines"][0].startswith(f"auth.api_keys_file: {str(keys)!r} holds no key")


def test_a_bad_http1_override_is_a_json_config_error_in_json_mode(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTD_HTTP1_IMPLEMENTATION", "h3")
    lines = config_error(capsys, "start", "--port", "0", "--log-format", "json")
    assert [json.loads(text)["lines"] for text in lines] == [
        ["AGENTD_HTTP1_IMPLEMENTATION: must be one of agentd, hypercorn, got 'h3'"]
    ]
    assert config_error(capsys, "start", "--port", "0") == [
        "AGENTD_HTTP1_IMPLEMENTATION: must be one of agentd, hypercorn, got 'h3'"
    ]


def test_check_config_without_a_file_says_it_checks_the_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bare ``agentd check-config`` printed the defaults as though they were a file's."""
    assert cli.main(["check-config"]) == 0
    out, err = capsys.readouterr()
    note = "agentd check-config: no PATH given: checking the defaults (what agentd start runs without --config)"
    assert err == note + "\n"
    assert json.loads(out)["server"]["port"] == 3001
    assert cli.main(["check-config", "--port", "3005"]) == 0
    out, err = capsys.readouterr()
    assert err.startswith("agentd check-config: no PATH given: checking the defaults with the flags given (")
    assert json.loads(out)["server"]["port"] == 3005


def test_check_config_takes_the_file_as_start_does_and_reads_an_upper_case_json_suffix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--config PATH`` (as for ``agentd start``) was an unrecognized argument; ``CONFIG.JSON``
    was read as TOML ("is not valid TOML")."""
    config = tmp_path / "AGENTD.JSON"
    config.write_text(json.dumps({"server": {"port": 3007}}))
    for argv in (["check-config", str(config)], ["check-config", "--config", str(config)]):
        assert cli.main(argv) == 0
        out, err = capsys.readouterr()
        assert (json.loads(out)["server"]["port"], err) == (3007, "")
    other = tmp_path / "other.toml"
    other.write_text("")
    assert config_error(capsys, "check-config", str(config), "--config", str(other)) == [
        f"agentd check-config: --config: two files given ({str(config)!r} and --config {str(other)!r}); give one"
    ]
    bad = tmp_path / "bad.Json"
    bad.write_text("port = 3001\n")  # TOML in a .Json file: the JSON error says which reader ran
    header, line = config_error(capsys, "start", "--config", str(bad))
    assert header == f"agentd: invalid configuration ({bad}):"  # as check-config (docs/config.md)
    assert line.startswith(f"  config: {str(bad)!r} is not valid JSON (")
