"""Session 40's CLI walk: bad input to the kit's commands is an exit 2 naming the flag, the rule and
the value, before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_walk30_cli import QUICKSTART

from bench.commands.calibrate import MAX_PREFILL_POINTS, MAX_TIME_SCALE
from bench.commands.common import MIN_REQUEST_TIMEOUT_SECONDS
from bench.commands.trace import MAX_TOKEN_SCALE
from daemon import cli
from daemon.config import MAX_DATA_PLANE_PROCESSES, MAX_TARGETS
from sim.config import MAX_SIM_KV_BLOCKS, MAX_SIM_RANKS


@pytest.mark.parametrize("flag", ["--input-scale", "--output-scale"])
@pytest.mark.parametrize("value", ["1e300", "100.5", "0", "-1", "nan", "inf"])
def test_trace_synth_token_scales_are_bounded(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str, value: str
) -> None:
    """``--input-scale 1e300`` grew the process by gigabytes (a hash id per 512-token block of every
    prompt) until memory ran out; it is now ``0 < X <= 100`` (docs/traces.md, "Profiles")."""
    out = tmp_path / "t.jsonl"
    argv = ["trace", "synth", "--profile", "swe-short", "--programs", "1", "--out", str(out), flag, value]
    with pytest.raises(SystemExit) as stopped:
        cli.main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be a number > 0 and <= {MAX_TOKEN_SCALE:g}, got '{value}'" in err, err
    assert not out.exists()


def test_trace_synth_largest_token_scale_still_works(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    argv = ["trace", "synth", "--profile", "swe-short", "--programs", "1", "--max-turns", "2", "--out", str(out)]
    assert cli.main([*argv, "--input-scale", f"{MAX_TOKEN_SCALE:g}", "--output-scale", "0.001"]) == 0
    assert out.read_text().count("\n") >= 3


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--num-gpu-blocks", "100000000000"],
            f"--num-gpu-blocks: --dp-size x --num-gpu-blocks must be at most {MAX_SIM_KV_BLOCKS} KV blocks in one "
            "process (got 1 x 100000000000)",
        ),
        (["--dp-size", "100000000"], f"--dp-size: must be at most {MAX_SIM_RANKS} simulated ranks in one process"),
    ],
)
def test_sim_backend_refuses_a_cluster_one_process_cannot_hold(
    capsys: pytest.CaptureFixture[str], flags: list[str], expected: str
) -> None:
    """``--num-gpu-blocks 1e11`` was a MemoryError traceback (exit 1) and ``--dp-size 1e8`` a process
    that grew until it was killed; both are now an exit 2 naming the flags before anything starts."""
    assert cli.main(["sim-backend", "--port", "0", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"agentd sim-backend: {expected}"), err
    assert err.count("\n") == 1, err


@pytest.mark.parametrize("command", ["check-config", "start"])
@pytest.mark.parametrize(
    ("embedded", "expected"),
    [
        (
            "num_gpu_blocks = 100000000000",
            f"embedded.num_gpu_blocks: num_workers x dp_size x num_gpu_blocks must be at most {MAX_SIM_KV_BLOCKS} "
            "KV blocks in one process (got 1 x 2 x 100000000000)",
        ),
        (
            "num_workers = 3000",
            f"embedded.dp_size: num_workers x dp_size must be at most {MAX_SIM_RANKS} simulated ranks in one "
            "process (got 3000 x 2)",
        ),
    ],
)
def test_embedded_cluster_one_process_cannot_hold_is_a_config_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, embedded: str, expected: str
) -> None:
    """``[embedded] num_gpu_blocks = 1e11`` passed check-config and was a MemoryError traceback at
    ``agentd start`` (and simulate, batch --config); now a configuration error (docs/config.md)."""
    config = tmp_path / "big.toml"
    config.write_text(f"[embedded]\n{embedded}\n")
    assert cli.main([command, "--config", str(config), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert f"  {expected}\n" in err, err


def test_the_largest_embedded_cluster_is_valid(tmp_path: Path) -> None:
    config = tmp_path / "big.toml"
    blocks = MAX_SIM_KV_BLOCKS // (2 * 4)
    config.write_text(f"[embedded]\nnum_workers = 2\ndp_size = 4\nnum_gpu_blocks = {blocks}\n")
    assert cli.main(["check-config", str(config)]) == 0


def test_sim_backend_on_an_address_not_of_this_machine_names_the_host(capsys: pytest.CaptureFixture[str]) -> None:
    """``--host 192.0.2.1`` (TEST-NET, no local address) said ``--port: cannot listen on ...``: the
    host is what is wrong, as ``agentd start`` says ``server.host`` (daemon/http/serve.py)."""
    assert cli.main(["sim-backend", "--host", "192.0.2.1", "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentd sim-backend: --host: cannot listen on 192.0.2.1:0: "), err
    assert err.count("\n") == 1, err


@pytest.mark.parametrize("value", ["1000000000", "257", "2", "x"])
def test_calibrate_prefill_points_are_bounded(capsys: pytest.CaptureFixture[str], value: str) -> None:
    """``--prefill-points 1000000000`` computed a billion prompt lengths before the first probe:
    minutes and gigabytes with no progress line, past ``--max-seconds``."""
    with pytest.raises(SystemExit) as stopped:
        cli.main(["calibrate", "--target", "http://127.0.0.1:1", "--prefill-points", value])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --prefill-points: must be an integer within [3, {MAX_PREFILL_POINTS}], got '{value}'" in err


@pytest.mark.parametrize(
    ("flags", "flag", "url"),
    [
        (["--target", "http://[::1"], "--target", "http://[::1"),
        (["--target", "http://127.0.0.1:1", "--worker-metrics", "notaurl"], "--worker-metrics", "notaurl"),
        (["--target", "http://127.0.0.1:1", "--worker-metrics", "http://[::1"], "--worker-metrics", "http://[::1"),
        (["--target", "http://127.0.0.1:1", "--router-metrics", "ftp://x"], "--router-metrics", "ftp://x"),
    ],
)
def test_replay_urls_are_checked_before_the_run(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str], flag: str, url: str
) -> None:
    """``--target 'http://[::1'`` was an httpx ``InvalidURL`` traceback (exit 1); a bad
    ``--worker-metrics`` / ``--router-metrics`` URL replayed the whole trace, then warned twice
    without naming the flag (exit 0)."""
    trace, out = tmp_path / "t.jsonl", tmp_path / "r.json"
    assert cli.main(["trace", "synth", "--profile", "swe-short", "--programs", "1", "--out", str(trace)]) == 0
    capsys.readouterr()
    assert cli.main(["replay", "--trace", str(trace), "--out", str(out), "--no-progress", *flags]) == 2
    err = capsys.readouterr().err
    assert err == f"agentd replay: {flag}: must be an http:// or https:// URL with a host, got {url!r}\n"
    assert not out.exists()


def test_calibrate_target_httpx_cannot_parse_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """It was an httpx ``InvalidURL`` traceback from the first probe (exit 1)."""
    assert cli.main(["calibrate", "--target", "http://[::1"]) == 2
    err = capsys.readouterr().err
    assert err == "agentd calibrate: --target: must be an http:// or https:// URL with a host, got 'http://[::1'\n"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (
            ["--kv-blocks", "100000000000"],
            f"--kv-blocks: --dp-size x --kv-blocks must be at most {MAX_SIM_KV_BLOCKS} KV blocks in one process "
            "(got 2 x 100000000000)",
        ),
        (["--dp-size", "100000"], f"--dp-size: must be at most {MAX_SIM_RANKS} simulated ranks in one process"),
        (
            ["--systems", "native,floor", "--floor-kv-blocks", "100000000000"],
            f"--floor-kv-blocks: --dp-size x --floor-kv-blocks must be at most {MAX_SIM_KV_BLOCKS} KV blocks",
        ),
    ],
)
def test_bench_refuses_workers_a_process_cannot_hold_before_any_system_runs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str], expected: str
) -> None:
    """Each simulated worker was a MemoryError traceback (then an exit 2 of its own) after the bench
    had started: exit 1 with the worker's log; now exit 2 naming the flags before anything starts."""
    trace, out = tmp_path / "t.jsonl", tmp_path / "bench"
    assert cli.main(["trace", "synth", "--profile", "swe-short", "--programs", "1", "--out", str(trace)]) == 0
    capsys.readouterr()
    argv = ["bench", "--trace", str(trace), "--out", str(out), "--systems", "native", "--port-base", "0", *flags]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"agentd bench: {expected}"), err
    assert err.count("\n") == 1, err
    assert not out.exists()


