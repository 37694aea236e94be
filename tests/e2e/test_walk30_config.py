"""The session-30 walk's configuration findings: files written wrong in turn, through the command
line (``agentd check-config F`` and ``agentd start --config F``: exit 2, one line naming the field,
the rule and the value, no traceback) and docs/config.md against every field the loader accepts."""

from __future__ import annotations

import hashlib
import re
import socket
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

from daemon import cli
from daemon.config import AgentdConfig, PriorityRule
from daemon.config_loading import (
    ConfigError,
    _attrs_class_of,
    config_file_warnings,
    config_from_dict,
    config_warnings,
)
from daemon.http.serve import ListenError, create_listening_sockets, hypercorn_config

ROOT = Path(__file__).resolve().parents[2]

# file name -> (content, the line both commands print)
BROKEN: dict[str, tuple[bytes, str]] = {
    # was: "server: invalid value (argument of type 'NoneType' is not iterable)"
    "null-section.json": (b'{"server": null}', "server: must be a table/object (got None)"),
    # was: accepted, port 2 (the last value) served
    "duplicate.json": (b'{"server": {"port": 1, "port": 2}}', "key 'port' is given twice in one object"),
    # was: "is not valid TOML ('utf-8' codec can't decode byte 0xff in position 9: invalid start byte)"
    "binary.toml": (b"[server]\n\xff\xfe", "is not a TOML file: not UTF-8 text (byte 0xff at offset 9)"),
    # was: "([Errno 2] No such file or directory: '/nonexistent/keys')"
    "keys.toml": (
        b'[auth]\napi_keys_file = "/nonexistent/keys"\n',
        "auth.api_keys_file: cannot read '/nonexistent/keys' (No such file or directory)",
    ),
    # was: "(IsADirectoryError)"
    "worker-key.toml": (
        b'[worker_auth]\napi_key_file = "/"\n',
        "worker_auth.api_key_file: cannot read '/' (Is a directory)",
    ),
}


@pytest.mark.parametrize("name", sorted(BROKEN))
@pytest.mark.parametrize("command", ["check-config", "start"])
def test_a_broken_file_is_one_line_naming_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, command: str
) -> None:
    content, expected = BROKEN[name]
    path = tmp_path / name
    path.write_bytes(content)
    argv = [command, str(path)] if command == "check-config" else [command, "--config", str(path)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err, err
    assert "Traceback" not in err


def test_a_byte_order_mark_is_not_part_of_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file saved by an editor that writes a UTF-8 byte-order mark was "Invalid statement (at
    line 1, column 1)" although it looked right."""
    for name, text in (("bom.toml", "[server]\nport = 4321\n"), ("bom.json", '{"server": {"port": 4321}}')):
        path = tmp_path / name
        path.write_bytes(b"\xef\xbb\xbf" + text.encode())
        assert cli.main(["check-config", str(path)]) == 0, capsys.readouterr().err
        assert '"port": 4321' in capsys.readouterr().out


def test_a_file_that_sets_nothing_runs_the_defaults_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "empty.toml"
    path.write_text("# nothing yet\n")
    assert cli.main(["check-config", str(path)]) == 0
    assert "event=config_file_empty" in capsys.readouterr().err
    [warning] = config_file_warnings(path)
    assert "sets no field" in warning.message
    path.write_text("[server]\nport = 3001\n")
    assert config_file_warnings(path) == []


def test_requeueing_long_prefills_with_relay_processes_warns() -> None:
    """Only the in-process proxy takes a long prefill back: with relay processes the setting did
    nothing, without a word (docs/priority.md §3)."""
    priority = {"requeue_long_prefills": True, "long_prefill_seconds": 2, "heavy_tenant_max_active_per_rank": 0}
    workers = {"worker_urls": ["http://w0:8000"]}

    def events(processes: int, **extra: object) -> list[str]:
        raw = {"server": {"data_plane_processes": processes}, "routing": workers, "priority": priority, **extra}
        return [w.event for w in config_warnings(config_from_dict(raw))]

    assert "requeue_long_prefills_with_relays" in events(2)
    assert "requeue_long_prefills_with_relays" not in events(1)
    assert "requeue_long_prefills_with_relays" not in events(2, routing={})  # embedded: one process


def _documented_fields() -> dict[str, set[str]]:
    """Section -> the field names of its table in docs/config.md ("" = the top level)."""
    out: dict[str, set[str]] = {}
    section: str | None = None
    for line in (ROOT / "docs" / "config.md").read_text().splitlines():
        heading = re.match(r"^(#+) (.*)", line)
        if heading:
            name = re.fullmatch(r"`\[(\w+)\]`", heading.group(2))
            if heading.group(1) == "##":
                section = name.group(1) if name else "" if heading.group(2) == "Top level" else None
            continue
        row = re.match(r"^\| `([^`]+)`", line)
        if section is not None and row:
            out.setdefault(section, set()).add(row.group(1).removeprefix(f"{section}.") if section else row.group(1))
    return out


