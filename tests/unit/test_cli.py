"""The command line: every sub-command has --help, unknown ones exit 2, lazy imports stay lazy."""

from __future__ import annotations

import subprocess
import sys

import pytest

from daemon.cli import build_parser, commands, main


@pytest.mark.parametrize("name", [name for name, _ in commands()])
def test_cli_every_command_has_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([name, "--help"])
    assert info.value.code == 0
    assert f"agentd {name}" in capsys.readouterr().out


def test_cli_top_level_help_lists_every_command() -> None:
    text = build_parser().format_help()
    for name, _ in commands():
        assert name in text


def test_cli_unknown_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["no-such-command"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_cli_check_config_does_not_import_the_simulator_or_bench_kit() -> None:
    # sim.config is a pure value ([embedded] is a simulated server's shape): attrs and the core only
    code = (
        "import sys; import daemon.cli as c; c.build_parser('check-config'); "
        "print(sorted(m for m in sys.modules if m.startswith(('sim', 'bench', 'quart')) "
        "and m not in ('sim', 'sim.config')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=180).stdout
    assert out.strip() == "[]"


def test_a_closed_output_pipe_ends_quietly(tmp_path) -> None:
    import subprocess
    import sys

    repo = __import__("pathlib").Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon", "check-config", str(repo / "configs" / "quickstart.toml")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()  # like `| head -1`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=180) in (0, 1)
    assert "Traceback" not in err and "BrokenPipeError" not in err


@pytest.mark.parametrize(
    ("section", "field"),
    [
        ('[auth]\napi_keys_file = "{missing}"\n', "auth.api_keys_file"),
        ('[auth]\napi_keys_file = "{bad}"\n', "auth.api_keys_file: line 1"),
        ('[worker_tls]\nca_file = "{missing}"\n', "worker_tls"),
        ('[worker_tls]\nclient_cert_file = "{bad}"\n', "worker_tls"),
    ],
)
def test_check_config_reads_the_key_and_tls_files_like_start(
    section: str, field: str, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("not a key entry\n")
    config = tmp_path / "agentd.toml"
    config.write_text(section.format(missing=tmp_path / "absent", bad=bad))
    assert main(["check-config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"  {field}" in err
    assert main(["start", "--config", str(config)]) == 2  # the same verdict as agentd start
    assert field in capsys.readouterr().err


@pytest.mark.parametrize(
    ("host", "keys", "warned"),
    [("0.0.0.0", False, True), ("0.0.0.0", True, False), ("127.0.0.1", False, False), ("localhost", False, False)],
)
def test_check_config_warns_of_a_public_listener_without_api_keys(
    host: str, keys: bool, warned: bool, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The warning agentd start logs once listening (docs/operations.md §10), printed by check-config
    too (before session 34 only the start log had it, and check-config said nothing)."""
    config = tmp_path / "agentd.toml"
    digest = "a" * 64
    config.write_text(f'[server]\nhost = "{host}"\n' + (f'[auth]\napi_keys = ["team:{digest}"]\n' if keys else ""))
    assert main(["check-config", str(config)]) == 0
    err = capsys.readouterr().err
    assert ("event=unauthenticated_listener" in err) is warned, err
    if warned:
        assert f"host={host}" in err and "docs/operations.md §10" in err
