"""Configuration as a user writes it (the session-27 walk): docs/config.md against the code, every
field given a wrong value, and the ``[worker_tls]`` files.

* docs/config.md lists every field a file may set, with the default the code has, and no field the
  code does not read (a test, so that the two stay in step);
* every field given a value of the wrong type or out of range makes ``agentd check-config`` exit 2
  with a line naming the field, never a traceback;
* a ``[worker_tls]`` file that is missing or not PEM was reported as "worker_tls: cannot load the
  CA bundle or client certificate ([Errno 2] No such file or directory)", naming neither the field
  nor the file; each problem now names both.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from actors.core.config import ProgramSchedulingConfig
from daemon.cli import main
from daemon.config import AgentdConfig, PriorityRule
from daemon.config_loading import _NOT_INPUT

ROOT = Path(__file__).resolve().parents[2]
CONFIG_MD = ROOT / "docs" / "config.md"


def code_fields(cls: type, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted path, default) of every field a configuration file may set."""
    for a in attrs.fields(cls):
        if a.name in _NOT_INPUT:
            continue
        default: Any = a.default
        if hasattr(default, "factory"):  # attrs.Factory
            default = default.factory()
        if attrs.has(type(default)):
            yield from code_fields(type(default), f"{prefix}{a.name}.")
        elif a.name == "program_scheduling":
            yield from code_fields(ProgramSchedulingConfig, f"{prefix}{a.name}.")
        else:
            yield f"{prefix}{a.name}", default
    if cls is AgentdConfig:
        for a in attrs.fields(PriorityRule):
            yield f"priority.rules[].{a.name}", a.default


def documented_fields() -> dict[str, str]:
    """(dotted path -> the default cell) of every row of docs/config.md's field tables."""
    out: dict[str, str] = {}
    section: str | None = None
    for line in CONFIG_MD.read_text().splitlines():
        if line.startswith("## "):
            m = re.match(r"^## `\[([a-z_]+)\]`", line)
            section = m.group(1) if m else ("" if line == "## Top level" else None)
            continue
        m = re.match(r"^\| `([a-z0-9_.\[\]]+)` \| (.*?) \|", line)
        if m and section is not None:
            name = m.group(1)
            if section and not name.startswith(section + "."):
                name = f"{section}.{name}"
            out[name] = m.group(2)
    return out


def documented_default(cell: str) -> Any:
    """The value of a default cell: its first code span as JSON (``unset``/``none`` = None)."""
    m = re.match(r"`([^`]*)`", cell)
    if m is None:
        assert cell.split()[0] in ("unset", "none"), cell
        return None
    value = json.loads(m.group(1))
    return tuple(value) if isinstance(value, list) else value


def test_docs_config_md_lists_every_field_with_the_code_default() -> None:
    code = dict(code_fields(AgentdConfig))
    docs = documented_fields()
    assert sorted(set(code) - set(docs)) == [], "fields the code reads that docs/config.md does not list"
    assert sorted(set(docs) - set(code)) == [], "fields docs/config.md lists that the code does not read"
    wrong = {name: (docs[name], code[name]) for name in code if documented_default(docs[name]) != code[name]}
    assert wrong == {}, "docs/config.md default != code default"


def test_docs_config_md_names_every_embedded_scheduling_policy() -> None:
    from sim.config import SCHEDULING_POLICIES

    cell = CONFIG_MD.read_text().split("| `scheduling_policy` |", 1)[1].split("\n", 1)[0]
    assert set(re.findall(r"`([a-z_]+)`", cell)) - {"fcfs"} >= set(SCHEDULING_POLICIES) - {"fcfs"}


