"""The KV-pressure sweep of the batch benchmarks (bench/batch_sweep.py, docs/benchmarks.md §6.5).

A stand-in for bench/batch_bench.sh (reports whose figures are computed from the environment the
sweep gives it) checks what the driver runs, how many points at once, the tables, reuse and
failures without simulating anything; one test runs a tiny sweep of the real script and
``agentd simulate`` end to end (virtual time).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from pathlib import Path

import pytest

from bench import batch_sweep
from bench.batch_bound import makespan_bound
from bench.batch_sweep import Point, main, run_sweep
from bench.trace.format import save_trace
from bench.trace.synth import synthesize

ROOT = Path(__file__).resolve().parents[2]
SIZES = {"BATCH_REQUESTS": 6, "MIX_PROGRAMS": 1, "MIX_BATCH_REQUESTS": 6}

# A stand-in batch_bench.sh: logs "start NAME" / "end NAME" (under a lock) and the environment it
# was given, copies a prepared batch trace and config (for the floor), and writes reports whose
# figures follow from BLOCKS_*: fcfs makespan 100000 / blocks, agentd 0.9 of it, engine-bja 1.1.
STAND_IN = r"""#!/usr/bin/env bash
set -euo pipefail
out=$1
name=$(basename "$out")
log={log}
exec 9>>"$log.lock"
flock 9; echo "start $name" >> "$log"; flock -u 9
echo "$name SCENARIOS=$SCENARIOS BLOCKS_BATCH=${{BLOCKS_BATCH:-}} BLOCKS_MIX=${{BLOCKS_MIX:-}}" \
  "MIX_SEED=${{MIX_SEED:-}} BATCH_REQUESTS=$BATCH_REQUESTS MIX_PROGRAMS=$MIX_PROGRAMS" \
  "MIX_BATCH_REQUESTS=$MIX_BATCH_REQUESTS" >> {log}.env
[ -e "{fail}/$name" ] && exit 3
mkdir -p "$out/configs" "$out/$SCENARIOS"
if [ "$SCENARIOS" = batch-only ]; then
  blocks=$BLOCKS_BATCH
  cp {trace} "$out/batch.jsonl"
  printf '[embedded]\nnum_workers = 1\ndp_size = 2\nnum_gpu_blocks = %s\nblock_size = 16\n' "$blocks" \
    > "$out/configs/batch-fcfs.toml"
  systems="fcfs agentd engine-bja"
else
  blocks=$BLOCKS_MIX
  systems="fcfs agentd-ps agentd engine-bja"
fi
for s in $systems; do
  case $s in fcfs) f=1.0 ;; agentd) f=0.9 ;; agentd-ps) f=1.0 ;; engine-bja) f=1.1 ;; esac
  "{python}" -c "import json,sys; b=int(sys.argv[1]); f=float(sys.argv[2]); seed=int(sys.argv[4] or 0)
json.dump({{'batch': {{'makespan_seconds': 100000 / b * f, 'engine_preemptions': 10 * f, 'failed': 0}},
 'jct_seconds': {{'mean': (50 + seed) * f, 'p90': 60 * f}}, 'tasks': {{'failed': 0, 'planned': 1}}}},
 open(sys.argv[3], 'w'))" "$blocks" "$f" "$out/$SCENARIOS/$s.json" "${{MIX_SEED:-}}"
done
flock 9; echo "end $name" >> "$log"; flock -u 9
"""


@pytest.fixture
def stand_in(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(script, its start/end log, the directory whose files make the point of that name fail)."""
    trace = tmp_path / "batch.jsonl"
    save_trace(synthesize("batch", 12, seed=1), str(trace))
    log = tmp_path / "calls.log"
    fail = tmp_path / "fail"
    fail.mkdir()
    script = tmp_path / "stand_in.sh"
    script.write_text(STAND_IN.format(log=log, trace=trace, fail=fail, python=sys.executable))
    return script, log, fail


def _max_overlap(log: Path) -> int:
    running = peak = 0
    for line in log.read_text().splitlines():
        running += 1 if line.startswith("start ") else -1
        peak = max(peak, running)
    return peak


