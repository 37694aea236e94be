"""Daemons started by the benchmarks each get their own state directory (bench/harness.py
``daemon_env``).

An agentd refuses to start on a Batch API database another agentd holds (docs/batch.md §4).  The
overhead bench starts agentd with N = 1 and N = 2 side by side, and any bench may run while the
user's own daemon serves: with the default database every daemon after the first exited 2 (found
by the lead's benchmark run of session 25)."""

from __future__ import annotations

import os
from pathlib import Path

from bench import harness


def test_two_bench_daemons_at_once_both_serve_and_leave_the_users_state_alone(isolated_state_dir: Path) -> None:
    worker_port = harness.free_port()  # nothing listens there: the daemons start all the same
    procs = []
    try:
        for _ in range(2):
            port = harness.free_port()
            proc = harness.start_agentd(port, worker_port, "round_robin")
            procs.append(proc)
            harness.wait_listening(port, proc, "agentd")
        assert [proc.poll() for proc in procs] == [None, None]
        # the user's state directory (here the test's) holds no database and no lock
        assert not (isolated_state_dir / "agentd").exists()
    finally:
        harness.stop_all(procs)


def test_daemon_env_gives_each_call_its_own_directory(tmp_path: Path) -> None:
    first, second = harness.daemon_env(), harness.daemon_env()
    assert first["XDG_STATE_HOME"] != second["XDG_STATE_HOME"]
    assert os.path.isdir(first["XDG_STATE_HOME"]) and os.path.isdir(second["XDG_STATE_HOME"])
    named = harness.daemon_env(tmp_path / "logs" / "state" / "agentd")
    assert named["XDG_STATE_HOME"] == str(tmp_path / "logs" / "state" / "agentd")
    assert (tmp_path / "logs" / "state" / "agentd").is_dir()
    assert named["PATH"] == os.environ["PATH"]  # the rest of the environment is kept
