"""Ctrl-C in ``python -m bench.soak`` (found by the session-27 walk).

The soak wrote agentd's config and log into ``--out`` when it started, so an interrupted run left
them there (and created ``--out``), beside or instead of the last finished run's report.  They are
now written in a temporary directory and moved into ``--out`` only when the run finishes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def children(pid: int) -> list[int]:
    """Every child of ``pid``, whichever of its threads started it (trio starts processes from a
    worker thread).  A thread can end between the listing and the read (Trio's idle worker threads
    do after 10 s), its children going to another thread: then the pass is read again."""
    while True:
        found: list[int] = []
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                found += [int(x) for x in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            if not Path(f"/proc/{pid}").exists():
                return []  # the process itself ended
            continue
        return found


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc to see the soak's processes")
def test_ctrl_c_during_soak_exits_130_and_leaves_out_and_tmp_untouched(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.soak", "--minutes", "5", "--concurrency", "2", "--out", str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp)},
        start_new_session=True,  # its own process group, as a terminal's foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stderr is not None
        # the first sample is printed once agentd and the fake worker run and the load started
        first = proc.stderr.readline()
        assert first.startswith("soak t="), first
        spawned = children(proc.pid)
        assert len(spawned) == 2  # the fake worker and agentd
        assert any(p.name.startswith("agentd-soak-") for p in tmp.iterdir())  # the working files
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group gets SIGINT
        _, err = proc.communicate(timeout=180)
    finally:
        with contextlib.suppress(ProcessLookupError):  # nothing of a failed run left behind
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 130, err
    assert err.strip() == "python -m bench.soak: interrupted"
    assert not out.exists()
    assert list(tmp.iterdir()) == []
    for pid in spawned:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_ctrl_c_while_agentd_imports_its_command_exits_130_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Importing a command's module (the simulator, the bench kit) takes seconds on a loaded
    machine; a Ctrl-C then printed a KeyboardInterrupt traceback from inside the imports."""
    from daemon import cli

    def interrupted(name: str) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.importlib, "import_module", interrupted)
    assert cli.main(["simulate", "--help"]) == 130
    assert capsys.readouterr() == ("", "")


def test_ctrl_c_during_agentd_bench_leaves_no_logs_or_state_behind(tmp_path: Path) -> None:
    """``agentd bench`` wrote its processes' logs and state directories (Batch API locks) into
    ``OUT/logs/<system>`` as it ran: an interrupted run left them there (and a finished one left
    the state directories).  Now both live in a temporary directory until the system's run ends."""
    from bench.trace.format import save_trace
    from bench.trace.synth import synthesize

    trace = tmp_path / "t.jsonl"
    save_trace(synthesize("swe-short", 2, seed=1), trace)
    out = tmp_path / "out"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    argv = ["bench", "--trace", str(trace), "--out", str(out), "--systems", "native", "--kv-blocks", "512"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "daemon", *argv, "--port-base", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "TMPDIR": str(tmp)},
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        bufsize=0,
    )
    try:
        assert proc.stderr is not None
        seen = b""
        while b"native [" not in seen:  # the replay's progress line: workers and agentd run
            char = proc.stderr.read(1)
            assert char, seen
            seen += char
        assert any(p.name.startswith("agentd-bench-native-") for p in tmp.iterdir())
        os.killpg(proc.pid, signal.SIGINT)
        out_text, err = proc.communicate(timeout=180)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 130, err
    assert b"Traceback" not in seen + err
    assert not out.exists()
    assert list(tmp.iterdir()) == []