POINTS = [Point("batch-only", 512), Point("batch-only", 1024), Point("mixed", 1000, 1), Point("mixed", 1000, 2)]


def test_each_point_gets_its_scenario_and_sizes_and_at_most_jobs_run_at_once(stand_in, tmp_path) -> None:
    script, log, _ = stand_in
    out = tmp_path / "out"
    rows, failed = run_sweep(POINTS, out, sizes=SIZES, jobs=2, script=script, poll_seconds=0.01)
    assert failed == []
    assert sorted(Path(f"{log}.env").read_text().splitlines()) == sorted(
        [
            "batch-only-512 SCENARIOS=batch-only BLOCKS_BATCH=512 BLOCKS_MIX= MIX_SEED= "
            "BATCH_REQUESTS=6 MIX_PROGRAMS=1 MIX_BATCH_REQUESTS=6",
            "batch-only-1024 SCENARIOS=batch-only BLOCKS_BATCH=1024 BLOCKS_MIX= MIX_SEED= "
            "BATCH_REQUESTS=6 MIX_PROGRAMS=1 MIX_BATCH_REQUESTS=6",
            "mixed-1000-s1 SCENARIOS=mixed BLOCKS_BATCH= BLOCKS_MIX=1000 MIX_SEED=1 "
            "BATCH_REQUESTS=6 MIX_PROGRAMS=1 MIX_BATCH_REQUESTS=6",
            "mixed-1000-s2 SCENARIOS=mixed BLOCKS_BATCH= BLOCKS_MIX=1000 MIX_SEED=2 "
            "BATCH_REQUESTS=6 MIX_PROGRAMS=1 MIX_BATCH_REQUESTS=6",
        ]
    )
    assert 1 <= _max_overlap(log) <= 2
    # one at a time with jobs=1
    log.unlink()
    run_sweep(POINTS, tmp_path / "out1", sizes=SIZES, jobs=1, script=script, poll_seconds=0.01)
    assert _max_overlap(log) == 1
    # the rows: figures of the reports, the floor of the trace and cluster
    assert [r["blocks"] for r in rows["batch-only"]] == [512, 1024]
    first = rows["batch-only"][0]
    assert first["makespan_seconds"] == pytest.approx(
        {"fcfs": 100000 / 512, "agentd": 90000 / 512, "engine-bja": 110000 / 512}
    )
    assert first["engine_preemptions"] == pytest.approx({"fcfs": 10.0, "agentd": 9.0, "engine-bja": 11.0})
    floor = makespan_bound(
        batch_sweep.load_trace(str(tmp_path / "batch.jsonl")).records, ranks=2, kv_tokens_per_rank=512 * 16
    )
    assert (first["kv_tokens_per_rank"], first["floor_seconds"]) == (8192, floor.makespan_seconds)
    assert [(r["blocks"], r["seed"]) for r in rows["mixed"]] == [(1000, 1), (1000, 2)]
    assert rows["mixed"][1]["agents_jct_mean_seconds"] == pytest.approx(
        {"fcfs": 52.0, "agentd-ps": 52.0, "agentd": 46.8, "engine-bja": 57.2}
    )