def check_config(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        rc = main(["check-config", str(path)])
    except SystemExit as exc:
        rc = exc.code  # type: ignore[assignment]
    return rc, capsys.readouterr().err


BAD_VALUES: tuple[Any, ...] = ([1], {"a": 1}, -1, "x")


@pytest.mark.parametrize("name", [name for name, _ in code_fields(AgentdConfig) if "[]" not in name])
def test_every_field_with_a_bad_value_exits_2_naming_it(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    default = dict(code_fields(AgentdConfig))[name]
    *sections, key = name.split(".")
    for bad in BAD_VALUES:
        raw: dict[str, Any] = {"enable_program_scheduling": True} if sections[:1] == ["program_scheduling"] else {}
        table = raw
        for section in sections:
            table = table.setdefault(section, {})
        table[key] = bad
        path = tmp_path / "c.json"
        path.write_text(json.dumps(raw))
        rc, err = check_config(path, capsys)
        assert "Traceback" not in err
        assert rc in (0, 2), (bad, err)
        if isinstance(bad, list | dict) and not isinstance(default, dict | tuple):
            # a list or a table where a scalar belongs: refused, naming the field
            assert rc == 2, (bad, err)
            assert f"  {name}: " in err, (bad, err)
        elif rc == 2 and f"  {name}" not in err:
            # a value of the right kind (a string, -1) refused by another field's rule: it names that one
            assert re.search(r"^  [a-z_]+\.[a-z_.\[\]0-9]+: ", err, re.M), (bad, err)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_worker_tls_files_that_cannot_be_used_are_named_with_their_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.pem"
    not_pem = write(tmp_path / "not.pem", "garbage\n")
    config = write(tmp_path / "a.toml", f'[worker_tls]\nca_file = "{missing}"\n')
    rc, err = check_config(config, capsys)
    assert (rc, err.splitlines()[1:]) == (
        2,
        [f"  worker_tls.ca_file: cannot read '{missing}' (No such file or directory)"],
    )
    config = write(
        tmp_path / "b.toml", f'[worker_tls]\nclient_cert_file = "{missing}"\nclient_key_file = "{tmp_path}"\n'
    )
    rc, err = check_config(config, capsys)
    assert (rc, err.splitlines()[1:]) == (
        2,
        [
            f"  worker_tls.client_cert_file: cannot read '{missing}' (No such file or directory)",
            f"  worker_tls.client_key_file: cannot read '{tmp_path}' (Is a directory)",
        ],
    )
    config = write(tmp_path / "c.toml", f'[worker_tls]\nca_file = "{not_pem}"\n')
    rc, err = check_config(config, capsys)
    assert rc == 2
    assert err.splitlines()[1].startswith(f"  worker_tls.ca_file: '{not_pem}' is not a PEM bundle of CA certificates (")
    config = write(tmp_path / "d.toml", f'[worker_tls]\nclient_cert_file = "{not_pem}"\n')
    rc, err = check_config(config, capsys)
    assert rc == 2
    assert err.splitlines()[1].startswith(
        "  worker_tls.client_cert_file: cannot load the client certificate and its key ("
    )


def test_a_self_signed_ca_and_client_pair_still_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The per-file checks do not refuse good files (a CA bundle and a certificate with its key)."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    made = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=worker", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert)],
        capture_output=True,
    )
    if made.returncode != 0:
        pytest.skip("openssl cannot make a certificate here")
    toml = f'[worker_tls]\nca_file = "{cert}"\nclient_cert_file = "{cert}"\nclient_key_file = "{key}"\n'
    rc, err = check_config(write(tmp_path / "ok.toml", toml), capsys)
    assert rc == 0, err


@pytest.mark.parametrize(
    ("toml", "line"),
    [
        ("[sever]\nport = 1\n", "  sever: unknown key (not a configuration field; did you mean server?)"),
        ("[server]\nprot = 1\n", "  server.prot: unknown key (not a configuration field; did you mean port?)"),
        (
            "[[priority.rules]]\ntenat = 'a'\n",
            "  priority.rules[0].tenat: unknown key (not a configuration field; did you mean tenant?)",
        ),
        ("[server]\nzzz = 1\n", "  server.zzz: unknown key (not a configuration field)"),
    ],
)
def test_a_typo_names_the_field_it_probably_meant(
    toml: str, line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo'd key or section was "unknown key (not a configuration field)" with no hint."""
    rc, err = check_config(write(tmp_path / "typo.toml", toml), capsys)
    assert (rc, err.splitlines()[1:]) == (2, [line])
