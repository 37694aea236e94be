"""README.md and docs/*.md against the code (the session-27 walk ran every command block as written).

* every ``agentd ...`` and ``python -m bench.<tool> ...`` command line of a fenced block parses with
  that command's own argparse parser (flags renamed or removed in the code break the docs);
* every flag of an inline ``agentd ...`` / ``python -m bench.<tool> ...`` code span exists;
* every file under configs/, bench/ or scripts/ the documents name exists;
* every ``agentd_*`` / ``vllm_router_agent_aware_*`` metric the documents name is exported by the
  quick start's ``/metrics``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from daemon.cli import build_parser
from daemon.cli import main as agentd_main

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def fenced_lines() -> Iterator[tuple[str, str]]:
    """(file:line, logical line) of every fenced block, backslash continuations joined."""
    for path in DOCS:
        inside, buf, start = False, "", 0
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip().startswith("```"):
                inside = not inside
                continue
            if not inside:
                continue
            if not buf:
                start = number
            if line.rstrip().endswith("\\"):
                buf += line.rstrip()[:-1] + " "
                continue
            yield f"{path.name}:{start}", buf + line
            buf = ""


SEPARATORS = {";", "&&", "||", "|", "do", "done", "then", "&"}


def simple_commands(line: str) -> Iterator[list[str]]:
    """The simple commands of a shell line that run agentd or a bench tool (env assignments,
    ``nice -n N`` and sub-shell parentheses removed)."""
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:  # an output line, not shell
        return
    current: list[str] = []
    for token in [*tokens, ";"]:
        if token in SEPARATORS or token.endswith(";"):
            if token.endswith(";") and token != ";":
                current.append(token[:-1])
            cmd = [t.strip("()") if not t.startswith("$(") else t for t in current]
            cmd = [t for t in cmd if t]
            while cmd and re.match(r"^[A-Z_]+=", cmd[0]):
                cmd = cmd[1:]
            if cmd[:1] == ["nice"]:
                cmd = cmd[3:]
            if cmd and cmd[0].endswith("/agentd"):
                cmd[0] = "agentd"
            if cmd and re.fullmatch(r"(\S*/)?python3?", cmd[0]):
                cmd[0] = "python"
            if cmd[:1] == ["agentd"] or (cmd[:2] == ["python", "-m"] and len(cmd) > 2 and cmd[2].startswith("bench.")):
                yield cmd
            current = []
        else:
            current.append(token)


class _Parsed(Exception):
    pass


def parse_only(argv: list[str]) -> str | None:
    """Parse ``argv`` with its command's parser and stop there: None if it parses, else argparse's
    complaint."""
    # parse_known_args, not parse_args: ``agentd`` parses with it (to report an unknown argument
    # with the sub-command's usage) and parse_args calls it; a sub-command's parser is a nested call
    original = argparse.ArgumentParser.parse_known_args
    depth = 0

    def parse_and_stop(self: argparse.ArgumentParser, args: object = None, namespace: object = None) -> object:
        nonlocal depth
        depth += 1
        try:
            parsed, extras = original(self, args, namespace)  # type: ignore[call-overload]
        finally:
            depth -= 1
        if depth:
            return parsed, extras
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        raise _Parsed

    err = io.StringIO()
    argparse.ArgumentParser.parse_known_args = parse_and_stop  # type: ignore[assignment,method-assign]
    old_argv = sys.argv
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if argv[0] == "agentd":
                agentd_main(argv[1:])
            else:
                sys.argv = [argv[2], *argv[3:]]
                module = importlib.import_module(argv[2])
                try:
                    module.main(argv[3:])
                except TypeError as exc:  # a main() that reads sys.argv itself
                    if "positional argument" not in str(exc):
                        raise
                    module.main()
    except _Parsed:
        return None
    except SystemExit:
        return err.getvalue().strip().splitlines()[-1]
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]
        sys.argv = old_argv
    return "the command ran instead of stopping after parsing its arguments"


def documented_commands() -> list[tuple[str, list[str]]]:
    out = []
    for where, line in fenced_lines():
        for cmd in simple_commands(line):
            if any("..." in t for t in cmd) or cmd[1].endswith(":") or cmd[1] == "listening":  # elided, output
                continue
            text = " ".join(cmd)
            if " [" in text or "(--" in text:  # a synopsis: optional parts dropped, one choice kept
                text = re.sub(r"\(--target URL \| --config FILE\)", "--target URL", text)
                cmd = re.sub(r"\[[^\]]*\]", "", text).split()
            out.append((where, cmd))
    return out


COMMANDS = documented_commands()


def test_the_docs_have_commands_to_check() -> None:
    assert len(COMMANDS) > 100
    assert {cmd[1] for _, cmd in COMMANDS if cmd[0] == "agentd"} >= {
        "start",
        "batch",
        "bench",
        "check-fairness",
        "simulate",
        "trace",
        "sim-backend",
        "calibrate",
        "replay",
    }


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[f"{w}:{' '.join(c)[:60]}" for w, c in COMMANDS])
def test_every_documented_command_line_parses(where: str, argv: list[str]) -> None:
    assert parse_only(argv) is None, f"{where}: {' '.join(argv)}"


def parser_flags(parser: argparse.ArgumentParser) -> set[str]:
    flags = {"-h", "--help"}
    for action in parser._actions:
        flags.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                flags |= parser_flags(sub)
    return flags


def bench_tool_flags(module: str) -> set[str]:
    captured: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> object:
        captured.append(self)
        raise _Parsed

    argparse.ArgumentParser.parse_args = capture  # type: ignore[assignment,method-assign]
    old_argv, sys.argv = sys.argv, [module]
    try:
        main = importlib.import_module(module).main
        try:
            main([])
        except TypeError:
            main()
    except _Parsed:
        pass
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
        sys.argv = old_argv
    assert captured, module
    return parser_flags(captured[0])


def test_every_flag_of_an_inline_command_exists() -> None:
    subcommands = {
        name: sub
        for action in build_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, sub in action.choices.items()
    }
    known: dict[str, set[str]] = {}
    unknown = []
    for path in DOCS:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for match in re.finditer(r"`((?:agentd |python -m bench\.)[^`]*)`", text):
            span = match.group(1)
            tokens = span.split()
            if tokens[0] == "agentd":
                if len(tokens) < 2 or tokens[1] not in subcommands:
                    continue
                flags = known.setdefault(tokens[1], parser_flags(subcommands[tokens[1]]))
                args = tokens[2:]
            else:
                module = re.match(r"python\s+-m\s+(bench\.[\w.]*\w)", span)
                if module is None:
                    continue
                flags = known.setdefault(module.group(1), bench_tool_flags(module.group(1)))
                args = tokens[3:]
            for arg in args:
                flag = re.match(r"^(--?[a-zA-Z][\w-]*)", arg)
                if flag and flag.group(1) not in flags:
                    unknown.append(f"{path.name}: {flag.group(1)} in `{span}`")
    # docs/simulator.md puts two commands in one span: `agentd sim-backend ... & agentd calibrate --target URL`
    assert [u.split(" in ")[0] for u in unknown] == ["simulator.md: --target"], unknown


def test_every_repository_file_the_docs_name_exists() -> None:
    missing = []
    for path in DOCS:
        for match in re.finditer(
            r"(?<![\w/.-])((?:configs|bench|scripts)/[\w./-]*\w\.(?:toml|json|sh|py|md))\b", path.read_text()
        ):
            if not (ROOT / match.group(1)).exists():
                missing.append(f"{path.name}: {match.group(1)}")
    assert missing == []


def test_every_metric_the_docs_name_is_exported_and_the_start_log_is_as_documented(tmp_path: Path) -> None:
    """Also: the ``daemon_listening`` event has the fields docs/operations.md §7 shows (its example
    lines had lost ``admin_url``, ``authentication`` and ``data_plane_processes``)."""
    documented = set()
    for path in DOCS:
        documented |= set(re.findall(r"\b((?:agentd|vllm_router_agent_aware)_[a-z0-9_]*[a-z0-9])\b", path.read_text()))
    config = tmp_path / "quickstart.toml"
    text = (ROOT / "configs" / "quickstart.toml").read_text().replace("port = 3001", "port = 0", 1)
    config.write_text(text + f'\n[batch_api]\ndatabase_path = "{tmp_path / "b.sqlite3"}"\n')
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon", "start", "--config", str(config)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = re.fullmatch(r"agentd listening on (http://127\.0\.0\.1:\d+)\n", proc.stdout.readline())
        assert banner
        exposition = httpx.get(f"{banner.group(1)}/metrics", timeout=30).text
    finally:
        proc.terminate()
        _, log = proc.communicate(timeout=180)
    listening = next(line for line in log.splitlines() if "event=daemon_listening" in line)
    logged = re.findall(r" ([a-z_]+)=", listening.split("event=daemon_listening", 1)[1])
    operations = (ROOT / "docs" / "operations.md").read_text()
    example = next(
        line for line in operations.splitlines() if line.startswith("ts=") and "event=daemon_listening" in line
    )
    assert re.findall(r" ([a-z_]+)=", example.split("event=daemon_listening", 1)[1]) == logged
    json_example = next(
        line for line in operations.splitlines() if '"logger": "agentd.supervisor", "event": "daemon_listening"' in line
    )
    assert list(json.loads(json_example))[4:] == logged
    row = next(line for line in operations.splitlines() if line.startswith("| `daemon_listening` | info |"))
    assert re.findall(r"`([a-z_]+)`", row.rsplit("|", 2)[1]) == logged
    families = set(re.findall(r"^# TYPE (\S+) ", exposition, re.M))
    names = set(families)
    for family in families:
        names |= {family + suffix for suffix in ("_total", "_bucket", "_sum", "_count")}
    prefixes = {d for d in documented if any(n.startswith(d + "_") for n in names)}  # `agentd_batch_rank_{...}`
    assert sorted(documented - names - prefixes) == []
