"""The kit's shared helpers: atomic writes, options from flags, the report's trace section, layering."""

from __future__ import annotations

import argparse
import ast
import os
import signal
from pathlib import Path

import pytest
import trio
import trio.testing

from bench.bench import ClusterSpec
from bench.commands.common import from_args, replay_options
from bench.interrupt import run_interruptible
from bench.output import write_atomic, write_report
from bench.replay import ReplayOptions
from bench.report import trace_summary
from bench.trace.format import dumps_trace, load_trace, save_trace
from bench.trace.synth import Knobs, synthesize

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_write_atomic_replaces_the_file_and_leaves_nothing_behind(tmp_path) -> None:
    path = tmp_path / "r.json"
    write_atomic(path, "old\n")
    write_atomic(str(path), "new\n")
    assert path.read_text() == "new\n"
    assert os.listdir(tmp_path) == ["r.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_write_atomic_keeps_the_old_file_when_writing_fails(tmp_path) -> None:
    path = tmp_path / "r.json"
    write_atomic(path, "old\n")
    with pytest.raises(UnicodeEncodeError):
        write_atomic(path, "half \ud800 written")
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["r.json"]


def test_write_report_to_a_file_or_stdout(tmp_path, capsys) -> None:
    write_report({"b": 1, "a": [2]}, str(tmp_path / "r.json"))
    write_report({"b": 1, "a": [2]}, None)
    text = '{\n  "a": [\n    2\n  ],\n  "b": 1\n}\n'
    assert (tmp_path / "r.json").read_text() == text
    assert capsys.readouterr().out == text


def test_save_trace_writes_the_jsonl_text(tmp_path) -> None:
    trace = synthesize("bfcl", 3, seed=1)
    save_trace(trace, tmp_path / "t.jsonl")
    assert (tmp_path / "t.jsonl").read_text() == dumps_trace(trace)
    assert load_trace(str(tmp_path / "t.jsonl")) == trace


def test_from_args_takes_same_named_and_renamed_flags_and_keeps_other_defaults() -> None:
    args = argparse.Namespace(workers=3, kv_blocks=99, num_gpu_blocks=1, time_scale=2.0, unrelated="x")
    assert from_args(ClusterSpec, args, num_gpu_blocks="kv_blocks") == ClusterSpec(
        workers=3, num_gpu_blocks=99, time_scale=2.0
    )
    args = argparse.Namespace(input_scale=0.5, arrival_rate=3.0, max_turns=None)
    assert from_args(Knobs, args, arrival_rate_per_second="arrival_rate") == Knobs(
        input_scale=0.5, arrival_rate_per_second=3.0
    )
    flags = argparse.Namespace(time_scale=4.0, concurrency=8, model="m", agentic_context="string", request_timeout=9.0)
    assert replay_options(flags) == ReplayOptions(
        time_scale=4.0, concurrency=8, model="m", agentic_context="string", request_timeout_seconds=9.0
    )


def test_trace_summary_reports_the_concurrency_the_replay_ran_at() -> None:
    trace = synthesize("swe-short", 2, seed=1)
    assert trace_summary(trace, "t.jsonl") == {
        "path": "t.jsonl",
        "profile": "swe-short",
        "seed": 1,
        "programs": 2,
        "requests": len(trace.records),
        "arrival": "closed_loop",
        "concurrency": 16,
    }
    assert trace_summary(trace, "t.jsonl", 32)["concurrency"] == 32


def test_the_kit_library_does_not_import_its_commands() -> None:
    """bench/commands/* are the CLI edge of the kit: the library modules never import them."""
    offenders = []
    for path in sorted(BENCH.rglob("*.py")):
        if "commands" in path.relative_to(BENCH).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[:2] == ["bench", "commands"]]
    assert offenders == []


def test_run_interruptible_cancels_on_ctrl_c_even_before_the_first_checkpoint() -> None:
    """The SIGINT handler is in place before ``fn`` runs its first line: the interruption cancels
    ``fn`` (its ``finally`` runs) and surfaces as one KeyboardInterrupt, never Trio's default
    raising it wherever the task was (once inside Trio's own nursery exit: an internal error)."""
    cleaned: list[str] = []

    async def fn() -> str:
        os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, before fn reaches a checkpoint
        try:
            await trio.sleep_forever()
        finally:
            cleaned.append("finally")
        return "unreachable"

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        run_interruptible(fn)
    assert cleaned == ["finally"]
    assert signal.getsignal(signal.SIGINT) is before


def test_run_interruptible_still_interrupts_when_fn_returns_a_partial_result() -> None:
    async def fn() -> str:
        os.kill(os.getpid(), signal.SIGINT)
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            return "partial"  # a run that wraps up what it has when cancelled
        return "unreachable"

    with pytest.raises(KeyboardInterrupt):
        run_interruptible(fn)


def test_run_interruptible_returns_the_result_and_restores_the_handler() -> None:
    async def fn() -> int:
        await trio.lowlevel.checkpoint()
        return 7

    before = signal.getsignal(signal.SIGINT)
    assert run_interruptible(fn) == 7
    assert signal.getsignal(signal.SIGINT) is before


def test_run_interruptible_lets_fn_errors_through() -> None:
    async def fn() -> int:
        raise ValueError("bad trace")  # before the watcher task first runs

    with pytest.raises(ValueError, match="bad trace"):
        run_interruptible(fn)


def test_run_interruptible_leaves_an_ignored_ctrl_c_ignored() -> None:
    """``bench.tool_bench``'s pool workers ignore SIGINT (their parent stops them) and run
    ``bench.simulate.run_simulation``: a receiver there would turn the terminal's Ctrl-C, sent to the
    whole group, back into an interruption of every worker."""

    async def fn() -> str:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(3):
            await trio.lowlevel.checkpoint()
        return "finished"

    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert run_interruptible(fn, clock=trio.testing.MockClock(autojump_threshold=0)) == "finished"
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_ctrl_c_during_a_simulation_cancels_it_and_raises_one_keyboard_interrupt() -> None:
    """``agentd simulate`` (and check-fairness, eta_bench) ran Trio's default: the KeyboardInterrupt
    was raised wherever the simulation was and came out wrapped in the daemon's exception groups
    (or, landing inside Trio's own code, as an internal error: exit 1).  Now the run is cancelled -
    the daemon and the replay end - and the interruption is one KeyboardInterrupt."""
    from bench.calibrate import config_for
    from bench.simulate import run_simulation

    cluster = ClusterSpec(workers=1, dp_size=2, num_gpu_blocks=160, block_size=16, time_scale=1.0, seed=3)
    trace = synthesize("swe-short", 4, seed=9, knobs=Knobs(input_scale=0.1, output_scale=0.1))
    calls: list[dict] = []

    def progress(counts: dict) -> None:
        calls.append(counts)
        if len(calls) == 2:  # the user's Ctrl-C while requests are in flight
            os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt) as caught:
        run_simulation(config_for(cluster, "agentd"), trace, ReplayOptions(concurrency=4), progress=progress)
    assert type(caught.value) is KeyboardInterrupt  # not an exception group around it
    assert 2 <= len(calls) < 2 + len(trace.records)  # stopped early, not at the end of the trace
    assert signal.getsignal(signal.SIGINT) is before
