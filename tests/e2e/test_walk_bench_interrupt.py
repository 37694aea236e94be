"""Ctrl-C in the ``python -m bench.<module>`` tools (found by the session-26 walk).

``eta_bench``, ``sim_bench`` and ``soak`` printed a KeyboardInterrupt traceback inside a Trio
exception group and exited 1; ``tool_bench`` did not stop at all: its process pool waited for every
queued simulation (and, with the terminal's Ctrl-C, each worker printed its own traceback).  They
now exit 130 with one line, and tool_bench stops its simulations and writes no report.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from bench.interrupt import run_main

ROOT = Path(__file__).resolve().parents[2]


def test_a_keyboard_interrupt_inside_a_trio_group_exits_130(capsys: pytest.CaptureFixture[str]) -> None:
    async def interrupted_task() -> None:
        async def raise_it() -> None:
            raise KeyboardInterrupt

        async with trio.open_nursery() as nursery:
            nursery.start_soon(raise_it)
            nursery.start_soon(trio.sleep_forever)

    assert run_main(lambda: trio.run(interrupted_task) or 0, "python -m bench.x") == 130
    assert capsys.readouterr().err == "\npython -m bench.x: interrupted\n"


def test_other_failures_still_raise() -> None:
    def fails() -> int:
        raise BaseExceptionGroup("two", [KeyboardInterrupt(), ValueError("a bug")])

    with pytest.raises(BaseExceptionGroup):
        run_main(fails, "python -m bench.x")


def children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(x) for x in text.split()]


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc to see the pool's workers")
def test_ctrl_c_stops_tool_bench_and_its_simulations(tmp_path: Path) -> None:
    out = tmp_path / "tb"
    argv = ["-m", "bench.tool_bench", "--out", str(out), "--points", "thrash", "--systems", "native,agentd"]
    proc = subprocess.Popen(
        [sys.executable, *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout is not None
        # printed once every simulation is submitted: the pool's workers run them
        assert proc.stdout.readline().startswith("running 2 simulations on ")
        workers = children(proc.pid)
        assert workers
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert err.strip() == "python -m bench.tool_bench: interrupted"
    for worker in workers:  # no simulation left running
        assert not Path(f"/proc/{worker}").exists() or "zombie" in Path(f"/proc/{worker}/status").read_text()
    assert not (out / "report.md").exists()
    assert not os.path.exists(out / "summary.json")