@pytest.mark.parametrize("value", ["1e300", "1000001", "0", "nan", "inf"])
def test_calibrate_time_scale_is_bounded(capsys: pytest.CaptureFixture[str], value: str) -> None:
    """``--time-scale 1e300`` ran every probe, then the fit squared the scaled seconds: an
    ``OverflowError`` traceback (exit 1)."""
    with pytest.raises(SystemExit) as stopped:
        cli.main(["calibrate", "--target", "http://127.0.0.1:1", "--time-scale", value])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --time-scale: must be a number > 0 and <= {MAX_TIME_SCALE:g}, got '{value}'" in err, err


@pytest.mark.parametrize("command", ["simulate", "replay", "bench"])
@pytest.mark.parametrize("value", ["1e-100", "0.0009", "0", "nan"])
def test_request_timeout_is_at_least_a_millisecond(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, value: str
) -> None:
    """``agentd simulate --request-timeout 1e-100`` never ended (its virtual clock waited in epoll
    for a deadline it could not reach); the replay flags share the rule."""
    trace = tmp_path / "t.jsonl"
    assert cli.main(["trace", "synth", "--profile", "swe-short", "--programs", "1", "--out", str(trace)]) == 0
    where = {
        "simulate": ["--config", str(QUICKSTART)],
        "replay": ["--target", "http://127.0.0.1:1"],
        "bench": ["--out", str(tmp_path / "bench")],
    }[command]
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        cli.main([command, "--trace", str(trace), *where, "--request-timeout", value])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    rule = f"must be a finite number >= {MIN_REQUEST_TIMEOUT_SECONDS:g}"
    assert f"argument --request-timeout: {rule}, got '{value}'" in err, err


