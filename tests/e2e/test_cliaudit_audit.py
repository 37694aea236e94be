"""The CLI audit of session 43: bad input a demanding user gives the commands is an exit 2 naming the
field or flag before any work, and nothing half-made is left behind."""

from __future__ import annotations

import io
import re
import socket
from pathlib import Path

import pytest
from test_walk30_cli import QUICKSTART

from bench.commands.trace import MIN_ARRIVAL_RATE
from bench.progress import ProgressLine
from bench.trace.format import MAX_TRACE_TOKENS
from daemon import cli
from sim.config import MIN_TIME_SCALE


@pytest.mark.parametrize("host", ["", "  "])
def test_prometheus_host_must_not_be_blank_on_the_command_line(capsys: pytest.CaptureFixture[str], host: str) -> None:
    """``--prometheus-host '' --prometheus-port N`` passed and the metrics listener bound 0.0.0.0,
    every interface, where ``--host ''`` and ``--admin-host ''`` are refused (docs/config.md
    [prometheus])."""
    assert cli.main(["check-config", "--prometheus-host", host, "--prometheus-port", "18150"]) == 2
    err = capsys.readouterr().err
    assert f"prometheus.host (--prometheus-host): must be null or a non-empty string (got {host!r})" in err, err


def test_prometheus_host_must_not_be_blank_in_the_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "metrics.toml"
    path.write_text('[prometheus]\nhost = ""\nport = 18150\n')
    assert cli.main(["check-config", str(path)]) == 2
    assert "prometheus.host: must be null or a non-empty string (got '')" in capsys.readouterr().err


def _write_records(path: Path, *records: str) -> Path:
    path.write_text("".join(f"{r}\n" for r in records))
    return path


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (
            '{"session_id": "a", "turn": 0, "input_delta": 99999999999, "output_length": 5}',
            f"line 1: field 'input_delta' must be at most {MAX_TRACE_TOKENS} tokens, got 99999999999",
        ),
        (
            '{"session_id": "a", "turn": 0, "input_delta": 10, "output_length": 100000000000000000000}',
            f"line 1: field 'output_length' must be at most {MAX_TRACE_TOKENS} tokens, got 100000000000000000000",
        ),
        (
            '{"session_id": "a", "turn": 0, "input_delta": 10, "output_length": 5, '
            '"shared_prefix_id": "s", "shared_prefix_tokens": 200000000}',
            f"line 1: field 'shared_prefix_tokens' must be at most {MAX_TRACE_TOKENS} tokens, got 200000000",
        ),
        (
            '{"timestamp": 0, "input_length": 300000000, "output_length": 5}',
            f"line 1: field 'input_length' must be at most {MAX_TRACE_TOKENS} tokens, got 300000000",
        ),
    ],
)
@pytest.mark.parametrize("command", ["simulate", "replay", "stats"])
def test_a_trace_token_count_beyond_any_context_is_refused_naming_line_and_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, record: str, expected: str, command: str
) -> None:
    """A record with ``input_delta`` 1e11 (a few zeros too many) passed the loader: ``agentd simulate``
    and ``replay`` then built the prompt's text, grew by gigabytes and ignored Ctrl-C until memory
    ran out; it is now an exit 2 naming the line and the field before anything runs (docs/traces.md,
    "Format")."""
    trace = str(_write_records(tmp_path / "t.jsonl", record))
    out = tmp_path / "report.json"
    argv = {
        "simulate": ["simulate", "--config", str(QUICKSTART), "--trace", trace, "--out", str(out)],
        # nothing listens there: the trace is refused before the first request
        "replay": ["replay", "--trace", trace, "--target", "http://127.0.0.1:18199", "--out", str(out)],
        "stats": ["trace", "stats", trace],
    }[command]
    assert cli.main(argv) == 2
    assert expected in capsys.readouterr().err
    assert not out.exists()


