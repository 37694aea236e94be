"""What the session-26 walk found in the ``python -m bench.<module>`` tools' options.

Each case is a mistake a user makes with a documented bench tool.  It must exit 2 at once with one
line naming the option, before any work starts: before, these ran for minutes with the bad value, or
ended in a traceback (``soak --out`` naming a file: ``FileExistsError``; ``soak --sample-seconds -1``:
an exception group), or wrote the report at the end into a path that could not take it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_bench(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )


CASES = [
    (("bench.soak", "--sample-seconds", "-1"), "argument --sample-seconds: must be a finite number > 0, got '-1'"),
    (("bench.soak", "--fault-rate", "2"), "argument --fault-rate: must be a number within [0, 1], got '2'"),
    (("bench.soak", "--out", "{file}"), "--out: exists and is not a directory: {file}"),
    (("bench.load", "l1", "--clients", "0"), "argument --clients: must be an integer >= 1, got '0'"),
    (("bench.load", "l2", "--out", "{file}"), "--out: exists and is not a directory: {file}"),
    (("bench.fakeworker", "--tokens", "0"), "argument --tokens: must be an integer >= 1, got '0'"),
    (("bench.fakeworker", "--port", "70000"), "argument --port: must be an integer in [0, 65535], got '70000'"),
    (("bench.sim_bench", "virtual", "--ranks", "0"), "argument --ranks: must be an integer >= 1, got '0'"),
    (("bench.sim_bench", "server", "--seconds", "nan"), "argument --seconds: must be a finite number > 0, got 'nan'"),
    (("bench.tool_bench", "--out", "{file}", "--points", "thrash"), "--out: exists and is not a directory: {file}"),
    (("bench.eta_bench", "--out", "{file}"), "--out: exists and is not a directory: {file}"),
    (("bench.send_path", "--json", "{missing}"), "--json: directory does not exist: {missing_dir}"),
    (("bench.relay_cpu", "--markdown", "{missing}"), "--markdown: directory does not exist: {missing_dir}"),
    # the session-26 walk's findings in the scheduler and edge probes (a ZeroDivisionError, an
    # AssertionError, or a run that measured nothing and exited 0)
    (("bench.core_bench", "--programs", "-1"), "argument --programs: must be an integer >= 1, got '-1'"),
    (("bench.core_bench", "--ranks", "-1"), "argument --ranks: must be an integer >= 1, got '-1'"),
    (("bench.core_bench", "--warmup", "-1"), "argument --warmup: must be an integer >= 0, got '-1'"),
    (("bench.edge_cpu", "--bodies", "-1"), "argument --bodies: must be comma-separated integers >= 1, got '-1'"),
    (("bench.edge_cpu", "--repeat", "0"), "argument --repeat: must be an integer >= 1, got '0'"),
    (("bench.program_probe", "--kb", "-1"), "argument --kb: must be an integer >= 1, got '-1'"),
    (("bench.program_probe", "--think-ms", "-1"), "argument --think-ms: must be a finite number >= 0, got '-1'"),
    (("bench.admission_bench", "--json", "{missing}"), "--json: directory does not exist: {missing_dir}"),
]


@pytest.mark.parametrize(("argv", "message"), CASES, ids=[" ".join(a[:2]) + " " + a[-1] for a, _ in CASES])
def test_a_bad_bench_option_exits_2_naming_it_before_any_work(
    tmp_path: Path, argv: tuple[str, ...], message: str
) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")
    names = {"file": str(a_file), "missing": str(tmp_path / "nodir" / "x"), "missing_dir": str(tmp_path / "nodir")}
    done = run_bench(*(a.format(**names) for a in argv))
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert (
        last
        == f"python -m {argv[0]}{' ' + argv[1] if argv[0] == 'bench.sim_bench' else ''}: error: "
        + message.format(**names)
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing written


@pytest.mark.parametrize(
    "argv",
    [
        ("bench.program_probe", "--seconds", "0.2", "--rounds", "1", "--processes", "2"),
        ("bench.proxy_overhead", "--seconds", "0.2", "--concurrency", "2", "--bodies", "1", "--identity", "program")
        + ("--no-router", "--processes", "2"),
    ],
)
def test_the_agentd_childs_logs_stay_out_of_the_benchs_output(argv: tuple[str, ...]) -> None:
    """The agentd a probe starts logs to a file of the run (named if it fails), not to the bench's
    stderr: its start-up warning (uncalibrated cost model) there read as the bench's own."""
    done = run_bench(*argv)
    assert done.returncode == 0, done.stderr
    assert "level=" not in done.stderr and "level=" not in done.stdout, done.stderr