def test_main_writes_the_tables_json_and_reuses_finished_points(stand_in, tmp_path, monkeypatch, capsys) -> None:
    script, log, _ = stand_in
    monkeypatch.setattr(batch_sweep, "SCRIPT", script)
    monkeypatch.setattr(batch_sweep, "write_plot", lambda rows, path: False)
    out = tmp_path / "out"
    argv = ["--out", str(out), "--batch-blocks", "1024,512", "--mix-blocks", "1000", "--mix-seeds", "2,1"]
    argv += ["--batch-requests", "6", "--mix-programs", "1", "--mix-batch-requests", "6"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    floor_512 = makespan_bound(
        batch_sweep.load_trace(str(tmp_path / "batch.jsonl")).records, ranks=2, kv_tokens_per_rank=512 * 16
    ).makespan_seconds
    lines = (out / "sweep.md").read_text().splitlines()
    assert lines[0] == "## batch only (6 requests; one worker x 2 DP ranks; makespan ratios to fcfs)"
    # KV order, whatever the order of the arguments
    floors = f"{floor_512 / 195.3125:.3f} | {floor_512 / 175.78125:.3f}"
    assert lines[4] == f"| 512 | 195.31 | 0.900 | 1.100 | {floors} | 10 / 9 / 11 | 0 |"
    assert lines[5].startswith("| 1024 | 97.66 | 0.900 | 1.100 | ")
    assert lines[7].startswith("## agents + batch (1 swe-short Programs + 6 batch requests;")
    assert lines[11:] == [
        "| 1000 | 1 | 51.00 | 100.00 | 0.900 | 0.900 | 1.000 | 1.100 | 1.100 | 10 / 10 / 9 / 11 | 0 / 0 |",
        "| 1000 | 2 | 52.00 | 100.00 | 0.900 | 0.900 | 1.000 | 1.100 | 1.100 | 10 / 10 / 9 / 11 | 0 / 0 |",
    ]
    assert captured.out == (out / "sweep.md").read_text()
    data = json.loads((out / "sweep.json").read_text())
    assert data["sizes"] == SIZES
    assert [r["blocks"] for r in data["batch-only"]] == [512, 1024]
    assert "batch sweep: [4/4] " in captured.err and "tables in " in captured.err
    calls = log.read_text()
    # the same parameters again: every point is reused, nothing runs
    assert main(argv) == 0
    assert log.read_text() == calls
    assert capsys.readouterr().err.count("reused (same parameters; --fresh re-runs it)") == 4
    assert (out / "sweep.md").read_text().splitlines() == lines
    # other trace sizes, or --fresh: run again
    assert main([*argv[:-1], "7"]) == 0
    assert log.read_text().count("start mixed-1000-s1") == 2
    assert log.read_text().count("start batch-only-512") == 2
    assert main([*argv[:-1], "7", "--fresh", "--mix-blocks", ""]) == 0
    assert log.read_text().count("start batch-only-512") == 3
    assert log.read_text().count("start mixed-1000-s1") == 2
    assert "agents + batch" not in (out / "sweep.md").read_text()


def test_a_failed_point_is_named_and_the_others_tabled(stand_in, tmp_path, monkeypatch, capsys) -> None:
    script, _, fail = stand_in
    (fail / "batch-only-512").touch()
    monkeypatch.setattr(batch_sweep, "SCRIPT", script)
    monkeypatch.setattr(batch_sweep, "write_plot", lambda rows, path: False)
    out = tmp_path / "out"
    assert main(["--out", str(out), "--batch-blocks", "512,1024", "--mix-blocks", ""]) == 1
    err = capsys.readouterr().err
    assert f"batch-only-512: FAILED (exit 3; see {out}/batch-only-512/log.txt)" in err
    assert err.rstrip().endswith("batch sweep: 1 point(s) failed: batch-only-512")
    table = (out / "sweep.md").read_text()
    assert "| 1024 |" in table and "| 512 |" not in table
    # a failed point is not reused
    (fail / "batch-only-512").unlink()
    assert main(["--out", str(out), "--batch-blocks", "512,1024", "--mix-blocks", ""]) == 0
    err = capsys.readouterr().err
    assert "batch-only-512: done in " in err and "batch-only-1024: reused" in err


def test_an_interrupted_sweep_stops_its_points_scripts_and_their_children(tmp_path, monkeypatch) -> None:
    """Ctrl-C (here: KeyboardInterrupt from the wait between polls) stops each running point's whole
    process group: the script and the simulation it started, not only the script."""
    script = tmp_path / "hang.sh"
    script.write_text('#!/usr/bin/env bash\nsleep 600 &\necho $! > "$1.child"\nwait\n')
    out = tmp_path / "out"
    children = [out / "batch-only-512.child", out / "batch-only-1024.child"]

    def interrupt(_seconds: float) -> None:
        if all(p.is_file() and p.read_text().strip() for p in children):
            raise KeyboardInterrupt

    monkeypatch.setattr(batch_sweep.time, "sleep", interrupt)
    with pytest.raises(KeyboardInterrupt):
        run_sweep([Point("batch-only", 512), Point("batch-only", 1024)], out, sizes=SIZES, jobs=2, script=script)
    monkeypatch.undo()  # time.sleep is the time module's own again
    for path in children:
        # the SIGTERM was sent before run_sweep returned: wait for the child's exit (a zombie where
        # nothing reaps orphans counts) on a process descriptor, which becomes readable when it
        # ends; 60 s only bounds a hang, even on a loaded machine
        try:
            handle = os.pidfd_open(int(path.read_text()))
        except ProcessLookupError:
            continue  # already gone and reaped
        try:
            readable, _, _ = select.select([handle], [], [], 60.0)
        finally:
            os.close(handle)
        assert readable, f"{path.name}: the point's child still runs"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--out", ""], "--out: must not be empty"),
        (["--jobs", "0"], "--jobs: must be >= 1"),
        (["--batch-blocks", "512,x"], "argument --batch-blocks: expected comma-separated integers, got '512,x'"),
        (["--mix-blocks", "0"], "argument --mix-blocks: every value must be >= 1, got '0'"),
        (["--batch-blocks", "", "--mix-blocks", ""], "nothing to run"),
        (["--mix-seeds", ""], "--mix-seeds: at least one seed"),
        (["--batch-requests", "0"], "must be >= 1"),
    ],
)
def test_bad_arguments_exit_2(argv: list[str], message: str, capsys, tmp_path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv if "--out" in argv else ["--out", str(tmp_path / "o"), *argv])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("scenarios", "message"), [("bogus", "unknown scenario 'bogus'"), (" ", "SCENARIOS is empty")])
def test_batch_bench_refuses_unknown_or_no_scenarios(tmp_path: Path, scenarios: str, message: str) -> None:
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "AGENTD": "/bin/true", "SCENARIOS": scenarios}
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "batch_bench.sh"), str(tmp_path / "out")], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.startswith(
        f"batch_bench.sh: SCENARIOS: {message}" if scenarios.strip() else f"batch_bench.sh: {message}"
    )
    assert not (tmp_path / "out").exists()