def _fields(cls: type, prefix: str = "") -> set[str]:
    out: set[str] = set()
    for a in attrs.fields(attrs.resolve_types(cls)):
        if a.name in ("explicit_coefficients", "deprecated_inputs"):
            continue
        inner = _attrs_class_of(a.type)
        out |= _fields(inner, f"{prefix}{a.name}.") if inner is not None else {prefix + a.name}
    return out


def test_docs_config_lists_every_field_of_every_section_in_its_own_table_and_no_other() -> None:
    """Each section's table against the loader's fields, both ways (the older check looked for the
    bare name anywhere on the page: `port` was found in any section)."""
    documented = _documented_fields()
    top = attrs.fields(attrs.resolve_types(AgentdConfig))
    expected = {"": {a.name for a in top if _attrs_class_of(a.type) is None}}
    for a in top:
        inner = _attrs_class_of(a.type)
        if inner is not None:
            expected[a.name] = _fields(inner)
    # [[priority.rules]]: an array of tables, documented as rules[].FIELD
    expected["priority"] |= {f"rules[].{a.name}" for a in attrs.fields(PriorityRule)}
    assert documented == expected


def test_the_api_keys_of_a_file_are_still_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"team-a:{hashlib.sha256(b'k').hexdigest()}\n")
    path = tmp_path / "c.toml"
    path.write_text(f'[auth]\napi_keys_file = "{keys}"\n')
    assert cli.main(["check-config", str(path)]) == 0, capsys.readouterr().err


def test_a_worker_policy_for_no_worker_is_an_error() -> None:
    """As ``routing.served_models``: a URL that is not a worker (a typo, another port) was ignored
    and the worker meant kept ``default_worker_policy`` (``priority`` stripped) without a word."""
    workers = {"worker_urls": ["http://w0:8000", "http://w1:8000/"]}
    ok = config_from_dict({"routing": workers, "priority": {"worker_policies": {"http://w1:8000": "priority"}}})
    assert ok.priority_workers() == frozenset({"http://w1:8000"})
    for routing, where in ((workers, "not one of routing.worker_urls"), ({}, "embedded mode has no worker_urls")):
        with pytest.raises(ConfigError) as info:
            config_from_dict({"routing": routing, "priority": {"worker_policies": {"http://w1:8001": "priority"}}})
        assert info.value.lines == [
            f"priority.worker_policies: names a worker that is not in worker_urls ({where}"
            + (": [embedded] scheduling_policy decides" if not routing else "")
            + ") (got 'http://w1:8001')"
        ]


def test_admin_keys_without_api_keys_warn() -> None:
    """Admin keys are asked for only once API keys are configured (docs/operations.md §10.2); alone
    they protected nothing (tests/e2e/test_walk30_http.py shows the route open)."""
    admin = {"admin_keys": [hashlib.sha256(b"admin").hexdigest()]}
    key = f"team-a:{hashlib.sha256(b'k').hexdigest()}"

    def events(raw: dict[str, object]) -> list[str]:
        return [w.event for w in config_warnings(config_from_dict(raw))]

    assert "admin_keys_without_api_keys" in events({"auth": admin})
    assert "admin_keys_without_api_keys" not in events({"auth": {**admin, "api_keys": [key]}})
    assert "admin_keys_without_api_keys" not in events({"auth": admin, "admin": {"port": 3002}})


@pytest.mark.parametrize(
    ("host", "field", "prefix"),
    [("nosuchhost.invalid", "server.port", "server.host"), ("192.0.2.1", "admin.port", "admin.host")],
)
def test_a_host_that_cannot_be_listened_on_is_named_as_the_host(host: str, field: str, prefix: str) -> None:
    """A host that does not resolve, or is no address of this machine, was reported as the port:
    ``server.port: cannot listen on nosuchhost.invalid:3001: Name or service not known``."""
    with pytest.raises(ListenError) as info:
        create_listening_sockets(hypercorn_config(host, 0, 1.0), field)
    [line] = info.value.lines
    assert line.startswith(f"{prefix}: cannot listen on {host}:0: "), line


def test_a_port_in_use_is_still_named_as_the_port() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ListenError) as info:
            create_listening_sockets(hypercorn_config("127.0.0.1", port, 1.0), "server.port")
    assert info.value.lines == [f"server.port: cannot listen on 127.0.0.1:{port}: Address already in use (errno 98)"]


def test_a_config_read_from_a_pipe_is_read_once_and_used(tmp_path: Path) -> None:
    """``--config <(gen-config)`` and ``--config /dev/stdin`` are pipes, which can be read once; the
    command read its file three times, so the configuration ran on the defaults with a "sets no
    field" warning."""
    text = '[server]\nport = 4321\nlog_format = "json"\n'
    done = subprocess.run(
        [sys.executable, "-m", "daemon", "check-config", "--config", "/dev/stdin"],
        input=text,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert '"port": 4321' in done.stdout and '"log_format": "json"' in done.stdout
    assert "config_file_empty" not in done.stderr
