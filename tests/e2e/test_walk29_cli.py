"""What the session-29 walk found in the commands' output paths.

``daemon.commands.paths`` asked ``os.access`` whether an output's directory is writable.  For root
(the CI machine, a container) every directory passes, also one whose file system refuses new
files (``/proc``, a read-only mount): ``agentd trace synth`` and ``agentd simulate`` then ended in
a ``FileNotFoundError`` traceback, ``check-fairness`` too (after its whole run), ``agentd batch``
exited 1 saying the output "is valid, rerun the same command to resume", ``agentd calibrate``
measured the backend for minutes and then exited 1, and ``agentd bench`` ran every system first.
Each now creates (and removes) a file where it will write before any work, and exits 2 naming
the flag.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon import cli
from daemon.commands.paths import output_dir_problem, output_file_problem

QUICKSTART = "configs/quickstart.toml"

# a directory where no process may create a file, whoever it runs as
REFUSING = Path("/proc")

pytestmark = pytest.mark.skipif(not (REFUSING / "self").exists(), reason="needs Linux /proc")


def _code(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        return int(exc.code or 0)


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.jsonl"
    assert cli.main(["trace", "synth", "--profile", "swe-short", "--programs", "2", "--out", str(path)]) == 0
    return path


@pytest.mark.parametrize(
    ("command", "argv", "flag"),
    [
        (
            "trace synth",
            ["trace", "synth", "--profile", "swe-short", "--programs", "2", "--out", "/proc/t.jsonl"],
            "--out",
        ),
        ("trace merge", ["trace", "merge", "TRACE", "TRACE", "-o", "/proc/m.jsonl"], "--out"),
        ("simulate", ["simulate", "--config", QUICKSTART, "--trace", "TRACE", "--out", "/proc/s.json"], "--out"),
        ("replay", ["replay", "--trace", "TRACE", "--target", "http://127.0.0.1:9", "--out", "/proc/r.json"], "--out"),
        ("batch", ["batch", "-i", "TRACE", "-o", "/proc/o.jsonl", "--target", "http://127.0.0.1:9"], "--output"),
        (
            "calibrate",
            ["calibrate", "--target", "http://127.0.0.1:9", "--model", "m", "--out", "/proc/c.toml"],
            "--out",
        ),
        ("check-fairness", ["check-fairness", "--config", QUICKSTART, "--out", "/proc"], "--out"),
        ("check-fairness", ["check-fairness", "--config", QUICKSTART, "--out", "/proc/cf"], "--out"),
        ("bench", ["bench", "--trace", "TRACE", "--out", "/proc/bench"], "--out"),
    ],
)
def test_an_output_where_no_file_can_be_created_is_a_usage_error_before_any_work(
    command: str, argv: list[str], flag: str, trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [str(trace) if a == "TRACE" else a for a in argv]
    assert _code(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"agentd {command}: ") and f"{flag}: cannot create " in last, err
    assert "/proc" in last and "No such file or directory" in last


def test_the_probe_names_the_reason_and_leaves_nothing_behind(tmp_path: Path) -> None:
    assert output_file_problem("/proc/x.json", "--out") == (
        "--out: cannot create a file in /proc: No such file or directory"
    )
    assert output_dir_problem("/proc", "--out") == "--out: cannot create a file in /proc: No such file or directory"
    assert output_dir_problem("/proc/a/b", "--out") == (
        "--out: cannot create /proc/a/b in /proc: No such file or directory"
    )
    assert output_file_problem(str(tmp_path / "x.json"), "--out") is None
    assert output_dir_problem(str(tmp_path), "--out") is None
    assert output_dir_problem(str(tmp_path / "new" / "dir"), "--out") is None
    assert list(tmp_path.iterdir()) == []


def test_check_config_refuses_a_batch_database_where_no_file_can_be_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``check-config`` passed it; ``agentd start`` then refused the lock file."""
    config = tmp_path / "c.toml"
    config.write_text('[batch_api]\ndatabase_path = "/proc/agentd/b.sqlite3"\n')
    assert _code(["check-config", str(config)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "  batch_api.database_path: cannot create '/proc/agentd/b.sqlite3' in '/proc': No such file or directory"
    )


@pytest.mark.parametrize("systems", [[], ["--systems", "agentd"]])
def test_bench_checks_the_program_scheduling_json_before_any_system_runs(
    systems: list[str], trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--ps-config-json`` with a field agentd refuses: agentd's own start refused it after the
    systems before it (native: minutes) had run, and the bench exited 1."""
    out = tmp_path / "bench"
    argv = ["bench", "--trace", str(trace), "--out", str(out), "--no-progress", *systems]
    assert _code([*argv, "--ps-config-json", '{"nope": 1, "high_watermark_ratio": "x"}']) == 2
    assert capsys.readouterr().err.splitlines() == [
        "agentd bench: --ps-config-json: program_scheduling.nope: unknown key (not a configuration field)",
        "agentd bench: --ps-config-json: program_scheduling.high_watermark_ratio: must be a number (got 'x')",
    ]
    assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "prog", "unknown"),
    [
        (["check-config", "a.toml", "b.toml"], "agentd check-config", "b.toml"),
        (["start", "--port", "0", "--frob"], "agentd start", "--frob"),
        (
            ["trace", "synth", "--profile", "bfcl", "--programs", "2", "--out", "-", "--frob"],
            "agentd trace synth",
            "--frob",
        ),
    ],
)
def test_an_unknown_argument_is_reported_by_the_sub_command_with_its_usage(
    argv: list[str], prog: str, unknown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """They were reported by the top-level parser: ``agentd: error: unrecognized arguments`` under
    ``usage: agentd [-h] [--version] COMMAND ...``, which lists none of the command's flags."""
    assert _code(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {prog} ")
    assert err.splitlines()[-1] == f"{prog}: error: unrecognized arguments: {unknown}"


def test_trace_stats_and_merge_read_a_trace_from_standard_input(
    trace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``agentd trace synth --out -`` writes a trace to stdout, but ``agentd trace stats -`` said
    ``cannot read FILE -: No such file or directory`` (and ``merge`` the same)."""
    import io
    import sys

    def stdin(data: bytes) -> None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))

    capsys.readouterr()
    stdin(trace.read_bytes())
    assert _code(["trace", "stats", "-"]) == 0
    assert capsys.readouterr().out.startswith("profile=swe-short seed=0 arrival=closed_loop")
    batch = tmp_path / "b.jsonl"
    assert _code(["trace", "synth", "--profile", "batch", "--programs", "3", "--out", str(batch)]) == 0
    stdin(trace.read_bytes())
    merged = tmp_path / "m.jsonl"
    assert _code(["trace", "merge", "-", str(batch), "-o", str(merged)]) == 0
    assert merged.read_text().count("\n") == trace.read_text().count("\n") + 3
    capsys.readouterr()
    stdin(trace.read_bytes())  # standard input can be read once: '-' twice is refused up front
    assert _code(["trace", "merge", "-", "-", "-o", str(merged)]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "agentd trace merge: FILE: '-' (standard input) can be given only once"
    )
    stdin(b"\xff\xfe\n")
    assert _code(["trace", "stats", "-"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "agentd trace stats: invalid FILE -: not UTF-8 text (is this a trace?)"
    )