@pytest.mark.parametrize("command", ["check-config", "start"])
def test_more_targets_than_agentd_schedules_is_a_config_error(capsys: pytest.CaptureFixture[str], command: str) -> None:
    """``--intra-node-data-parallel-size 100000000`` passed check-config, and agentd start grew by
    gigabytes building the targets, never listening (docs/config.md, ``[routing]``)."""
    flags = ["--worker-urls", "http://127.0.0.1:1", "--intra-node-data-parallel-size", "100000000", "--port", "0"]
    assert cli.main([command, *flags]) == 2
    err = capsys.readouterr().err
    expected = (
        "  routing.intra_node_data_parallel_size (--intra-node-data-parallel-size): worker_urls x "
        f"intra_node_data_parallel_size must be at most {MAX_TARGETS} targets (got 1 x 100000000)\n"
    )
    assert expected in err, err


def test_the_most_targets_are_valid() -> None:
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert cli.main(["check-config", "--worker-urls", *urls, "--intra-node-data-parallel-size", "2048"]) == 0


@pytest.mark.parametrize("command", ["check-config", "start"])
def test_more_relay_processes_than_agentd_runs_is_a_config_error(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """``--data-plane-processes 1000000`` passed check-config: agentd start would have forked a
    million relay processes (docs/config.md, ``[server]``)."""
    flags = ["--worker-urls", "http://127.0.0.1:1", "--data-plane-processes", "1000000", "--port", "0"]
    assert cli.main([command, *flags]) == 2
    err = capsys.readouterr().err
    expected = (
        "  server.data_plane_processes (--data-plane-processes): must be an integer within "
        f"[0, {MAX_DATA_PLANE_PROCESSES}] (got 1000000)\n"
    )
    assert expected in err, err


def test_the_most_relay_processes_are_valid() -> None:
    flags = ["--worker-urls", "http://127.0.0.1:1", "--data-plane-processes", str(MAX_DATA_PLANE_PROCESSES)]
    assert cli.main(["check-config", *flags]) == 0


def test_trace_synth_shows_progress_on_request_and_writes_the_same_trace(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A large synthesis ran silently (a coding-long trace of 3,000 programs takes about 20 s): with
    ``--progress`` (the default on a terminal) a line on stderr tells each phase's progress; the
    trace written is the same either way."""
    argv = ["trace", "synth", "--profile", "coding-long", "--programs", "4", "--max-turns", "3"]
    assert cli.main([*argv, "--out", str(tmp_path / "quiet.jsonl")]) == 0
    quiet = capsys.readouterr().err  # stderr is no terminal here: no progress line by default
    assert "\r" not in quiet and quiet.startswith("wrote ")
    assert cli.main([*argv, "--out", str(tmp_path / "shown.jsonl"), "--progress"]) == 0
    err = capsys.readouterr().err
    lines = err.split("\r")
    assert lines[0] == ""
    assert lines[1].startswith("agentd trace synth: coding-long: generating programs 0/4  ")
    assert any(x.startswith("agentd trace synth: coding-long: hashing prompts of session ") for x in lines)
    records = (tmp_path / "shown.jsonl").read_text().count("\n") - 1  # the meta line
    last, wrote = lines[-1].split("\n", 1)
    assert last.startswith(f"agentd trace synth: coding-long: encoding request {records}/{records}  ")
    assert wrote.startswith(f"wrote {records} requests of ")
    assert (tmp_path / "shown.jsonl").read_bytes() == (tmp_path / "quiet.jsonl").read_bytes()
    assert cli.main([*argv, "--out", str(tmp_path / "none.jsonl"), "--no-progress"]) == 0
    assert "\r" not in capsys.readouterr().err
