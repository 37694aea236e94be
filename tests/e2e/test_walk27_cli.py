"""What the session-27 walk found in the commands' flags.

``--seed -1`` was accepted by ``agentd simulate`` (then reported as a bad ``embedded.seed`` of the
configuration file, which does not hold it), ``agentd bench`` (whose simulated workers refuse it)
and ``agentd check-fairness``: each now exits 2 naming the flag.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from daemon import cli

ROOT = Path(__file__).resolve().parents[2]

QUICKSTART = "configs/quickstart.toml"


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--config", QUICKSTART, "--trace", "t.jsonl"],
        ["bench", "--trace", "t.jsonl", "--out", "out"],
        ["check-fairness", "--config", QUICKSTART],
    ],
)
def test_a_negative_seed_is_a_usage_error_naming_the_flag(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main([*argv, "--seed", "-1"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"agentd {argv[0]}: error: argument --seed: must be an integer >= 0, got '-1'"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--trace", "t.jsonl", "--out", ""],
        ["check-fairness", "--config", QUICKSTART, "--out", ""],
        ["trace", "synth", "--profile", "swe-short", "--programs", "2", "--out", ""],
    ],
)
def test_an_empty_out_is_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """``--out ''`` is ``Path("")``, the current directory: the bench and the fairness check wrote
    their reports and logs into it, trace synth said it is a directory."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code  # type: ignore[assignment]
    assert code == 2
    assert capsys.readouterr().err.strip().endswith("--out: must not be empty")


@pytest.mark.parametrize("module", ["bench.tool_bench", "bench.soak"])
def test_the_bench_tools_refuse_an_empty_out(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib

    with pytest.raises(SystemExit) as exit_:
        importlib.import_module(module).main(["--out", ""])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().endswith("--out: must not be empty")


@pytest.mark.parametrize("script", ["default_bench.sh", "fairness_bench.sh", "batch_bench.sh"])
def test_the_bench_scripts_answer_help_and_refuse_options(script: str, tmp_path: Path) -> None:
    """``--help`` was taken for OUT_DIR: default_bench.sh printed mkdir's help (exit 0, after which it
    would have run the bench into ``--help``), the other two "mkdir: unrecognized option"."""
    path = ROOT / "bench" / script
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    done = subprocess.run(["bash", str(path), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (0, "")
    assert f"bench/{script} [OUT_DIR]" in done.stdout
    assert not done.stdout.startswith("#!") and "set -euo" not in done.stdout
    for argv in (["--bogus"], ["a", "b"]):
        done = subprocess.run(["bash", str(path), *argv], cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(f"{script}: ") and "usage: " in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("module", "command"),
    [
        ("bench.bench", "agentd bench"),
        ("bench.replay", "agentd replay"),
        ("bench.simulate", "agentd simulate"),
        ("bench.calibrate", "agentd bench"),
        ("bench.calibrate_costs", "agentd calibrate"),
        ("bench.trace.synth", "agentd trace synth"),
        ("bench.trace.stats", "agentd trace stats"),
    ],
)
def test_the_library_behind_a_command_says_so_when_run(module: str, command: str) -> None:
    """``python -m bench.bench --help`` (and the others) imported the module and exited 0 silently."""
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert (
        done.stderr
        == f"python -m {module}: not a command; it is the library behind `{command}` (see `{command} --help`)\n"
    )


def test_a_binary_trace_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``agentd trace stats`` (and every command reading a trace) printed a UnicodeDecodeError
    traceback and exited 1 for a file that is not UTF-8 text."""
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b'{"meta": {"format": "agentd-trace/1"}}\n\xff\xfe\n')
    assert cli.main(["trace", "stats", str(binary)]) == 2
    assert capsys.readouterr().err == f"agentd trace stats: invalid FILE {binary}: not UTF-8 text (is this a trace?)\n"


@pytest.mark.parametrize(
    ("argv", "prog"),
    [
        (["simulate", "--trace", "t.jsonl", "--config"], "agentd simulate: invalid configuration"),
        (["batch", "-i", "in.jsonl", "-o", "out.jsonl", "--config"], "agentd batch: error: invalid configuration"),
    ],
)
def test_a_config_naming_a_missing_file_exits_2_naming_the_field(
    argv: list[str], prog: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``agentd simulate --config`` and ``agentd batch --config`` read the files a configuration
    names (API keys, worker TLS and key files) only inside the run: a missing one was a ConfigError
    traceback inside a Trio exception group, exit 1.  They are read first now, as agentd start does."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text('{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}\n')
    (tmp_path / "t.jsonl").write_text('{"session_id": "s", "turn": 0, "input_length": 10, "output_length": 2}\n')
    config = tmp_path / "c.toml"
    config.write_text(f'[auth]\napi_keys_file = "{tmp_path / "missing"}"\n')
    assert cli.main([*argv, str(config)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"{prog} ({config}):",
        f"  auth.api_keys_file: cannot read '{tmp_path / 'missing'}' (No such file or directory)",
    ]