def test_a_tiny_sweep_of_the_real_benchmark(tmp_path: Path) -> None:
    """bench/batch_bench.sh and ``agentd simulate`` (virtual time) at two points, through
    ``python -m bench.batch_sweep``: every system's report, the floor below every makespan."""
    agentd = tmp_path / "agentd"
    agentd.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m daemon "$@"\n')
    agentd.chmod(0o755)
    env = {
        **os.environ,
        "AGENTD": str(agentd),
        "PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "bench.batch_sweep", "--out", str(out), "--batch-blocks", "512", "--mix-blocks", "2048"]
        + ["--mix-seeds", "1", "--batch-requests", "8", "--mix-programs", "1", "--mix-batch-requests", "8"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads((out / "sweep.json").read_text())
    (batch,) = data["batch-only"]
    assert batch["blocks"] == 512 and batch["kv_tokens_per_rank"] == 8192
    assert set(batch["makespan_seconds"]) == {"fcfs", "agentd", "engine-bja"}
    assert all(0 < batch["floor_seconds"] <= m for m in batch["makespan_seconds"].values())
    assert batch["failed_batch_requests"] == {"fcfs": 0, "agentd": 0, "engine-bja": 0}
    (mixed,) = data["mixed"]
    assert (mixed["blocks"], mixed["seed"]) == (2048, 1)
    assert all(v > 0 for v in mixed["agents_jct_mean_seconds"].values())
    assert mixed["agents_failed_tasks"] == {"fcfs": 0, "agentd-ps": 0, "agentd": 0, "engine-bja": 0}
    assert (out / "batch-only-512" / "summary.md").read_text().startswith("## batch only (8 requests, 512 blocks/rank)")
    assert (out / "mixed-2048-s1" / "summary.md").read_text().startswith("## agents + batch (1 swe-short Programs")
    assert done.stdout == (out / "sweep.md").read_text()