def test_a_session_whose_history_outgrows_the_bound_is_refused_at_the_turn(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Each turn's count within the bound, their sum (the prompt of turn 2) beyond it."""
    records = [f'{{"session_id": "a", "turn": {t}, "input_delta": 40000000, "output_length": 5}}' for t in range(3)]
    trace = str(_write_records(tmp_path / "t.jsonl", *records))
    assert cli.main(["trace", "stats", trace]) == 2
    err = capsys.readouterr().err
    assert (
        f"line 3: field 'input_length' (the prompt: shared prefix + history + input_delta) must be at most "
        f"{MAX_TRACE_TOKENS} tokens, got 120000010 (session 'a', turn 2)" in err
    ), err


def test_the_largest_synthesized_prompts_stay_within_the_bound(tmp_path: Path) -> None:
    """``coding-long`` at the largest ``--input-scale`` (prompts of about 13 million tokens) still loads."""
    out = tmp_path / "t.jsonl"
    argv = ["trace", "synth", "--profile", "coding-long", "--programs", "4", "--seed", "3", "--out", str(out)]
    assert cli.main([*argv, "--input-scale", "100", "--no-progress"]) == 0
    assert cli.main(["trace", "stats", str(out)]) == 0


def test_bench_with_a_port_in_use_leaves_no_output_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A ``--port-base`` whose ports are taken was found only once the first system started: exit 2,
    but ``OUT/`` and an empty ``OUT/logs/native/`` were left behind; now it is refused before any
    work (and before the KV calibration's simulations)."""
    trace = tmp_path / "t.jsonl"
    argv = ["trace", "synth", "--profile", "swe-short", "--programs", "1", "--max-turns", "2", "--out", str(trace)]
    assert cli.main(argv) == 0
    out = tmp_path / "bench-out"
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        base = taken - 1  # the router's port is free, its metrics port is taken
        argv = ["bench", "--trace", str(trace), "--out", str(out), "--systems", "native", "--port-base", str(base)]
        assert cli.main([*argv, "--no-progress"]) == 2
    err = capsys.readouterr().err
    # (the port named is the first one taken: ours, unless another process holds the router's)
    assert re.search(rf"agentd bench: --port-base: port \d+ \(of {base}\.\.{base + 3}\) is in use", err), err
    assert not out.exists()


def test_a_blank_batch_database_path_is_refused_not_a_file_named_by_spaces(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``database_path = "  "`` (a template's empty variable) passed check-config, and ``agentd start``
    kept its Batch API in a database named ``"  "`` in the working directory; ``""`` is the default
    (docs/config.md [batch_api])."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "db.toml"
    path.write_text('[batch_api]\ndatabase_path = "  "\n')
    assert cli.main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert """batch_api.database_path: must be "" (the default) or a non-blank path (got '  ')""" in err, err
    path.write_text('[batch_api]\ndatabase_path = ""\n')
    assert cli.main(["check-config", str(path)]) == 0


@pytest.mark.parametrize("profile", ["coding-long", "batch"])
def test_trace_synth_refuses_an_arrival_rate_whose_times_overflow(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, profile: str
) -> None:
    """``--arrival-rate 1e-320`` exited 0 with a trace whose timestamps were ``Infinity``: ``trace
    stats``, ``replay``, ``simulate`` and ``bench`` then refused the file it had just written."""
    out = tmp_path / "t.jsonl"
    argv = ["trace", "synth", "--profile", profile, "--programs", "2", "--out", str(out), "--no-progress"]
    with pytest.raises(SystemExit) as stopped:
        cli.main([*argv, "--arrival-rate", "1e-320"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --arrival-rate: must be a finite number >= {MIN_ARRIVAL_RATE:g}, got '1e-320'" in err, err
    assert not out.exists()
    assert cli.main([*argv, "--arrival-rate", f"{MIN_ARRIVAL_RATE:g}"]) == 0  # the slowest rate is a trace that loads
    assert cli.main(["trace", "stats", str(out)]) == 0


def _run_argv(command: str, tmp_path: Path) -> list[str]:
    """The command line of ``command`` on a one-Program trace (written to ``tmp_path``), before the
    flag under test."""
    if command == "sim-backend":
        return ["sim-backend", "--port", "0"]
    trace = tmp_path / "t.jsonl"
    assert cli.main(["trace", "synth", "--profile", "swe-short", "--programs", "1", "--out", str(trace)]) == 0
    out = tmp_path / "out"
    return {
        "simulate": ["simulate", "--config", str(QUICKSTART), "--trace", str(trace), "--out", str(out)],
        "replay": ["replay", "--trace", str(trace), "--target", "http://127.0.0.1:18199", "--out", str(out)],
        "bench": ["bench", "--trace", str(trace), "--out", str(out), "--port-base", "0"],
    }[command]


@pytest.mark.parametrize("command", ["simulate", "replay", "bench", "sim-backend"])
def test_a_time_scale_below_a_thousandth_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    """``agentd simulate --time-scale 1e-6`` of a three-Program trace ran for hours (1e-12: never
    ended): a virtual-time run costs wall time per simulated second.  Every ``--time-scale`` is at
    least ``MIN_TIME_SCALE`` (docs/traces.md, "Time scale")."""
    argv = _run_argv(command, tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        cli.main([*argv, "--time-scale", "1e-6"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --time-scale: must be a finite number >= {MIN_TIME_SCALE:g}, got '1e-6'" in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("command", ["check-config", "simulate", "check-fairness"])
def test_an_embedded_time_scale_below_a_thousandth_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str
) -> None:
    """``agentd simulate`` and ``check-fairness`` run at ``[embedded] time_scale`` unless told
    otherwise: the same bound holds for the field (docs/config.md [embedded])."""
    config = tmp_path / "slow.toml"
    config.write_text("[embedded]\ntime_scale = 1e-6\n")
    trace = tmp_path / "t.jsonl"
    assert cli.main(["trace", "synth", "--profile", "swe-short", "--programs", "1", "--out", str(trace)]) == 0
    out = tmp_path / "out"
    argv = {
        "check-config": ["check-config", str(config)],
        "simulate": ["simulate", "--config", str(config), "--trace", str(trace), "--out", str(out)],
        "check-fairness": ["check-fairness", "--config", str(config), "--out", str(out)],
    }[command]
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"embedded.time_scale: must be finite and >= {MIN_TIME_SCALE:g} (got 1e-06)" in err, err
    assert not out.exists()


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_progress_update_too_soon_after_the_last_is_drawn_later_not_dropped() -> None:
    """The bar dropped an update that came within its 0.25 s throttle of the previous draw: in a
    replay, the request that completed just before a tool gap was not shown, and neither was time
    passing, until the next event (``1/2`` done read ``0/2 ... 0.0s`` for the whole 6 s gap).  The
    ticker thread's ``refresh`` draws it once the interval has passed, then the elapsed time once a
    second (no thread here: ``ticker=False``, the clock is the test's)."""
    stream = io.StringIO()
    clock = _Clock()
    line = ProgressLine(stream, label="replay", clock=clock, ticker=False)
    line.update({"done_requests": 0, "total_requests": 2, "in_flight": 1})
    clock.now += 0.05
    line.update({"done_requests": 1, "total_requests": 2, "in_flight": 0})  # too soon: not drawn yet
    assert stream.getvalue().count("\r") == 1 and " 0/2 req " in stream.getvalue()
    line.refresh()  # the interval has not passed yet
    assert stream.getvalue().count("\r") == 1
    clock.now += 0.25
    line.refresh()
    assert (
        stream.getvalue().split("\r")[-1]
        == "replay [" + "#" * 15 + "-" * 15 + "] 1/2 req  0/0 tasks  in-flight 0  failed 0  0.3s"
    )
    clock.now += 0.5
    line.refresh()  # nothing new and less than a second: not redrawn
    assert stream.getvalue().count("\r") == 2
    clock.now += 0.5
    line.refresh()  # a quiet second: the elapsed time moves on
    assert stream.getvalue().split("\r")[-1].endswith("  1.3s")
    line.close()
    line.refresh()  # a closed line is never drawn again
    assert stream.getvalue().endswith("  1.3s\n") and stream.getvalue().count("\n") == 1


def test_the_ticker_thread_stops_when_the_line_closes() -> None:
    stream = io.StringIO()
    line = ProgressLine(stream, label="simulate")
    line.update({"done_requests": 0, "total_requests": 2})
    assert line._ticker is not None and line._ticker.is_alive()
    line.close()
    assert not line._ticker.is_alive()


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://w:abc", "is not a valid URL (Invalid port: 'abc')"),
        ("http://[::1", "is not a valid URL (Invalid port: ':1')"),
        ("http://:8000", "must name a host"),
        ("http://w:99999", "must have a port within [1, 65535]"),
        ("http://w:0", "must have a port within [1, 65535]"),
        ("http://worker 0:8000", "must not contain whitespace"),
    ],
)
def test_a_worker_url_the_client_cannot_use_is_a_configuration_error(
    capsys: pytest.CaptureFixture[str], url: str, problem: str
) -> None:
    """``--worker-urls http://w:abc`` passed check-config and ``agentd start`` died with an
    ``httpx.InvalidURL`` traceback (exit 1) at its first health check; ``http://:8000`` and
    ``http://w:99999`` started with a worker that could never be reached (docs/config.md [routing])."""
    assert cli.main(["check-config", "--worker-urls", "http://ok:8000", url]) == 2
    err = capsys.readouterr().err
    assert f"routing.worker_urls (--worker-urls): {problem} (got {url!r})" in err, err


def test_agentd_start_refuses_an_unparsable_worker_url_before_starting(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["start", "--port", "0", "--worker-urls", "http://w:abc"]) == 2
    err = capsys.readouterr().err
    assert "routing.worker_urls (--worker-urls): is not a valid URL (Invalid port: 'abc')" in err, err
    assert "Traceback" not in err


def test_usable_worker_urls_still_pass(capsys: pytest.CaptureFixture[str]) -> None:
    urls = ["http://w:8000", "https://w", "http://[::1]:8000", "http://10.0.0.5:8000/", "https://u:p@w:443"]
    assert cli.main(["check-config", "--worker-urls", *urls]) == 0


@pytest.mark.parametrize("command", ["simulate", "replay", "bench"])
@pytest.mark.parametrize("model", ["", "  "])
def test_an_empty_model_name_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, command: str, model: str
) -> None:
    """``agentd replay --model ''`` sent ``"model": ""`` in every request: each one refused (404), an
    exit 1 once the whole trace had run, where ``calibrate`` and ``sim-backend`` refuse it at once."""
    argv = _run_argv(command, tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        cli.main([*argv, "--model", model])
    assert stopped.value.code == 2
    assert "argument --model: must not be empty" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_batch_line_that_is_not_an_object_is_named_by_its_json_value(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A ``null`` line was reported as ``must be a JSON object, got NoneType`` (a Python type name),
    ``"body": "x"`` as ``got str``; every other field shows the JSON value it got."""
    source = tmp_path / "in.jsonl"
    source.write_text('null\n{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": "x"}\n')
    out = tmp_path / "out.jsonl"
    assert cli.main(["batch", "-i", str(source), "-o", str(out), "--target", "http://127.0.0.1:18199"]) == 1
    err = capsys.readouterr().err
    assert "agentd batch: line 1: must be a JSON object, got null\n" in err, err
    assert 'agentd batch: line 2: body: must be a JSON object (got "x")\n' in err, err
    assert "NoneType" not in out.read_text() and "got str" not in out.read_text()


def test_a_trace_with_a_byte_order_mark_loads(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A trace saved by an editor with a UTF-8 byte-order mark was refused with Python's hint
    ``invalid JSON (Unexpected UTF-8 BOM (decode using utf-8-sig))``, where a configuration and a
    batch file with one load (docs/traces.md, "Format")."""
    plain = tmp_path / "t.jsonl"
    assert cli.main(["trace", "synth", "--profile", "swe-short", "--programs", "1", "--out", str(plain)]) == 0
    marked = tmp_path / "bom.jsonl"
    marked.write_text("\ufeff" + plain.read_text())
    capsys.readouterr()
    assert cli.main(["trace", "stats", "--json", str(marked)]) == 0
    from_marked = capsys.readouterr().out
    assert cli.main(["trace", "stats", "--json", str(plain)]) == 0
    assert from_marked == capsys.readouterr().out
